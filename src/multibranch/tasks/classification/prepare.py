"""Preparing classification data: labelled text -> SentencePiece + binarised splits + label arrays + a report.

Inputs are labelled files read by `multibranch.tasks.classification.readers` (TSV, CSV, TREC, JSONL). The
validation split is a file (`valid`) or, the easy path for corpora that ship only a training file
(TREC-6, SST-2), a `holdout` carved from train: a fraction in (0, 1) or a whole number of examples,
stratified by label and chosen with a fixed seed (`stratified_holdout`). Further files are `test`,
`test1`, ... The label vocabulary is the sorted set of training labels (sorted as strings; label id =
position); a validation or test label that never occurs in train is an error naming the line.

SentencePiece is trained on the training texts only; with `hf_tokenizer` (a local Hugging Face model
or tokenizer directory) no SentencePiece is trained and the texts are tokenized with that tokenizer
(ids = the HF model's ids, bos/eos = its CLS/SEP), for fine-tuning an imported BERT/RoBERTa. Texts longer than `max_len` subword tokens are
truncated (`too_long="truncate"`, counted) or, in train only, dropped (`too_long="drop"`, counted);
validation and test examples are never dropped for length, only truncated, so their example counts
stay those of the files. The kept raw text is written untruncated. For each validation and test split,
`in_train` counts its texts that also occur verbatim in train (duplicates in the corpus leak through a
holdout: about 2% of an SST-2 holdout).

Output directory (splits: `train`, `valid`, `test`, `test1`, ...):

    spm.model              the SentencePiece model (pad 0, unk 1, bos 2, eos 3), or
    tokenizer.json         the Hugging Face tokenizer (with hf_tokenizer; its ids are in data.json)
    {split}.tokens.npy     int32, the ids of all kept texts concatenated (no BOS/EOS)
    {split}.offsets.npy    int64 [n+1]; text i is tokens[offsets[i]:offsets[i+1]]
    {split}.labels.npy     int64 [n], label ids (positions in data.json's `labels`)
    {split}.txt            the kept raw texts, UTF-8, one per line (pairs: `a<TAB>b`)
    data.json              format, version, labels, counts per split and label, drops by reason,
                           fingerprint, config
    report.md              the same for humans, plus lengths and unknown-token rates

It is built in a temporary sibling directory and swapped in at the end (as `prepare` does).

Sentence pairs (two text columns, `ReadOptions.text_column`): each example is stored as the one sequence
`a + separator + b` (`pairs.pair_separator`: [SEP] for BERT, </s></s> for RoBERTa, EOS for SentencePiece,
which is trained on both texts); `max_len` bounds that whole sequence, and a longer pair is cut by
Hugging Face's `longest_first` rule (counted as truncated). data.json records `pairs` and the separator.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import sentencepiece

from multibranch import __version__
from multibranch.atomic import atomic_directory
from multibranch.config import ConfigError, to_dict
from multibranch.data.directories import DATA, check_output_directory
from multibranch.data.fingerprint import hash_files
from multibranch.data.length_stats import length_stats
from multibranch.data.sentencepiece_training import check_spm_settings, train_spm
from multibranch.data.shards import binarise
from multibranch.data.text import write_lines
from multibranch.data.tokenizer import HFTokenizer, Tokenizer
from multibranch.errors import DataError
from multibranch.tasks.classification.pairs import join_pair, pair_separator
from multibranch.tasks.classification.readers import LabeledText, ReadOptions, read_labeled

FORMAT = "multibranch-classification-data"
FORMAT_VERSION = 1
SPM_FILE = "spm.model"
HF_TOKENIZER_FILE = "tokenizer.json"
ARRAYS = ("tokens", "offsets", "labels")
DROP_REASONS = ("blank", "empty", "too_long")


@dataclass
class ClassifyPrepareConfig:
    """Settings of the classification `prepare` (lengths in SentencePiece tokens, without BOS/EOS).

    Exactly one of `valid` (a file) and `holdout` (a fraction in (0, 1) or a whole count >= 1 of
    training examples, stratified, seeded by `seed`) gives the validation split. `max_len=None`
    disables truncation. SentencePiece settings are those of `data.parallel_prepare.PrepareConfig`;
    `hf_tokenizer` (a local HF model/tokenizer directory) replaces SentencePiece.
    """

    train: str
    out: str
    valid: str | None = None
    holdout: float | None = None
    test: list[str] = field(default_factory=list)
    read: ReadOptions = field(default_factory=ReadOptions)
    vocab_size: int = 8000
    model_type: Literal["bpe", "unigram"] = "bpe"
    character_coverage: float = 1.0
    max_len: int | None = 256
    too_long: Literal["truncate", "drop"] = "truncate"
    force: bool = False
    seed: int = 1
    threads: int = 1
    spm_max_sentences: int = 1_000_000
    hf_tokenizer: str | None = None

    def validate(self) -> None:
        self.read.validate()
        if (self.valid is None) == (self.holdout is None):
            raise ConfigError("give exactly one of valid (a file) and holdout (a fraction or count of train)")
        if self.holdout is not None:
            if not math.isfinite(self.holdout) or self.holdout <= 0 or \
                    (self.holdout >= 1 and not float(self.holdout).is_integer()):
                raise ConfigError(f"holdout={self.holdout} must be a fraction in (0, 1) or a whole count >= 1")
        check_spm_settings(self.model_type, self.vocab_size, self.character_coverage, self.max_len)
        if self.too_long not in ("truncate", "drop"):
            raise ConfigError(f"too_long={self.too_long!r} must be 'truncate' or 'drop'")
        if self.threads < 1 or self.spm_max_sentences < 1:
            raise ConfigError("threads and spm_max_sentences must be >= 1")

    def input_files(self) -> list[tuple[str, Path]]:
        """(split name, file) for every input file: train, valid (unless held out), test, test1, ..."""
        files = [("train", Path(self.train))]
        if self.valid is not None:
            files.append(("valid", Path(self.valid)))
        files += [("test" if i == 0 else f"test{i}", Path(p)) for i, p in enumerate(self.test)]
        return files


@dataclass
class _Split:
    """One split in memory while preparing."""

    name: str
    source: str
    labels: list[str]
    texts: list[str]
    line_numbers: list[int]
    read: LabeledText | None  # None for a split carved from another file
    seconds: list[str] | None = None  # sentence pairs: the second texts
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    truncated: int = 0

    def subset(self, indices: list[int]) -> _Split:
        """A split of the examples `indices` (same name, source and file)."""
        return _Split(self.name, self.source, [self.labels[i] for i in indices], [self.texts[i] for i in indices],
                      [self.line_numbers[i] for i in indices], self.read,
                      None if self.seconds is None else [self.seconds[i] for i in indices],
                      dict(self.dropped), self.truncated)

    def raw(self) -> list[str]:
        """The raw text of each example, one line each (a pair as `a<TAB>b`)."""
        if self.seconds is None:
            return self.texts
        return [f"{a}\t{b}" for a, b in zip(self.texts, self.seconds, strict=True)]


def stratified_holdout(labels: list[str], size: float, seed: int) -> tuple[list[int], list[int]]:
    """Split example indices into (kept, held out), both in file order.

    `size` is a fraction in (0, 1) or a whole count. Each label gives its share of the held-out count
    (largest remainder, ties by label name) but always keeps at least one example in train; the
    examples of each label are sampled with `random.Random(seed)`, labels visited in sorted order.
    """
    n = len(labels)
    count = round(size * n) if size < 1 else int(size)
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        by_label.setdefault(label, []).append(i)
    capacity = n - len(by_label)
    if not 1 <= count <= capacity:
        raise DataError(
            f"holdout={size:g} asks for {count} of {n} training examples; it must leave at least one example "
            f"of each of the {len(by_label)} labels in train (at most {capacity}) and hold out at least one"
        )
    quota = {label: len(ix) * count / n for label, ix in by_label.items()}
    take = {label: min(math.floor(q), len(by_label[label]) - 1) for label, q in quota.items()}
    order = sorted(by_label, key=lambda label: (-(quota[label] - math.floor(quota[label])), label))
    left = count - sum(take.values())
    while left:
        for label in order:
            if left and take[label] < len(by_label[label]) - 1:
                take[label] += 1
                left -= 1
    rng = random.Random(seed)
    held = sorted(i for label in sorted(by_label) for i in rng.sample(by_label[label], take[label]))
    held_set = set(held)
    return [i for i in range(n) if i not in held_set], held


def prepare_classification(cfg: ClassifyPrepareConfig) -> dict[str, Any]:
    """Run the whole preparation; returns the `data.json` contents plus `out`."""
    cfg.validate()
    out = Path(cfg.out).resolve()
    _check_paths(cfg, out)
    hf = HFTokenizer.from_pretrained(cfg.hf_tokenizer) if cfg.hf_tokenizer is not None else None
    splits = _read_splits(cfg)
    labels = sorted(set(splits[0].labels))
    for split in splits[1:]:
        _check_labels(split, labels)

    with atomic_directory(out) as tmp:
        meta = _build(cfg, splits, labels, tmp, hf)
    return {**meta, "out": cfg.out}


# ----------------------------------------------------------------------------------- reading


def _check_paths(cfg: ClassifyPrepareConfig, out: Path) -> None:
    for name, path in cfg.input_files():
        if path.is_dir():
            flag = "--test" if name.startswith("test") else f"--{name}"
            raise DataError(f"{flag} {path}: is a directory; {flag} takes a labelled text file (TSV, CSV, TREC, "
                            "JSONL)")
    missing = [str(path) for _, path in cfg.input_files() if not path.is_file()]
    if missing:
        raise DataError(f"input file(s) not found: {', '.join(missing)}")
    check_output_directory(out, DATA, force=cfg.force, inputs=[path for _, path in cfg.input_files()], error=DataError)


def _from_file(name: str, read: LabeledText) -> _Split:
    split = _Split(name, str(read.path), read.labels, read.texts, read.line_numbers, read, read.second_texts)
    split.dropped.update(read.dropped)
    return split


def _read_splits(cfg: ClassifyPrepareConfig) -> list[_Split]:
    files = cfg.input_files()
    train = _from_file("train", read_labeled(files[0][1], cfg.read))
    if not train.texts:
        raise DataError(f"{cfg.train}: no training examples")
    splits = [train]
    if cfg.holdout is not None:
        kept, held = stratified_holdout(train.labels, cfg.holdout, cfg.seed)
        valid = train.subset(held)
        valid.name, valid.source, valid.read, valid.dropped = "valid", f"{cfg.train} (holdout)", None, \
            dict.fromkeys(DROP_REASONS, 0)
        train = train.subset(kept)
        splits = [train, valid]
    for name, path in files[1:]:
        splits.append(_from_file(name, read_labeled(path, cfg.read)))
        if not splits[-1].texts:
            raise DataError(f"{path}: no examples (the {name} split would be empty)")
    return splits


def _check_labels(split: _Split, labels: list[str]) -> None:
    known = set(labels)
    for label, number in zip(split.labels, split.line_numbers, strict=True):
        if label not in known:
            shown = ", ".join(labels) if len(labels) <= 30 else ", ".join(labels[:30]) + f", ... ({len(labels)})"
            raise DataError(
                f"{split.source}:{number}: label {label!r} never occurs in the training data "
                f"(known labels: {shown})"
            )


# ---------------------------------------------------------------------------------- building


def _encode(tokenizer: Tokenizer | HFTokenizer, split: _Split, separator: list[int]) -> list[tuple[list[int], ...]]:
    """Each example's token ids: (text,) or, for pairs, (a, b), without BOS/EOS or separator."""
    firsts = tokenizer.encode_src(split.texts)
    if split.seconds is None:
        return [(ids,) for ids in firsts]
    return list(zip(firsts, tokenizer.encode_src(split.seconds), strict=True))


