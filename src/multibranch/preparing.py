"""Preparing raw data for training, for every task: `PrepareOptions` (what `multibranch prepare` and the Python
API's `prepare` take), their checks, and `prepare_data`, which starts the task's own preparation.

    meta = prepare_data(PrepareOptions(train="raw/train", out="data", src="de", tgt="en", valid="raw/valid"))

Messages name the options as the command line spells them (`--src`); the API renames the ones it spells otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from multibranch.atomic import remove_stale_output_temporaries
from multibranch.data.parallel_prepare import PrepareConfig
from multibranch.errors import ConfigError, UserError
from multibranch.tasks.classification.prepare import ClassifyPrepareConfig, prepare_classification
from multibranch.tasks.classification.readers import ReadOptions
from multibranch.tasks.code.prepare import CodePrepareConfig, prepare_code
from multibranch.tasks.translation.prepare import prepare

log = logging.getLogger("multibranch.prepare")

TASKS = ("translate", "classify", "code")
# the options of one task only, and those of SentencePiece training and of large corpora
TRANSLATION_ONLY = ("src", "tgt")
CODE_ONLY = ("docstring_errors",)
CLASSIFY_ONLY = ("holdout", "format", "header", "label_column", "text_column", "label_key", "text_key", "fine_labels",
                 "empty_text", "too_long", "hf_tokenizer")
SENTENCEPIECE_ONLY = ("vocab_size", "model_type", "character_coverage")
TRANSLATION_SCALE = ("workers", "spm_sample", "shard_pairs", "spm_model", "spm_model_tgt", "pretokenized", "dict",
                     "dict_tgt")
REUSED_VOCABULARY = SENTENCEPIECE_ONLY + ("spm_sample",)  # settings of a trained model, not of a reused one
CHOICES = {"task": TASKS, "format": ("auto", "tsv", "csv", "trec", "jsonl"), "header": ("auto", "yes", "no"),
           "empty_text": ("error", "drop"), "too_long": ("truncate", "drop"), "docstring_errors": ("strict", "raw"),
           "model_type": ("bpe", "unigram"), "encoding_errors": ("strict", "replace")}


def option(name: str) -> str:
    """An option as the command line spells it: `--spm-sample`."""
    return "--" + name.replace("_", "-")


@dataclass
class PrepareOptions:
    """The options of `multibranch prepare` (docs/reference.md says what each does); `task` "translate" (src, tgt and
    valid required), "classify" or "code"."""

    train: str
    out: str
    task: str = "translate"
    src: str | None = None
    tgt: str | None = None
    valid: str | None = None
    test: list[str] = field(default_factory=list)
    # classification
    holdout: float | None = None
    format: str = "auto"
    header: str = "auto"
    label_column: str = "0"
    text_column: list[str] | None = None
    label_key: str = "label"
    text_key: list[str] | None = None
    fine_labels: bool = False
    empty_text: str = "error"
    too_long: str = "truncate"
    hf_tokenizer: str | None = None
    # code generation
    docstring_errors: str = "strict"
    # large corpora and reused preprocessing
    workers: int = 0
    spm_sample: int = 1_000_000
    shard_pairs: int = 500_000
    spm_model: str | None = None
    spm_model_tgt: str | None = None
    pretokenized: bool = False
    dict: str | None = None
    dict_tgt: str | None = None
    # SentencePiece and cleaning
    vocab_size: int = 8000
    separate_vocab: bool = False
    model_type: str = "bpe"
    character_coverage: float = 1.0
    max_len: int = 256
    max_len_ratio: float = 3.0
    encoding_errors: str = "strict"
    force: bool = False
    seed: int = 1

    def given(self, names: tuple[str, ...]) -> list[str]:
        """The options among `names` set to something else than their default, as the command line spells them."""
        fields = {f.name: f for f in dataclasses.fields(self)}

        def default(name: str) -> Any:
            f = fields[name]
            return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]

        return [option(n) for n in names if getattr(self, n) != default(n)]

    def validate(self) -> None:
        """UserError (ConfigError for a value that is not among its choices) for options that do not go together."""
        for name, choices in CHOICES.items():
            if getattr(self, name) not in choices:
                raise ConfigError(f"{option(name)}: invalid choice: {getattr(self, name)!r} (choose from "
                                  f"{', '.join(map(repr, choices))})")
        if self.task == "classify":  # one text side: no length ratio, no second vocabulary
            wrong = self.given(TRANSLATION_ONLY + CODE_ONLY + TRANSLATION_SCALE + ("max_len_ratio", "separate_vocab"))
        elif self.task == "code":
            wrong = self.given(TRANSLATION_ONLY + tuple(n for n in CLASSIFY_ONLY if n != "holdout") + ("max_len_ratio",)
                               + TRANSLATION_SCALE)
        else:
            wrong = self.given(CLASSIFY_ONLY + CODE_ONLY)
        if wrong:
            raise UserError(f"{', '.join(wrong)}: not for --task {self.task}")
        getattr(self, f"_check_{self.task}")()

    def _check_translate(self) -> None:
        missing = [option(n) for n in ("src", "tgt", "valid") if getattr(self, n) is None]
        if missing:
            raise UserError(f"the following arguments are required: {', '.join(missing)}")
        if self.spm_sample < 1:
            raise UserError(f"--spm-sample {self.spm_sample}: must be >= 1 (the number of training sentences "
                            "SentencePiece is trained on)")
        if self.shard_pairs < 1:
            raise UserError(f"--shard-pairs {self.shard_pairs}: must be >= 1 (training pairs per shard file)")
        if self.workers < 0:
            raise UserError(f"--workers {self.workers}: must be >= 0 (0: one per core)")
        if self.spm_model or self.pretokenized:
            wrong = self.given(REUSED_VOCABULARY)
            if wrong:
                raise UserError(f"{', '.join(wrong)}: settings of a trained SentencePiece model, not used with "
                                f"{'--spm-model' if self.spm_model else '--pretokenized'}")

    def _check_classify(self) -> None:
        if self.text_key is not None and len(self.text_key) > 1:
            raise UserError(f"--text-key given {len(self.text_key)} times ({', '.join(self.text_key)}): JSONL reads "
                            "one text per example; sentence pairs are read from TSV/CSV with --text-column A "
                            "--text-column B")
        if (self.valid is None) == (self.holdout is None):
            raise UserError("--task classify needs exactly one of --valid FILE and --holdout N")
        if self.hf_tokenizer is not None:
            wrong = self.given(SENTENCEPIECE_ONLY)
            if wrong:
                raise UserError(f"{', '.join(wrong)}: SentencePiece settings, not used with --hf-tokenizer")

    def _check_code(self) -> None:
        if self.valid is None:
            raise UserError("--task code needs --valid PREFIX (the corpus's valid.desc / valid.code)")


def prepare_data(options: PrepareOptions) -> dict[str, Any]:
    """Check the options, remove what a killed preparation of the same output left, prepare the data directory
    and return its data.json."""
    options.validate()
    removed = remove_stale_output_temporaries(options.out)
    if removed:
        log.warning("removed %d temporary file(s) or folder(s) left by an interrupted run: %s", len(removed),
                    ", ".join(str(p) for p in removed))
    o = options
    if o.task == "classify":
        read = ReadOptions(format=o.format, header=o.header, label_column=o.label_column,
                           text_column=o.text_column or ["1"], label_key=o.label_key,
                           text_key=(o.text_key or ["text"])[0], fine_labels=o.fine_labels, empty_text=o.empty_text,
                           encoding_errors=o.encoding_errors)
        classify = ClassifyPrepareConfig(train=o.train, out=o.out, valid=o.valid, holdout=o.holdout, test=list(o.test),
                                         read=read, vocab_size=o.vocab_size, model_type=o.model_type,
                                         character_coverage=o.character_coverage, max_len=o.max_len or None,
                                         too_long=o.too_long, force=o.force, seed=o.seed, hf_tokenizer=o.hf_tokenizer)
        classify.validate()
        return prepare_classification(classify)
    if o.task == "code":
        return prepare_code(CodePrepareConfig(
            train=o.train, valid=o.valid, out=o.out, holdout=1000 if o.holdout is None else o.holdout,  # type: ignore[arg-type]
            test=list(o.test), vocab_size=o.vocab_size, joint=not o.separate_vocab, model_type=o.model_type,
            character_coverage=o.character_coverage, max_len=o.max_len or None, docstring_errors=o.docstring_errors,
            encoding_errors=o.encoding_errors, force=o.force, seed=o.seed))
    return prepare(PrepareConfig(
        src_lang=o.src, tgt_lang=o.tgt, train=o.train, valid=o.valid, test=list(o.test), out=o.out,  # type: ignore[arg-type]
        vocab_size=o.vocab_size, joint=not (o.separate_vocab or o.spm_model_tgt or o.dict_tgt), model_type=o.model_type,
        character_coverage=o.character_coverage, max_len=o.max_len or None, max_len_ratio=o.max_len_ratio or None,
        encoding_errors=o.encoding_errors, force=o.force, seed=o.seed, workers=o.workers,
        spm_max_sentences=o.spm_sample, shard_pairs=o.shard_pairs, spm_model=o.spm_model,
        spm_model_tgt=o.spm_model_tgt, pretokenized=o.pretokenized, dict=o.dict, dict_tgt=o.dict_tgt))


def summary(meta: dict[str, Any], task: str, out: str) -> str:
    """A few lines for the terminal: examples or pairs kept per split, the vocabulary, where the details are."""
    if task == "classify":
        vocabulary = (f"Hugging Face tokenizer, {meta['vocab_size']} ids" if meta.get("hf_tokenizer")
                      else f"{meta['vocab_size']} pieces")
        lines = [f"prepared {len(meta['labels'])}-label classification data in {out} ({vocabulary}; "
                 f"labels: {', '.join(meta['labels'])})"]
        lines += [f"  {name:<6} {entry['examples']:>8} examples" for name, entry in meta["splits"].items()]
        lines.append(f"  details: {out}/report.md, {out}/data.json")
        return "\n".join(lines)
    vocab = meta["vocab_size"]
    kind = "joint" if meta["joint"] else "separate"
    sizes = str(vocab["src"]) if meta["joint"] else f"{vocab['src']}/{vocab['tgt']}"
    lines = [f"prepared {meta['src_lang']}->{meta['tgt_lang']} in {meta['out']} ({kind} vocabulary, {sizes} pieces)"]
    shards = sum(len(entry.get("shards", [])) for entry in meta["splits"].values())
    for name, entry in meta["splits"].items():
        dropped = ", ".join(f"{reason} {n}" for reason, n in entry["dropped"].items() if n) or "none"
        replaced = sum(entry["replaced_lines"].values())
        extra = f"; {replaced} line(s) with replaced bytes" if replaced else ""
        lines.append(f"  {name:<6} {entry['pairs']:>8} pairs kept of {entry['lines']} (dropped: {dropped}){extra}")
    lines.append(f"  details: {meta['out']}/report.md, {meta['out']}/data.json ({shards} shard(s))")
    return "\n".join(lines)
