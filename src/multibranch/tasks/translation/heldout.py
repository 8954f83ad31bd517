"""Translate a split of a prepared data directory with a checkpoint and score it (what `demo` reports)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multibranch import cpu_kernels
from multibranch.atomic import atomic_write_text
from multibranch.data.text import one_line
from multibranch.evaluate.metrics import score_corpus
from multibranch.tasks.translation.dataset import PreparedData
from multibranch.tasks.translation.translator import Translator


@dataclass
class SplitTranslation:
    sources: list[str]
    hypotheses: list[str]
    references: list[str]
    scores: dict[str, Any]  # score_corpus's result: {"bleu": {"score", "signature", ...}, "chrf": {...}}


def translate_split(translator: Translator, data_dir: str | Path, split: str = "test",
                    hyp_file: str | Path | None = None, progress: Any = False) -> SplitTranslation:
    """Translate the raw source lines of `split` with `translator`, write them (one a line) to `hyp_file` if
    given, and score them with BLEU and chrF against the raw references."""
    data = PreparedData.load(data_dir).split(split)
    sources, references = data.raw_src_lines(), data.raw_tgt_lines()
    hypotheses = translator.translate(sources, progress=progress)
    if hyp_file is not None:
        atomic_write_text(hyp_file, "".join(one_line(h) + "\n" for h in hypotheses))
    scores = score_corpus(hypotheses, [references], metrics=("bleu", "chrf"))
    return SplitTranslation(sources, hypotheses, references, scores)


@contextlib.contextmanager
def without_a_kernel_build() -> Iterator[None]:
    """Decode without the CPU kernels (cpu_kernels.py) unless $MULTIBRANCH_CPU_KERNELS says otherwise or this
    process has them loaded already: their one-time build takes minutes, longer than a small test set takes to
    translate without them. The environment and the kernels' cached answer are as before afterwards."""
    if cpu_kernels.ENV_SWITCH in os.environ or cpu_kernels.kernels.cache_info().currsize:
        yield
        return
    os.environ[cpu_kernels.ENV_SWITCH] = "0"
    try:
        yield
    finally:
        del os.environ[cpu_kernels.ENV_SWITCH]
        cpu_kernels.kernels.cache_clear()  # the next caller builds or loads them