def _fit_lengths(cfg: ClassifyPrepareConfig, split: _Split, encoded: list[tuple[list[int], ...]],
                 separator: list[int]) -> tuple[_Split, list[list[int]]]:
    """Truncate (or, in train with too_long='drop', drop) examples longer than max_len tokens (a pair: its
    texts and separator together, cut by `longest_first`); returns the kept split and its id sequences."""
    def full_length(parts: tuple[list[int], ...]) -> int:
        return sum(map(len, parts)) + (len(separator) if len(parts) == 2 else 0)

    limit = cfg.max_len
    drop = limit is not None and split.name == "train" and cfg.too_long == "drop"
    keep = [i for i, parts in enumerate(encoded) if not (drop and full_length(parts) > limit)]  # type: ignore[operator]
    split.dropped["too_long"] = len(encoded) - len(keep)
    if drop and not keep:
        raise DataError(f"{cfg.train}: every training text is longer than max_len={cfg.max_len}; raise it")
    if len(keep) < len(encoded):
        split = split.subset(keep)
    ids, truncated = [], 0
    for i in keep:
        parts = encoded[i]
        if len(parts) == 2:
            joined, cut = join_pair(parts[0], parts[1], separator, limit)
        else:
            joined = parts[0] if limit is None else parts[0][:limit]
            cut = len(joined) < len(parts[0])
        ids.append(joined)
        truncated += cut
    split.truncated = truncated
    return split, ids


