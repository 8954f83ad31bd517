"""`prepare`: raw parallel text -> SentencePiece model(s) + memory-mappable binarised splits + a report.

Inputs are fairseq-style `{prefix}.{lang}` files. Every split is read with the strict line rules of
`multibranch.data.text`; pairs with an empty (or whitespace-only) side are dropped everywhere. The
SentencePiece model is trained on the training split only; training pairs longer than `max_len`
subword tokens, or whose lengths differ by more than `max_len_ratio` (plus a small allowance for short
sentences), are dropped as well. Validation and test pairs are references and are never
length-filtered. Every drop is counted by reason in `data.json` and `report.md`.

Output directory (split names: `train`, `valid`, `test`, `test1`, ... for further test prefixes;
sides: `src`, `tgt`):

    spm.model                      joint vocabulary (or spm.src.model + spm.tgt.model when separate)
    {split}.{side}.tokens.npy      int32, the ids of all kept sentences concatenated (no BOS/EOS)
    {split}.{side}.offsets.npy     int64 [n+1]; sentence i is tokens[offsets[i]:offsets[i+1]]
    {split}.{side}.txt             the kept raw lines, UTF-8, one per line (BLEU references, translate input)
    data.json                      format version, languages, vocabularies, counts, drops, fingerprint, config
    report.md                      the same for humans, plus length percentiles and unknown-token rates

The directory is built in a temporary sibling and swapped in at the end, so a failure never leaves a
half-written output directory.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import sentencepiece
import sentencepiece as spm

from multibranch import __version__
from multibranch.atomic import atomic_directory
from multibranch.config import ConfigError, to_dict
from multibranch.data.directories import DATA, refuse_other_kind
from multibranch.data.text import ParallelText, read_parallel, write_lines
from multibranch.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, load_processor
from multibranch.errors import DataError

FORMAT = "multibranch-data"
FORMAT_VERSION = 1
SIDES = ("src", "tgt")
DROP_REASONS = ("empty", "too_long", "ratio")


def check_spm_settings(model_type: str, vocab_size: int, character_coverage: float, max_len: int | None) -> None:
    """ConfigError for SentencePiece / length settings that every `prepare` (any task) refuses."""
    if model_type not in ("bpe", "unigram"):
        raise ConfigError(f"model_type={model_type!r} must be 'bpe' or 'unigram'")
    if vocab_size < 8:
        raise ConfigError(f"vocab_size={vocab_size} is too small (4 ids are special)")
    if not 0.0 < character_coverage <= 1.0:
        raise ConfigError(f"character_coverage={character_coverage} must be in (0, 1]")
    if max_len is not None and max_len < 1:
        raise ConfigError(f"max_len={max_len} must be >= 1 (or None to disable)")


@dataclass
class PrepareConfig:
    """Settings of `prepare`. Lengths are counted in SentencePiece tokens, without BOS/EOS.

    A training pair is dropped for `ratio` when `max(ls, lt) > max_len_ratio * min(ls, lt) +
    ratio_allowance`: the allowance keeps short pairs such as "Hi." / "Hallo zusammen." that a pure
    ratio (as in Moses' clean-corpus-n) would reject. `max_len=None` / `max_len_ratio=None` disable
    those filters. SentencePiece is trained with `threads` threads on at most `spm_max_sentences`
    sentences (a seeded sample when the corpus is larger); the model depends on both, so keep them
    fixed to reproduce a data directory.
    """

    src_lang: str
    tgt_lang: str
    train: str
    valid: str
    out: str
    test: list[str] = field(default_factory=list)
    vocab_size: int = 8000
    joint: bool = True
    model_type: Literal["bpe", "unigram"] = "bpe"
    character_coverage: float = 1.0
    max_len: int | None = 256
    max_len_ratio: float | None = 3.0
    ratio_allowance: int = 5
    encoding_errors: Literal["strict", "replace"] = "strict"
    force: bool = False
    seed: int = 1
    threads: int = 1
    spm_max_sentences: int = 1_000_000

    def validate(self) -> None:
        for name in ("src_lang", "tgt_lang"):
            lang = getattr(self, name)
            if not lang or any(c.isspace() or c in "/\\" for c in lang):
                raise ConfigError(f"{name}={lang!r} must be a non-empty language code such as 'en'")
        if self.src_lang == self.tgt_lang:
            raise ConfigError(f"src_lang and tgt_lang are both {self.src_lang!r}: the files would be the same")
        check_spm_settings(self.model_type, self.vocab_size, self.character_coverage, self.max_len)
        if self.encoding_errors not in ("strict", "replace"):
            raise ConfigError(f"encoding_errors={self.encoding_errors!r} must be 'strict' or 'replace'")
        if self.max_len_ratio is not None and self.max_len_ratio < 1.0:
            raise ConfigError(f"max_len_ratio={self.max_len_ratio} must be >= 1 (or None to disable)")
        if self.ratio_allowance < 0 or self.threads < 1 or self.spm_max_sentences < 1:
            raise ConfigError("ratio_allowance must be >= 0, threads and spm_max_sentences >= 1")

    def splits(self) -> list[tuple[str, str]]:
        """(split name, prefix) pairs: train, valid, then test, test1, test2, ..."""
        tests = [("test" if i == 0 else f"test{i}", prefix) for i, prefix in enumerate(self.test)]
        return [("train", self.train), ("valid", self.valid), *tests]

    def input_files(self, prefix: str) -> tuple[Path, Path]:
        return Path(f"{prefix}.{self.src_lang}"), Path(f"{prefix}.{self.tgt_lang}")


@dataclass
class Split:
    """One split in memory while preparing."""

    name: str
    prefix: str
    text: ParallelText
    keep: list[int]
    dropped: dict[str, int]
    ids: dict[str, list[list[int]]] = field(default_factory=dict)


def prepare(cfg: PrepareConfig) -> dict[str, Any]:
    """Run the whole preparation; returns the `data.json` contents plus `out`."""
    cfg.validate()
    out = Path(cfg.out).resolve()
    check_inputs(cfg)
    check_out_dir(cfg, out)
    splits = [_read_split(cfg, name, prefix) for name, prefix in cfg.splits()]
    train = splits[0]
    if not train.keep:
        raise DataError(f"{cfg.train}.{{{cfg.src_lang},{cfg.tgt_lang}}}: no non-empty training pairs")
    require_valid_pairs(cfg, splits[1])

    with atomic_directory(out) as tmp:
        meta = build_data_dir(cfg, splits, tmp)
    return {**meta, "out": cfg.out}


# ----------------------------------------------------------------------------------------- checks


def check_inputs(cfg: PrepareConfig) -> None:
    for name, prefix in cfg.splits():
        if Path(prefix).is_dir() and not any(p.exists() for p in cfg.input_files(prefix)):
            flag = "--test" if name.startswith("test") else f"--{name}"
            raise DataError(f"{flag} {prefix}: is a directory; {flag} takes the files' PREFIX (PREFIX."
                            f"{cfg.src_lang} and PREFIX.{cfg.tgt_lang}){_prefixes_in(Path(prefix), cfg)}")
    files = [p for _, prefix in cfg.splits() for p in cfg.input_files(prefix)]
    directories = [str(p) for p in files if p.is_dir()]
    if directories:
        raise DataError(f"input path(s) {', '.join(directories)}: is a directory, expected a text file PREFIX.LANG")
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise DataError(
            f"input file(s) not found: {', '.join(missing)} (files are named PREFIX.LANG, "
            f"e.g. {cfg.train}.{cfg.src_lang}; check the prefixes and --src/--tgt)"
        )


def require_valid_pairs(cfg: PrepareConfig, valid: Split) -> None:
    """Refuse a validation split without a non-empty pair (an empty --valid file): training would stop
    at its first validation with nothing to average."""
    if not valid.keep:
        raise DataError(f"{cfg.valid}.{{{cfg.src_lang},{cfg.tgt_lang}}}: no non-empty validation pairs; "
                        "--valid needs at least one")


def _prefixes_in(directory: Path, cfg: PrepareConfig) -> str:
    """", e.g. DIR/train or DIR/valid": the prefixes in `directory` that have both files, or ""."""
    found = sorted(str(p.with_suffix("")) for p in directory.glob(f"*.{cfg.src_lang}")
                   if p.with_suffix(f".{cfg.tgt_lang}").is_file())
    return f", e.g. {' or '.join(found[:3])}" if found else ""


def check_out_dir(cfg: PrepareConfig, out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory; choose another --out")
    refuse_other_kind(out, DATA)
    if out.is_dir() and any(out.iterdir()):
        if not cfg.force:
            raise DataError(f"{out}: output directory exists and is not empty; pass --force to replace it")
        resolved = out.resolve()
        for _, prefix in cfg.splits():
            for path in cfg.input_files(prefix):
                if path.resolve().is_relative_to(resolved):
                    raise DataError(
                        f"{out}: refusing --force because input {path} is inside it; choose another --out"
                    )


def _read_split(cfg: PrepareConfig, name: str, prefix: str) -> Split:
    src_path, tgt_path = cfg.input_files(prefix)
    text = read_parallel(src_path, tgt_path, encoding_errors=cfg.encoding_errors)
    keep = [i for i, (s, t) in enumerate(zip(text.src.lines, text.tgt.lines, strict=True)) if s.strip() and t.strip()]
    dropped = dict.fromkeys(DROP_REASONS if name == "train" else ("empty",), 0)
    dropped["empty"] = len(text) - len(keep)
    return Split(name, prefix, text, keep, dropped)


# --------------------------------------------------------------------------------- sentencepiece


def train_spm(cfg: PrepareConfig, sentences: list[str]) -> bytes:
    """Train one SentencePiece model in memory; returns the serialized model."""

    if len(sentences) > cfg.spm_max_sentences:
        picked = sorted(random.Random(cfg.seed).sample(range(len(sentences)), cfg.spm_max_sentences))
        sentences = [sentences[i] for i in picked]
    spm.set_random_generator_seed(cfg.seed)
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=writer,
            model_type=cfg.model_type,
            vocab_size=cfg.vocab_size,
            character_coverage=cfg.character_coverage,
            hard_vocab_limit=False,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=cfg.threads,
            minloglevel=2,
        )
    except RuntimeError as err:
        raise DataError(
            f"SentencePiece training on {cfg.train}.* failed: {err}; "
            "try another --vocab-size or a lower --character-coverage"
        ) from None
    return writer.getvalue()


# ------------------------------------------------------------------------------------- building


def _length_filter(cfg: PrepareConfig, split: Split) -> None:
    """Drop training pairs that are empty after tokenisation, too long, or of implausible length ratio."""
    ls = np.array([len(x) for x in split.ids["src"]], dtype=np.int64)
    lt = np.array([len(x) for x in split.ids["tgt"]], dtype=np.int64)
    empty = (ls == 0) | (lt == 0)
    too_long = np.zeros_like(empty)
    if cfg.max_len is not None:
        too_long = ~empty & ((ls > cfg.max_len) | (lt > cfg.max_len))
    ratio = np.zeros_like(empty)
    if cfg.max_len_ratio is not None:
        ratio = ~empty & ~too_long & (np.maximum(ls, lt) > cfg.max_len_ratio * np.minimum(ls, lt) + cfg.ratio_allowance)
    split.dropped["empty"] += int(empty.sum())
    split.dropped["too_long"] += int(too_long.sum())
    split.dropped["ratio"] += int(ratio.sum())
    good = np.flatnonzero(~(empty | too_long | ratio))
    if len(good) == 0:
        raise DataError(
            f"{cfg.train}.*: every training pair was dropped by the length filters "
            f"(max_len={cfg.max_len}, max_len_ratio={cfg.max_len_ratio}); relax them"
        )
    split.keep = [split.keep[i] for i in good]
    for side in SIDES:
        split.ids[side] = [split.ids[side][i] for i in good]


def binarise(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated int32 tokens and int64 offsets [n+1]."""
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
    return tokens, offsets


def length_stats(lengths: np.ndarray) -> dict[str, float]:
    if len(lengths) == 0:
        return {"min": 0, "mean": 0.0, "p50": 0, "p90": 0, "p95": 0, "p99": 0, "max": 0}
    p50, p90, p95, p99 = (float(v) for v in np.percentile(lengths, [50, 90, 95, 99]))
    return {
        "min": int(lengths.min()), "mean": round(float(lengths.mean()), 2),
        "p50": p50, "p90": p90, "p95": p95, "p99": p99, "max": int(lengths.max()),
    }


def build_data_dir(cfg: PrepareConfig, splits: list[Split], out: Path) -> dict[str, Any]:
    """Train SentencePiece, encode, filter and write every file into `out`; returns the metadata."""


    train = splits[0]
    train_src = [train.text.src.lines[i] for i in train.keep]
    train_tgt = [train.text.tgt.lines[i] for i in train.keep]
    if cfg.joint:
        protos = {"src": train_spm(cfg, train_src + train_tgt)}
        protos["tgt"] = protos["src"]
        spm_files = {"src": "spm.model", "tgt": "spm.model"}
    else:
        protos = {"src": train_spm(cfg, train_src), "tgt": train_spm(cfg, train_tgt)}
        spm_files = {"src": "spm.src.model", "tgt": "spm.tgt.model"}
    processors = {side: load_processor(protos[side]) for side in SIDES}
    for side in SIDES:
        (out / spm_files[side]).write_bytes(protos[side])

    split_meta: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    for split in splits:
        lines = {"src": split.text.src.lines, "tgt": split.text.tgt.lines}
        for side in SIDES:
            split.ids[side] = processors[side].encode([lines[side][i] for i in split.keep])
        if split.name == "train":
            _length_filter(cfg, split)
        entry: dict[str, Any] = {
            "prefix": split.prefix,
            "lines": len(split.text),
            "pairs": len(split.keep),
            "dropped": dict(split.dropped),
            "replaced_lines": {"src": split.text.src.replaced, "tgt": split.text.tgt.replaced},
            "tokens": {},
        }
        stats[split.name] = {}
        for side in SIDES:
            tokens, offsets = binarise(split.ids[side])
            np.save(out / f"{split.name}.{side}.tokens.npy", tokens)
            np.save(out / f"{split.name}.{side}.offsets.npy", offsets)
            write_lines(out / f"{split.name}.{side}.txt", (lines[side][i] for i in split.keep))
            entry["tokens"][side] = int(len(tokens))
            stats[split.name][side] = {
                "length": length_stats(np.diff(offsets)),
                "unk_rate": float((tokens == UNK_ID).sum() / max(len(tokens), 1)),
                "types": int(len(np.unique(tokens))),
            }
        entry["length"] = {side: stats[split.name][side]["length"] for side in SIDES}
        entry["unk_rate"] = {side: stats[split.name][side]["unk_rate"] for side in SIDES}
        split_meta[split.name] = entry
        split.ids.clear()

    vocab_size = {side: processors[side].get_piece_size() for side in SIDES}
    meta: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "src_lang": cfg.src_lang,
        "tgt_lang": cfg.tgt_lang,
        "joint": cfg.joint,
        "spm": spm_files,
        "vocab_size": vocab_size,
        "special_ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
        "splits": split_meta,
        "fingerprint": fingerprint(out, spm_files, list(split_meta)),
        "versions": {"multibranch": __version__, "sentencepiece": sentencepiece.__version__},
        "config": to_dict(cfg),
    }
    (out / "data.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "report.md").write_text(_report(meta, stats), encoding="utf-8")
    return meta


def fingerprint(directory: Path, spm_files: dict[str, str], split_names: list[str]) -> str:
    """sha256 over the SentencePiece model(s) and every binarised array (names and bytes)."""
    names = sorted(set(spm_files.values())) + [
        f"{split}.{side}.{kind}.npy" for split in split_names for side in SIDES for kind in ("tokens", "offsets")
    ]
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + b"\0")
        with open(directory / name, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------- report


def _report(meta: dict[str, Any], stats: dict[str, Any]) -> str:
    """Human-readable summary of a prepared directory (Markdown)."""
    cfg = meta["config"]
    lines = [
        f"# Prepared data: {meta['src_lang']} -> {meta['tgt_lang']}",
        "",
        f"- SentencePiece: {cfg['model_type']}, {'joint' if meta['joint'] else 'separate'} vocabulary, "
        f"requested {cfg['vocab_size']}, got src {meta['vocab_size']['src']} / tgt {meta['vocab_size']['tgt']} "
        f"({', '.join(sorted(set(meta['spm'].values())))})",
        f"- Special ids: pad={PAD_ID} unk={UNK_ID} bos={BOS_ID} eos={EOS_ID}",
        f"- Training filters: max_len={cfg['max_len']} tokens, max_len_ratio={cfg['max_len_ratio']} "
        f"(+{cfg['ratio_allowance']} tokens allowance); valid/test are never length-filtered",
        f"- Fingerprint: `{meta['fingerprint']}`",
        "",
        "## Pairs",
        "",
        "| split | prefix | lines read | kept | dropped: empty | too_long | ratio | lines with replaced bytes (src/tgt) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, entry in meta["splits"].items():
        d = entry["dropped"]
        rep = entry["replaced_lines"]
        lines.append(
            f"| {name} | `{entry['prefix']}` | {entry['lines']} | {entry['pairs']} | {d['empty']} | "
            f"{d.get('too_long', '-')} | {d.get('ratio', '-')} | {rep['src']}/{rep['tgt']} |"
        )
    lines += [
        "",
        "## Lengths (subword tokens, without EOS)",
        "",
        "| split | side | tokens | min | mean | p50 | p90 | p95 | p99 | max |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in meta["splits"].items():
        for side in SIDES:
            s = stats[name][side]["length"]
            lines.append(
                f"| {name} | {side} | {entry['tokens'][side]} | {s['min']} | {s['mean']} | {s['p50']:g} | "
                f"{s['p90']:g} | {s['p95']:g} | {s['p99']:g} | {s['max']} |"
            )
    lines += [
        "",
        "## Vocabulary coverage",
        "",
        "| split | side | distinct ids used | share of vocabulary | unk rate |",
        "|---|---|---:|---:|---:|",
    ]
    for name in meta["splits"]:
        for side in SIDES:
            st = stats[name][side]
            size = meta["vocab_size"][side]
            lines.append(
                f"| {name} | {side} | {st['types']} | {st['types'] / size:.1%} | {st['unk_rate']:.4%} |"
            )
    high = [
        f"{name}.{side}" for name in meta["splits"] for side in SIDES if stats[name][side]["unk_rate"] > 0.001
    ]
    if high:
        lines += [
            "",
            f"Note: unk rate above 0.1% in {', '.join(high)}: characters unseen in training map to <unk>; "
            "raise --character-coverage or check the text for stray scripts/encodings.",
        ]
    return "\n".join(lines) + "\n"
