"""A parallel data directory (format `multibranch-data`, what translation and code generation train on):
its settings, input checks, vocabulary and the pass that encodes, filters and writes it.

`tasks/translation/prepare.py` streams the `{prefix}.{lang}` files through `write_data_dir`;
`tasks/code/prepare.py` selects its pairs in memory and writes them with `build_data_dir`. Layout:

    spm.model                      joint vocabulary (or spm.src.model + spm.tgt.model when separate)
    {shard}.{side}.tokens.npy      int32, the ids of the shard's sentences concatenated (no BOS/EOS)
    {shard}.{side}.offsets.npy     int64 [n+1]; sentence i is tokens[offsets[i]:offsets[i+1]]
    {split}.{side}.txt             the kept raw lines, UTF-8, one per line (BLEU references, translate input)
    data.json                      format version, languages, vocabularies, counts, drops, shards,
                                   fingerprint, config
    report.md                      the same for humans, plus length percentiles and unknown-token rates

Split names: `train`, `valid`, `test`, `test1`, ...; sides: `src`, `tgt`; shards: data/shards.py.
Training pairs longer than `max_len` subword tokens, or whose lengths differ by more than `max_len_ratio`
(plus a small allowance for short sentences), are dropped; validation and test pairs never are.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import sentencepiece
from sentencepiece import sentencepiece_model_pb2 as model_pb2
from tqdm import tqdm

from multibranch import __version__
from multibranch.config import ConfigError, to_dict
from multibranch.data.encoding import ChunkEncoder, LengthFilter
from multibranch.data.fingerprint import hash_files
from multibranch.data.progress import progress_bar
from multibranch.data.sentencepiece_training import Reservoir, check_spm_settings, train_spm
from multibranch.data.shards import SIDES, SplitWriter, shard_files, shard_names
from multibranch.data.text import ParallelChunk, ParallelText, same_file
from multibranch.data.tokenizer import Tokenizer
from multibranch.data.vocabulary import adapt_spm_model, count_words, ranked_words, read_dict, word_model
from multibranch.errors import DataError

log = logging.getLogger(__name__)

FORMAT = "multibranch-data"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: one shard per split, named like the split
DROP_REASONS = ("empty", "too_long", "ratio")


@dataclass
class PrepareConfig:
    """Settings of `prepare`. Lengths are counted in vocabulary tokens, without BOS/EOS.

    A training pair is dropped for `ratio` when `max(ls, lt) > max_len_ratio * min(ls, lt) +
    ratio_allowance`: the allowance keeps short pairs such as "Hi." / "Hallo zusammen." that a pure
    ratio (as in Moses' clean-corpus-n) would reject. `max_len=None` / `max_len_ratio=None` disable
    those filters. SentencePiece is trained with `threads` threads on at most `spm_max_sentences`
    sentences (a seeded sample when the corpus is larger); the model depends on both, so keep them
    fixed to reproduce a data directory. `workers` processes encode (0: one per core; 1: this
    process); the result does not depend on them. Shards hold `shard_pairs` pairs (the last one of a split fewer).

    Reuse instead of training: `spm_model` (+ `spm_model_tgt` for separate vocabularies) applies
    existing SentencePiece models; `pretokenized` takes tokenised, BPE-split text with a vocabulary
    from fairseq `dict` files (`dict_tgt` for the target side) or counted from the training text.
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
    workers: int = 0
    shard_pairs: int = 500_000
    chunk_lines: int = 10_000
    spm_model: str | None = None
    spm_model_tgt: str | None = None
    pretokenized: bool = False
    dict: str | None = None
    dict_tgt: str | None = None
    progress: bool | None = None  # None: a progress bar when stderr is a terminal

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
        if self.workers < 0 or self.shard_pairs < 1 or self.chunk_lines < 1:
            raise ConfigError("workers must be >= 0 (0: all cores), shard_pairs and chunk_lines >= 1")
        self._validate_reuse()

    def _validate_reuse(self) -> None:
        if self.spm_model and self.pretokenized:
            raise ConfigError("--spm-model and --pretokenized exclude each other: pre-tokenised text has its "
                              "vocabulary in a dict.txt (--dict) or counted from train")
        if self.spm_model_tgt and not self.spm_model:
            raise ConfigError("--spm-model-tgt needs --spm-model (the source model)")
        if (self.dict or self.dict_tgt) and not self.pretokenized:
            raise ConfigError("--dict / --dict-tgt are for --pretokenized text")
        if self.dict_tgt and not self.dict:
            raise ConfigError("--dict-tgt needs --dict (the source dictionary)")
        second = self.spm_model_tgt or self.dict_tgt
        if second and self.joint:
            raise ConfigError("a target model or dictionary means separate vocabularies; pass --separate-vocab")
        if not self.joint and (self.spm_model or self.dict) and not second:
            raise ConfigError("--separate-vocab with one model or dictionary: give the target one too "
                              "(--spm-model-tgt / --dict-tgt)")
        for path in (self.spm_model, self.spm_model_tgt, self.dict, self.dict_tgt):
            if path is not None and not Path(path).is_file():
                raise DataError(f"{path}: file not found")

    @property
    def vocabulary_kind(self) -> str:
        return "pretokenized" if self.pretokenized else "spm-model" if self.spm_model else "trained"

    def splits(self) -> list[tuple[str, str]]:
        """(split name, prefix) pairs: train, valid, then test, test1, test2, ..."""
        tests = [("test" if i == 0 else f"test{i}", prefix) for i, prefix in enumerate(self.test)]
        return [("train", self.train), ("valid", self.valid), *tests]

    def input_files(self, prefix: str) -> tuple[Path, Path]:
        return Path(f"{prefix}.{self.src_lang}"), Path(f"{prefix}.{self.tgt_lang}")

    def input_paths(self) -> list[Path]:
        """Both files of every split, in split order."""
        return [path for _, prefix in self.splits() for path in self.input_files(prefix)]

    def read_paths(self) -> list[Path]:
        """What `prepare` reads and its output would not hold again: `input_paths`, the fairseq dicts it reuses, and
        a reused SentencePiece model unless it sits where the output writes its (adapted) copy (`--spm-model
        data/spm.model --out data --force` re-prepares with the data's own vocabulary)."""
        rewritten = {"spm.model"} if self.joint else {"spm.src.model", "spm.tgt.model"}
        models = [Path(path) for path in (self.spm_model, self.spm_model_tgt) if path]
        kept = [path for path in models if not (path.name in rewritten and path.resolve().parent ==
                                                 Path(self.out).resolve())]
        dicts = [Path(path) for path in (self.dict, self.dict_tgt) if path]
        return self.input_paths() + kept + dicts

    def encoding_workers(self) -> int:
        return self.workers or os.cpu_count() or 1


@dataclass
class Split:
    """One split held in memory (the code task's `prepare` selects its pairs before writing)."""

    name: str
    prefix: str
    text: ParallelText
    keep: list[int]
    dropped: dict[str, int]
    ids: dict[str, list[list[int]]] = field(default_factory=dict)


@dataclass
class Scan:
    """What the first pass learnt: lines and non-empty pairs per split, the vocabulary's material."""

    lines: dict[str, int] = field(default_factory=dict)
    pairs: dict[str, int] = field(default_factory=dict)
    samples: dict[str, Reservoir] = field(default_factory=dict)
    words: dict[str, Counter[str]] = field(default_factory=dict)


def require_pairs(cfg: PrepareConfig, pairs: dict[str, int]) -> None:
    """DataError when a split (training, validation, a test set) has no non-empty pair; `pairs`: split -> count."""
    if pairs["train"] == 0:
        raise DataError(f"{cfg.train}.{{{cfg.src_lang},{cfg.tgt_lang}}}: no non-empty training pairs")
    require_valid_pairs(cfg, pairs["valid"])
    for name, prefix in cfg.splits()[2:]:
        if pairs.get(name) == 0:
            raise DataError(f"{prefix}.{{{cfg.src_lang},{cfg.tgt_lang}}}: no non-empty test pairs; each --test "
                            "needs at least one")


def build_data_dir(cfg: PrepareConfig, splits: list[Split], out: Path) -> dict[str, Any]:
    """Write splits held in memory (`keep`: the pairs to write, `dropped` counted so far) into `out`,
    with SentencePiece trained on the kept training pairs; returns the metadata."""
    scan = Scan()
    train = splits[0]
    sample_pairs(cfg, scan, [train.text.src.lines[i] for i in train.keep], [train.text.tgt.lines[i] for i in train.keep])
    streams = [(s.name, s.prefix, memory_chunks(s, cfg.chunk_lines), len(s.text)) for s in splits]
    extra = {s.name: s.dropped for s in splits}
    return write_data_dir(cfg, vocabulary_protos(cfg, scan), streams, out, dropped_before=extra,
                          total_lines=sum(len(s.keep) for s in splits))


# ----------------------------------------------------------------------------------------- checks


def check_inputs(cfg: PrepareConfig) -> None:
    """DataError naming the flag or the files when an input prefix is a directory or a file is missing."""
    for name, prefix in cfg.splits():
        if Path(prefix).is_dir() and not any(p.exists() for p in cfg.input_files(prefix)):
            flag = "--test" if name.startswith("test") else f"--{name}"
            raise DataError(f"{flag} {prefix}: is a directory; {flag} takes the files' PREFIX (PREFIX."
                            f"{cfg.src_lang} and PREFIX.{cfg.tgt_lang}){_prefixes_in(Path(prefix), cfg)}")
    files = cfg.input_paths()
    directories = [str(p) for p in files if p.is_dir()]
    if directories:
        raise DataError(f"input path(s) {', '.join(directories)}: is a directory, expected a text file PREFIX.LANG")
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise DataError(
            f"input file(s) not found: {', '.join(missing)} (files are named PREFIX.LANG, "
            f"e.g. {cfg.train}.{cfg.src_lang}; check the prefixes and --src/--tgt)"
        )
    for name, prefix in cfg.splits():
        src, tgt = cfg.input_files(prefix)
        if same_file(str(src), str(tgt)):
            raise DataError(f"{src} and {tgt} are the same file (a link?): the {name} split would translate its "
                            "text into itself")
    train = cfg.input_files(cfg.train)
    for name, prefix in cfg.splits()[1:]:
        if all(same_file(str(a), str(b)) for a, b in zip(cfg.input_files(prefix), train, strict=True)):
            log.warning("the %s split (%s) is the training data: its scores measure memorisation, not "
                        "translation", name, prefix)


def _prefixes_in(directory: Path, cfg: PrepareConfig) -> str:
    """", e.g. DIR/train or DIR/valid": the prefixes in `directory` that have both files, or ""."""
    found = sorted(str(p.with_suffix("")) for p in directory.glob(f"*.{cfg.src_lang}")
                   if p.with_suffix(f".{cfg.tgt_lang}").is_file())
    return f", e.g. {' or '.join(found[:3])}" if found else ""


def require_valid_pairs(cfg: PrepareConfig, valid: Split | int) -> None:
    """Refuse a validation split without a non-empty pair (an empty --valid file): training would stop
    at its first validation with nothing to average. `valid`: the split, or its non-empty pair count."""
    if (len(valid.keep) if isinstance(valid, Split) else valid) == 0:
        raise DataError(f"{cfg.valid}.{{{cfg.src_lang},{cfg.tgt_lang}}}: no non-empty validation pairs; "
                        "--valid needs at least one")


# ------------------------------------------------------------------------------------ reading


def memory_chunks(split: Split, size: int) -> Iterator[ParallelChunk]:
    """The kept pairs of a split held in memory, as chunks of `size` pairs."""
    for start in range(0, len(split.keep), size):
        picked = split.keep[start : start + size]
        yield ParallelChunk(start + 1, [split.text.src.lines[i] for i in picked],
                            [split.text.tgt.lines[i] for i in picked])


def sample_pairs(cfg: PrepareConfig, scan: Scan, src: list[str], tgt: list[str]) -> None:
    """Add training pairs to the vocabulary's material: word counts (pre-tokenised text without a
    dictionary) or the SentencePiece training sample (joint: half the sample from each side)."""
    if cfg.pretokenized:
        if cfg.dict is None:
            sides = {"src": src, "tgt": tgt}
            for side in SIDES:
                key = "src" if cfg.joint else side
                count_words(sides[side], scan.words.setdefault(key, Counter()))
        return
    if cfg.spm_model is not None:
        return
    if not scan.samples:
        k = cfg.spm_max_sentences
        caps = {"src": k - k // 2, "tgt": k // 2} if cfg.joint else {"src": k, "tgt": k}
        scan.samples = {side: Reservoir(caps[side], cfg.seed + i) for i, side in enumerate(SIDES)}
    scan.samples["src"].add(src)
    scan.samples["tgt"].add(tgt)


# ---------------------------------------------------------------------------------- vocabulary


def vocabulary_protos(cfg: PrepareConfig, scan: Scan) -> dict[str, bytes]:
    """The serialized SentencePiece model of each side (the same bytes when joint)."""
    if cfg.pretokenized:
        if cfg.dict is not None:
            protos = {"src": word_model(read_dict(cfg.dict))}
            protos["tgt"] = word_model(read_dict(cfg.dict_tgt)) if cfg.dict_tgt else protos["src"]
        else:
            protos = {side: word_model(ranked_words(scan.words["src" if cfg.joint else side])) for side in SIDES}
    elif cfg.spm_model is not None:
        protos = {"src": adapt_spm_model(cfg.spm_model)}
        protos["tgt"] = adapt_spm_model(cfg.spm_model_tgt) if cfg.spm_model_tgt else protos["src"]
    elif cfg.joint:
        protos = {"src": train_spm(cfg, scan.samples["src"].items + scan.samples["tgt"].items)}
        protos["tgt"] = protos["src"]
    else:
        protos = {side: train_spm(cfg, scan.samples[side].items) for side in SIDES}
    if cfg.joint:
        protos["tgt"] = protos["src"]
    return protos


# ------------------------------------------------------------------------------------- writing


Stream = tuple[str, str, Iterable[ParallelChunk], int | None]  # split, prefix, chunks, lines read (None: count)


def write_data_dir(cfg: PrepareConfig, protos: dict[str, bytes], streams: list[Stream], out: Path,
                   total_lines: int = 0, dropped_before: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """Pass 2: encode, filter and write every split into `out`, then data.json and report.md."""
    spm_files = {"src": "spm.model", "tgt": "spm.model"} if cfg.joint else \
        {"src": "spm.src.model", "tgt": "spm.tgt.model"}
    for side in SIDES:
        (out / spm_files[side]).write_bytes(protos[side])
    tokenizer = Tokenizer(protos["src"], protos["tgt"])
    processors = {"src": tokenizer.src, "tgt": tokenizer.tgt}
    vocab_size = {side: processors[side].get_piece_size() for side in SIDES}
    split_meta: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    non_empty: dict[str, int] = {}
    with ChunkEncoder(tokenizer, cfg.encoding_workers()) as encoder, \
            progress_bar(cfg.progress, total_lines, "prepare: encoding") as bar:
        for name, prefix, chunks, lines in streams:
            entry, stats[name], non_empty[name] = _write_split(cfg, name, chunks, encoder, out, bar,
                                                               (dropped_before or {}).get(name))
            split_meta[name] = {"prefix": prefix, **entry, "lines": entry["lines"] if lines is None else lines}
    require_pairs(cfg, non_empty)
    if split_meta["train"]["pairs"] == 0:
        raise DataError(
            f"{cfg.train}.*: every training pair was dropped by the length filters "
            f"(max_len={cfg.max_len}, max_len_ratio={cfg.max_len_ratio}); relax them"
        )
    tgt = processors["tgt"]
    meta: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "src_lang": cfg.src_lang,
        "tgt_lang": cfg.tgt_lang,
        "joint": cfg.joint,
        "vocabulary": cfg.vocabulary_kind,
        "spm": spm_files,
        "vocab_size": vocab_size,
        "special_ids": {"pad": tgt.pad_id(), "unk": tgt.unk_id(), "bos": tgt.bos_id(), "eos": tgt.eos_id()},
        "splits": split_meta,
        "fingerprint": fingerprint(out, spm_files, shard_names(split_meta)),
        "versions": {"multibranch": __version__, "sentencepiece": sentencepiece.__version__},
        "config": {k: v for k, v in to_dict(cfg).items() if k != "progress"},
    }
    (out / "data.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "report.md").write_text(_report(meta, stats, _vocabulary_line(meta, protos)), encoding="utf-8")
    return meta


def _write_split(cfg: PrepareConfig, name: str, chunks: Iterable[ParallelChunk], encoder: ChunkEncoder, out: Path,
                 bar: tqdm, dropped_before: dict[str, int] | None) -> tuple[dict[str, Any], dict[str, Any], int]:
    """Encode one split chunk by chunk into its text files and shards; (data.json entry, statistics, pairs
    with text on both sides)."""
    dropped = dict.fromkeys(DROP_REASONS if name == "train" else ("empty",), 0)
    for reason, n in (dropped_before or {}).items():
        dropped[reason] = dropped.get(reason, 0) + n
    replaced = {side: 0 for side in SIDES}
    processors = {"src": encoder.tokenizer.src, "tgt": encoder.tokenizer.tgt}
    writer = SplitWriter(out, name, cfg.shard_pairs, {side: processors[side].get_piece_size() for side in SIDES})
    filters = LengthFilter(cfg.max_len, cfg.max_len_ratio, cfg.ratio_allowance) if name == "train" else None
    lines_read = non_empty = 0
    try:
        for chunk, result in encoder.map(chunks, filters):
            lines_read += len(chunk)
            non_empty += result.non_empty
            for reason, n in result.drops.items():
                dropped[reason] += n
            for side, n in zip(SIDES, chunk.replaced, strict=True):
                replaced[side] += n
            lines = {"src": list(itertools.compress(chunk.src, result.keep)),
                     "tgt": list(itertools.compress(chunk.tgt, result.keep))}
            writer.add(lines, result.encoded)
            bar.update(len(chunk))
        shards = writer.close()
    except BaseException:
        writer.abort()
        raise
    stats = {side: writer.stats[side].summary(processors[side].unk_id()) for side in SIDES}
    entry = {
        "lines": lines_read,
        "pairs": sum(shard["pairs"] for shard in shards),
        "dropped": dropped,
        "replaced_lines": replaced,
        "tokens": {side: stats[side]["tokens"] for side in SIDES},
        "length": {side: stats[side]["length"] for side in SIDES},
        "unk_rate": {side: stats[side]["unk_rate"] for side in SIDES},
        "shards": shards,
    }
    return entry, stats, non_empty


def fingerprint(directory: Path, spm_files: dict[str, str], shards: list[str]) -> str:
    """sha256 over the SentencePiece model(s) and every shard's arrays (names and bytes), in order."""
    return hash_files(directory, sorted(set(spm_files.values())) + [name for stem in shards for name in shard_files(stem)])


# ---------------------------------------------------------------------------------------- report


def _vocabulary_line(meta: dict[str, Any], protos: dict[str, bytes]) -> str:
    """The report's line on the vocabulary actually used: the trained SentencePiece model (requested and
    got), the given model(s) (type and size) or the words of pre-tokenised text (dict.txt or counted)."""
    cfg = meta["config"]
    sharing = "joint" if meta["joint"] else "separate"
    sizes = f"src {meta['vocab_size']['src']} / tgt {meta['vocab_size']['tgt']}"
    files = ", ".join(sorted(set(meta["spm"].values())))
    if cfg["pretokenized"]:
        given = [path for path in (cfg["dict"], cfg["dict_tgt"]) if path]
        source = f"fairseq dict {' / '.join(given)}" if given else "counted from train"
        return f"- Vocabulary: words of pre-tokenised BPE text ({source}), {sharing}, {sizes} ids ({files})"
    if cfg["spm_model"]:
        models = []
        for side, path in (("src", cfg["spm_model"]), ("tgt", cfg["spm_model_tgt"])):
            if path:
                spec = model_pb2.ModelProto.FromString(protos[side]).trainer_spec
                kind = model_pb2.TrainerSpec.ModelType.Name(spec.model_type).lower()
                models.append(f"{path} ({kind}, {meta['vocab_size'][side]} pieces)")
        return f"- SentencePiece: given model {' / '.join(models)}, {sharing} vocabulary ({files})"
    return (f"- SentencePiece: {cfg['model_type']}, {sharing} vocabulary, requested {cfg['vocab_size']}, "
            f"got {sizes} ({files})")


def _report(meta: dict[str, Any], stats: dict[str, Any], vocabulary: str) -> str:
    """Human-readable summary of a prepared directory (Markdown); `vocabulary` is its vocabulary line."""
    cfg = meta["config"]
    lines = [
        f"# Prepared data: {meta['src_lang']} -> {meta['tgt_lang']}",
        "",
        vocabulary,
        "- Special ids: " + " ".join(f"{name}={i}" for name, i in meta["special_ids"].items()),
        f"- Vocabulary: {meta['vocabulary']}; shards per split: "
        + ", ".join(f"{name} {len(entry['shards'])}" for name, entry in meta["splits"].items()),
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