def _build(cfg: ClassifyPrepareConfig, splits: list[_Split], labels: list[str], out: Path,
           hf: HFTokenizer | None) -> dict[str, Any]:
    """Train SentencePiece (unless `hf` is given), encode, fit lengths and write every file into `out`;
    returns the metadata."""


    tokenizer: Tokenizer | HFTokenizer
    pairs = splits[0].seconds is not None
    if hf is None:
        proto = train_spm(cfg, splits[0].texts + (splits[0].seconds or []))
        tokenizer, tokenizer_file = Tokenizer(proto, proto), SPM_FILE
        (out / SPM_FILE).write_bytes(proto)
    else:
        tokenizer, tokenizer_file = hf, HF_TOKENIZER_FILE
        (out / HF_TOKENIZER_FILE).write_bytes(hf.tokenizer_json)
    separator = pair_separator(tokenizer) if pairs else []
    if pairs and cfg.max_len is not None and cfg.max_len < len(separator) + 2:
        raise ConfigError(f"max_len={cfg.max_len} leaves no room for a pair (two texts and the separator {separator})")
    label_ids = {label: i for i, label in enumerate(labels)}
    split_meta: dict[str, Any] = {}
    train_texts = set(splits[0].raw())
    for split in splits:
        split, ids = _fit_lengths(cfg, split, _encode(tokenizer, split, separator), separator)
        tokens, offsets = binarise(ids)
        label_array = np.array([label_ids[label] for label in split.labels], dtype=np.int64)
        np.save(out / f"{split.name}.tokens.npy", tokens)
        np.save(out / f"{split.name}.offsets.npy", offsets)
        np.save(out / f"{split.name}.labels.npy", label_array)
        write_lines(out / f"{split.name}.txt", split.raw())
        counts = Counter(split.labels)
        split_meta[split.name] = {
            "source": split.source,
            "lines": split.read.lines if split.read else None,
            "header": split.read.header if split.read else False,
            "examples": len(split.texts),
            "dropped": dict(split.dropped),
            "truncated": split.truncated,
            "joined_lines": split.read.joined_lines if split.read else 0,
            "replaced_lines": split.read.replaced_lines if split.read else 0,
            "label_counts": {label: counts.get(label, 0) for label in labels},
            "tokens": int(len(tokens)),
            "length": length_stats(np.diff(offsets)),
            "unk_rate": float((tokens == tokenizer.unk_id).sum() / max(len(tokens), 1)),
            "types": int(len(np.unique(tokens))),
            "in_train": None if split.name == "train" else sum(text in train_texts for text in split.raw()),
        }
    meta: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "spm": SPM_FILE if hf is None else None,
        "hf_tokenizer": None if hf is None else {"file": HF_TOKENIZER_FILE, "source": str(cfg.hf_tokenizer),
                                                 **hf.describe()},
        "vocab_size": tokenizer.src_vocab_size,
        "special_ids": {"pad": tokenizer.pad_id, "unk": tokenizer.unk_id, "bos": tokenizer.bos_id,
                        "eos": tokenizer.eos_id},
        "labels": labels,
        "pairs": pairs,
        "pair_separator": separator if pairs else None,
        "holdout": None if cfg.holdout is None else {"size": cfg.holdout, "seed": cfg.seed,
                                                      "examples": split_meta["valid"]["examples"]},
        "splits": split_meta,
        "fingerprint": fingerprint(out, labels, list(split_meta), tokenizer_file),
        "versions": {"multibranch": __version__, "sentencepiece": sentencepiece.__version__},
        "config": to_dict(cfg),
    }
    (out / "data.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "report.md").write_text(_report(meta), encoding="utf-8")
    return meta


def fingerprint(directory: Path, labels: list[str], split_names: list[str], tokenizer_file: str = SPM_FILE) -> str:
    """sha256 over the label vocabulary, the tokenizer file and every array (names and bytes)."""
    digest = hashlib.sha256(json.dumps(labels, ensure_ascii=False).encode("utf-8") + b"\0")
    names = [tokenizer_file] + [f"{split}.{kind}.npy" for split in split_names for kind in ARRAYS]
    return hash_files(directory, names, digest)


# ------------------------------------------------------------------------------------ report


def _report(meta: dict[str, Any]) -> str:
    """Human-readable summary of a prepared classification directory (Markdown)."""
    cfg = meta["config"]
    splits = meta["splits"]
    holdout = meta["holdout"]
    if holdout:
        valid = f"{holdout['examples']} examples held out from train (stratified by label, seed {holdout['seed']})"
    else:
        valid = f"`{cfg['valid']}`"
    ids = meta["special_ids"]
    if meta.get("hf_tokenizer"):
        tokenizer = (f"- Tokenizer: Hugging Face tokenizer of `{meta['hf_tokenizer']['source']}` "
                     f"({meta['hf_tokenizer']['file']}, {meta['vocab_size']} ids); special ids pad={ids['pad']} "
                     f"unk={ids['unk']} bos/CLS={ids['bos']} eos/SEP={ids['eos']}")
    else:
        tokenizer = (f"- SentencePiece: {cfg['model_type']}, requested {cfg['vocab_size']}, got {meta['vocab_size']} "
                     f"({meta['spm']}); special ids pad={ids['pad']} unk={ids['unk']} bos={ids['bos']} eos={ids['eos']}")
    lines = [
        f"# Prepared classification data: {len(meta['labels'])} labels",
        "",
        tokenizer,
        f"- Lengths: max_len={cfg['max_len']} tokens, over-long training texts are "
        f"{'dropped' if cfg['too_long'] == 'drop' else 'truncated'}; valid/test are only truncated",
        f"- Validation: {valid}",
        *([f"- Sentence pairs: text columns {', '.join(map(str, cfg['read']['text_column']))}, stored as "
           f"`a {' '.join(map(str, meta['pair_separator']))} b` (separator ids), BOS/EOS around; max_len counts the "
           "whole pair, over-long pairs cut longest text first (Hugging Face's longest_first), counted as truncated"]
          if meta.get("pairs") else []),
        f"- Fingerprint: `{meta['fingerprint']}`",
        "",
        "## Examples",
        "",
        "| split | source | lines read | examples | dropped: blank | empty | too_long | truncated | joined lines | replaced bytes | also in train |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in splits.items():
        d = s["dropped"]
        lines.append(
            f"| {name} | `{s['source']}` | {'-' if s['lines'] is None else s['lines']} | {s['examples']} | "
            f"{d['blank']} | {d['empty']} | {d['too_long']} | {s['truncated']} | {s['joined_lines']} | "
            f"{s['replaced_lines']} | {'-' if s['in_train'] is None else s['in_train']} |"
        )
    lines += ["", "## Labels (id, name, examples per split)", "",
              "| id | label | " + " | ".join(splits) + " |", "|---:|---|" + "---:|" * len(splits)]
    for i, label in enumerate(meta["labels"]):
        lines.append(f"| {i} | `{label}` | " + " | ".join(str(s["label_counts"][label]) for s in splits.values()) + " |")
    lines += ["", "## Lengths (subword tokens, after truncation)", "",
              "| split | tokens | min | mean | p50 | p90 | p95 | p99 | max | distinct ids | unk rate |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in splits.items():
        n = s["length"]
        lines.append(
            f"| {name} | {s['tokens']} | {n['min']} | {n['mean']} | {n['p50']:g} | {n['p90']:g} | {n['p95']:g} | "
            f"{n['p99']:g} | {n['max']} | {s['types']} | {s['unk_rate']:.4%} |"
        )
    return "\n".join(lines) + "\n"
