"""Translate a split of a prepared data directory with a checkpoint and score it (what `demo` reports)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multibranch.atomic import atomic_write_text
from multibranch.data.text import one_line
from multibranch.evaluate.metrics import score_corpus
from multibranch.tasks.loading import load_model
from multibranch.tasks.translation.dataset import PreparedData
from multibranch.tasks.translation.translator import Translator


@dataclass
class SplitTranslation:
    sources: list[str]
    hypotheses: list[str]
    references: list[str]
    scores: dict[str, Any]  # score_corpus's result: {"bleu": {"score", "signature", ...}, "chrf": {...}}


def translate_split(ckpt: str | Path, data_dir: str | Path, split: str = "test", hyp_file: str | Path | None = None,
                    progress: Any = False) -> SplitTranslation:
    """Translate the raw source lines of `split` with the checkpoint's decode config, write them (one a
    line) to `hyp_file` if given, and score them with BLEU and chrF against the raw references."""
    loaded = load_model(ckpt)
    data = PreparedData.load(data_dir).split(split)
    sources, references = data.raw_src_lines(), data.raw_tgt_lines()
    translator = Translator(loaded.model, loaded.tokenizer, loaded.config.decode)
    hypotheses = translator.translate(sources, progress=progress)
    if hyp_file is not None:
        atomic_write_text(hyp_file, "".join(one_line(h) + "\n" for h in hypotheses))
    scores = score_corpus(hypotheses, [references], metrics=("bleu", "chrf"))
    return SplitTranslation(sources, hypotheses, references, scores)
