"""Preparing code-generation data: the code-docstring corpus -> a translation data directory (docstring -> code).

Inputs are `{prefix}.desc` / `{prefix}.code` pairs read by `multibranch.tasks.code.corpus` (strict
lines, one example a line, malformed docstring literals an error unless `docstring_errors="raw"`).
Each example becomes one translation pair, one line per side:

- source (`desc`): the docstring's value (the literal decoded with `ast.literal_eval`, `DCNL` read as
  a newline) with every run of whitespace, newlines included, folded into one space. This is also
  what `multibranch translate` expects as input: a docstring on one line.
- target (`code`): the function in the corpus's one-line escaped form, unchanged (`DCNL` newline,
  `DCSP` indentation level or space inside a string, `DCTB` tab inside a string);
  `code_corpus.decode_code` turns it into source.

The corpus ships no test split, so `holdout` (a whole count, or a fraction in (0, 1)) training
examples, chosen with `random.Random(seed)`, become the `test` split (drawn before anything is
dropped, so it does not depend on the filters); SentencePiece is trained on the
remaining training pairs only. Further `test` prefixes become `test1`, `test2`, ... Training pairs
longer than `max_len` subword tokens on either side are dropped (counted); valid and test pairs never
are. Examples whose docstring is empty (the corpus has a few `''`) are dropped in every split and
counted, as translation drops pairs with an empty side. There is no length-ratio filter (a function is many times longer than its docstring).

The output is a parallel data directory (`multibranch.data.parallel_prepare`'s layout, one joint
SentencePiece model unless `joint=False`) whose data.json also holds `"task": "code"` (so `train`
chooses the code task) and a `"code"` section: the source/target forms, held-out indices, malformed
docstrings kept raw, and how many test docstrings also occur verbatim in train.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from multibranch.atomic import atomic_directory
from multibranch.config import ConfigError, to_dict
from multibranch.data.directories import DATA, check_output_directory
from multibranch.data.parallel_prepare import (
    DROP_REASONS,
    PrepareConfig,
    Split,
    build_data_dir,
    check_inputs,
    require_valid_pairs,
)
from multibranch.data.sentencepiece_training import check_spm_settings
from multibranch.data.text import ParallelText, TextLines
from multibranch.errors import DataError
from multibranch.tasks.code.corpus import DOCSTRING_ERRORS, CodeCorpusReading, read_code_corpus_details

TASK = "code"  # data.json "task" of a code-generation directory
SRC_LANG, TGT_LANG = "desc", "code"
SOURCE_FORM = "docstring value (literal decoded, DCNL = newline), whitespace runs folded to one space"
TARGET_FORM = "the corpus's one-line escaped function (DCNL newline, DCSP indent level / space in a string, DCTB tab)"


@dataclass
class CodePrepareConfig:
    """Settings of the code-generation `prepare` (lengths in SentencePiece tokens, without BOS/EOS).

    `train`, `valid` and `test` are corpus prefixes (`{prefix}.desc` + `{prefix}.code`). `holdout`:
    training examples held out as the `test` split, a whole count >= 1 or a fraction in (0, 1); 0 or
    None holds out nothing. SentencePiece settings are those of the parallel `PrepareConfig`.
    """

    train: str
    valid: str
    out: str
    holdout: float | None = 1000
    test: list[str] = field(default_factory=list)
    vocab_size: int = 8000
    joint: bool = True
    model_type: Literal["bpe", "unigram"] = "bpe"
    character_coverage: float = 1.0
    max_len: int | None = 256
    docstring_errors: Literal["strict", "raw"] = "strict"
    encoding_errors: Literal["strict", "replace"] = "strict"
    force: bool = False
    seed: int = 1
    threads: int = 1
    spm_max_sentences: int = 1_000_000

    def validate(self) -> None:
        if self.holdout is not None and self.holdout != 0:
            if not math.isfinite(self.holdout) or self.holdout < 0 or \
                    (self.holdout >= 1 and not float(self.holdout).is_integer()):
                raise ConfigError(f"holdout={self.holdout:g} must be a whole count >= 1, a fraction in (0, 1), or 0")
        check_spm_settings(self.model_type, self.vocab_size, self.character_coverage, self.max_len)
        if self.docstring_errors not in DOCSTRING_ERRORS:
            raise ConfigError(f"docstring_errors={self.docstring_errors!r} must be one of {DOCSTRING_ERRORS}")
        if self.encoding_errors not in ("strict", "replace"):
            raise ConfigError(f"encoding_errors={self.encoding_errors!r} must be 'strict' or 'replace'")
        if self.threads < 1 or self.spm_max_sentences < 1:
            raise ConfigError("threads and spm_max_sentences must be >= 1")

    def translation_config(self) -> PrepareConfig:
        """The parallel-data `PrepareConfig` of the same files (desc -> code, no ratio filter)."""
        return PrepareConfig(
            src_lang=SRC_LANG, tgt_lang=TGT_LANG, train=self.train, valid=self.valid, out=self.out,
            test=list(self.test), vocab_size=self.vocab_size, joint=self.joint, model_type=self.model_type,
            character_coverage=self.character_coverage, max_len=self.max_len, max_len_ratio=None,
            encoding_errors=self.encoding_errors, force=self.force, seed=self.seed, threads=self.threads,
            spm_max_sentences=self.spm_max_sentences,
        )


def source_line(docstring: str) -> str:
    """A decoded docstring -> the one-line model input (whitespace runs, newlines included, -> one space)."""
    return " ".join(docstring.split())


def holdout_indices(n: int, size: float, seed: int) -> list[int]:
    """The sorted indices of `size` (a count, or a fraction of n) examples out of n, drawn with Random(seed)."""
    count = round(size * n) if size < 1 else int(size)
    if not 1 <= count < n:
        raise DataError(f"holdout={size:g} asks for {count} of {n} training examples; it must hold out at least "
                        "one and leave at least one for training")
    return sorted(random.Random(seed).sample(range(n), count))


def prepare_code(cfg: CodePrepareConfig) -> dict[str, Any]:
    """Run the whole preparation; returns the `data.json` contents plus `out`."""
    cfg.validate()
    base = cfg.translation_config()
    out = Path(cfg.out).resolve()
    check_inputs(base)
    check_output_directory(out, DATA, force=base.force, inputs=base.read_paths(), error=DataError)
    read = {name: _read(cfg, prefix) for name, prefix in base.splits()}  # train, valid, test, test1, ...
    train = read["train"]
    held = holdout_indices(len(train.corpus.codes), cfg.holdout, cfg.seed) if cfg.holdout else []
    held_set = set(held)
    kept = [i for i in range(len(train.corpus.codes)) if i not in held_set]
    splits = [_split("train", f"{cfg.train} (without the {len(held)} held out)", train, kept)]
    splits.append(_split("valid", cfg.valid, read["valid"]))
    require_valid_pairs(base, splits[-1])
    tests = [(f"{cfg.train} (held out: {len(held)}, seed {cfg.seed})", train, held)] if held else []
    tests += [(prefix, read[name], None) for name, prefix in base.splits()[2:]]
    for i, (prefix, reading, indices) in enumerate(tests):
        splits.append(_split("test" if i == 0 else f"test{i}", prefix, reading, indices))
    train_sources = {splits[0].text.src.lines[i] for i in splits[0].keep}
    with atomic_directory(out) as tmp:
        meta = build_data_dir(base, splits, tmp)
        meta["task"] = TASK
        meta["config"] = to_dict(cfg)
        meta["code"] = {
            "source": SOURCE_FORM,
            "target": TARGET_FORM,
            "holdout": {"split": "test" if held else None, "count": len(held), "seed": cfg.seed,
                        "train_indices": held},
            "raw_docstrings": {f"{prefix}.desc": read[name].raw_docstrings for name, prefix in base.splits()},
            "docstring_in_train": {s.name: sum(s.text.src.lines[i] in train_sources for i in s.keep)
                                   for s in splits[1:]},
        }
        (tmp / "data.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        with (tmp / "report.md").open("a", encoding="utf-8") as report:
            report.write(_report(meta))
    return {**meta, "out": cfg.out}


def _read(cfg: CodePrepareConfig, prefix: str) -> CodeCorpusReading:
    return read_code_corpus_details(prefix, encoding_errors=cfg.encoding_errors,
                                    docstring_errors=cfg.docstring_errors)


def _split(name: str, prefix: str, reading: CodeCorpusReading, indices: list[int] | None = None) -> Split:
    """A parallel-data `Split` of the examples `indices` (all when None) of a corpus reading; examples whose
    docstring is empty (the literal `''`) are dropped and counted as "empty", as translation drops empty sides."""
    corpus = reading.corpus
    indices = list(range(len(corpus.codes))) if indices is None else indices
    desc = TextLines(Path(f"{prefix}.desc"), [source_line(corpus.docstrings[i]) for i in indices],
                     reading.replaced_lines[0])
    code = TextLines(Path(f"{prefix}.code"), [corpus.codes[i] for i in indices], reading.replaced_lines[1])
    keep = [i for i, line in enumerate(desc.lines) if line]
    dropped = dict.fromkeys(DROP_REASONS if name == "train" else ("empty",), 0)
    dropped["empty"] = len(indices) - len(keep)
    return Split(name, prefix, ParallelText(desc, code), keep, dropped)


def _report(meta: dict[str, Any]) -> str:
    code = meta["code"]
    raw = ", ".join(f"{name} {len(lines)}" for name, lines in code["raw_docstrings"].items())
    in_train = ", ".join(f"{name} {n}" for name, n in code["docstring_in_train"].items())
    held = code["holdout"]
    held_text = (f"{held['count']} training examples (seed {held['seed']}) are the `test` split; their 0-based "
                 "line indices are in data.json" if held["count"] else "none")
    return "\n".join([
        "",
        "## Code generation",
        "",
        f"- Source (`desc`): {code['source']}",
        f"- Target (`code`): {code['target']}",
        f"- Held out from train: {held_text}",
        f"- Malformed docstring literals kept as raw text: {raw}",
        f"- Docstrings that also occur verbatim in train: {in_train}",
        "",
    ])
