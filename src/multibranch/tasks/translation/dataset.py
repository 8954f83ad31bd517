"""Loading a directory written by `prepare`: metadata, tokenizer, and splits read on demand.

    data = PreparedData.load("runs/m30k/data")
    train = data.split("train")
    train.src(0), train.tgt(0)          # int32 id arrays without EOS (read from the shard's file)
    train.src_lengths                   # int64 [n], lengths without EOS
    data.tokenizer().decode_tgt([train.tgt(0).tolist()])

A split of one shard is a `ParallelSplit`; a split of several (a large corpus) is a `ShardedSplit`
over one `ParallelSplit` per shard, with the same interface: example indices run over all shards, and
`shard_lengths()` gives the per-shard lengths that `sharded_token_batches` batches shard by shard. Every
shard named in data.json must be present and whole, or `load`/`split` refuses it by name; a shard's offsets must
increase from 0 to its token count and its ids lie inside the vocabulary (`ParallelSplit.check_*`: a split of one
shard when it is loaded, a shard of several when its lengths or tokens are first read). A loaded shard's
arrays are `NpyFile`s: read with `pread` as batches need them, never memory-mapped, so a process's memory
does not grow with the corpus it trains on (docs/scale.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from multibranch.data.meta import read_meta
from multibranch.data.npy_file import NpyFile
from multibranch.data.parallel_prepare import FORMAT, READABLE_VERSIONS, fingerprint
from multibranch.data.shards import SIDES, shard_names
from multibranch.data.text import read_lines
from multibranch.data.tokenizer import Tokenizer
from multibranch.errors import DataError


class RawText:
    """The kept raw lines of a split (`{split}.{side}.txt`), read on demand."""

    name: str
    raw_paths: tuple[Path, Path] | None

    def __len__(self) -> int:
        raise NotImplementedError

    def raw_src_lines(self) -> list[str]:
        """The cleaned source text of this split, one line per example."""
        return self._raw(0)

    def raw_tgt_lines(self) -> list[str]:
        """The cleaned target text (BLEU references), one line per example."""
        return self._raw(1)

    def _raw(self, side: int) -> list[str]:
        if self.raw_paths is None:
            raise DataError(f"split {self.name!r} has no raw text (it was built in memory)")
        lines = read_lines(self.raw_paths[side]).lines
        if len(lines) != len(self):
            raise DataError(
                f"{self.raw_paths[side]}: {len(lines)} lines but the split has {len(self)} examples; "
                "the data directory is corrupted, run prepare again"
            )
        return lines


@dataclass
class ParallelSplit(RawText):
    """One split: concatenated token arrays with offsets per side (sentence i = tokens[off[i]:off[i+1]]);
    in memory (`from_sequences`) or read from a prepared shard's files (`NpyFile`)."""

    name: str
    src_tokens: np.ndarray | NpyFile  # [N_src] int32
    src_offsets: np.ndarray | NpyFile  # [n+1] int64
    tgt_tokens: np.ndarray | NpyFile  # [N_tgt] int32
    tgt_offsets: np.ndarray | NpyFile  # [n+1] int64
    raw_paths: tuple[Path, Path] | None = None
    vocab_sizes: tuple[int, int] | None = None  # (src, tgt) of a prepared shard: its ids are checked against them
    offsets_checked: bool = field(default=False, repr=False)
    ids_checked: bool = field(default=False, repr=False)

    def check_offsets(self) -> None:
        """DataError naming the file when an offsets array of a prepared shard does not increase (read once)."""
        if self.offsets_checked or self.vocab_sizes is None:
            return
        for offsets in (self.src_offsets, self.tgt_offsets):
            values = np.asarray(offsets)
            falls = np.flatnonzero(np.diff(values) < 0)
            if len(falls):
                i = int(falls[0])
                raise DataError(f"{_where(offsets, self.name)}: corrupted (offsets decrease: entry {i + 1} is "
                                f"{int(values[i + 1])} after {int(values[i])}); run `multibranch prepare` again")
        self.offsets_checked = True

    def check_ids(self) -> None:
        """DataError naming the file when a prepared shard holds a token id outside its vocabulary (read once, in
        chunks)."""
        if self.ids_checked or self.vocab_sizes is None:
            return
        for tokens, vocab in ((self.src_tokens, self.vocab_sizes[0]), (self.tgt_tokens, self.vocab_sizes[1])):
            for start in range(0, len(tokens), ID_CHUNK):
                chunk = np.asarray(tokens[start : start + ID_CHUNK])
                bad = np.flatnonzero((chunk < 0) | (chunk >= vocab))
                if len(bad):
                    raise DataError(f"{_where(tokens, self.name)}: corrupted (token {start + int(bad[0])} has id "
                                    f"{int(chunk[bad[0]])}, outside the vocabulary of {vocab} ids); run "
                                    "`multibranch prepare` again")
        self.ids_checked = True

    @cached_property
    def src_lengths(self) -> np.ndarray:  # [n] int64
        return np.diff(np.asarray(self.src_offsets)).astype(np.int64, copy=False)

    @cached_property
    def tgt_lengths(self) -> np.ndarray:  # [n] int64
        return np.diff(np.asarray(self.tgt_offsets)).astype(np.int64, copy=False)

    def shard_lengths(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """[(src_lengths, tgt_lengths)]: one shard."""
        return [(self.src_lengths, self.tgt_lengths)]

    @classmethod
    def from_sequences(cls, src: list[list[int]], tgt: list[list[int]], name: str = "memory") -> ParallelSplit:
        """An in-memory split (tests, small tasks); the id lists must not contain BOS/EOS."""
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source vs {len(tgt)} target sequences")

        def pack(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
            offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
            np.cumsum([len(s) for s in seqs], out=offsets[1:])
            tokens = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
            return tokens, offsets

        return cls(name, *pack(src), *pack(tgt))

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def src(self, i: int) -> np.ndarray:
        return _sequence(self.src_tokens, self.src_offsets, i)

    def tgt(self, i: int) -> np.ndarray:
        return _sequence(self.tgt_tokens, self.tgt_offsets, i)


ID_CHUNK = 1 << 24  # token ids checked per read (64 MiB of int32)


def _where(array: np.ndarray | NpyFile, name: str) -> str:
    """The file of a prepared shard's array (an in-memory one: the split's name)."""
    return str(getattr(array, "path", name))


def _sequence(tokens: np.ndarray | NpyFile, offsets: np.ndarray | NpyFile, i: int) -> np.ndarray:
    """Sequence i: both its offsets in one read, then its tokens."""
    start, end = offsets[i : i + 2]
    return tokens[start:end]


class ShardLengths(Sequence[tuple[np.ndarray, np.ndarray]]):
    """(src_lengths, tgt_lengths) of shard k, computed from its offsets file when indexed."""

    def __init__(self, shards: list[ParallelSplit]) -> None:
        self.shards = shards

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        shard = self.shards[k]
        shard.check_offsets()
        return np.diff(np.asarray(shard.src_offsets)), np.diff(np.asarray(shard.tgt_offsets))


class ShardedSplit(RawText):
    """A split stored in several shards: example i is example i - starts[k] of shard k."""

    def __init__(self, name: str, shards: list[ParallelSplit], raw_paths: tuple[Path, Path] | None = None) -> None:
        self.name, self.shards, self.raw_paths = name, shards, raw_paths
        self.starts = np.zeros(len(shards) + 1, dtype=np.int64)  # [K+1]
        np.cumsum([len(shard) for shard in shards], out=self.starts[1:])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def shard_lengths(self) -> ShardLengths:
        """(src_lengths, tgt_lengths) of every shard, each computed when indexed (never all in memory)."""
        return ShardLengths(self.shards)

    @cached_property
    def src_lengths(self) -> np.ndarray:  # [n] int64 over all shards
        return np.concatenate([src for src, _ in self.shard_lengths()])

    @cached_property
    def tgt_lengths(self) -> np.ndarray:  # [n] int64 over all shards
        return np.concatenate([tgt for _, tgt in self.shard_lengths()])

    def _shard_of(self, i: int) -> tuple[ParallelSplit, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"example {i} of a split of {len(self)}")
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        self.shards[k].check_ids()
        return self.shards[k], i - int(self.starts[k])

    def src(self, i: int) -> np.ndarray:
        shard, j = self._shard_of(i)
        return shard.src(j)

    def tgt(self, i: int) -> np.ndarray:
        shard, j = self._shard_of(i)
        return shard.tgt(j)

    def locate(self, indices: np.ndarray) -> tuple[ParallelSplit, np.ndarray]:
        """The examples `indices` as (a split, indices into it): the shard itself when they all lie in one
        (the batches of `sharded_token_batches` do), else a small in-memory copy of just those examples."""
        shard_ids = np.searchsorted(self.starts, indices, side="right") - 1  # [B]
        if (shard_ids == shard_ids[0]).all():
            k = int(shard_ids[0])
            self.shards[k].check_ids()
            return self.shards[k], np.asarray(indices) - self.starts[k]
        picked = [int(i) for i in indices]
        copy = ParallelSplit.from_sequences([self.src(i).tolist() for i in picked],
                                            [self.tgt(i).tolist() for i in picked], self.name)
        return copy, np.arange(len(picked))


class PreparedData:
    """A prepared data directory (see `multibranch.data.parallel_prepare` for the layout)."""

    def __init__(self, directory: Path, meta: dict[str, Any]) -> None:
        self.directory = directory
        self.meta = meta
        self._splits: dict[str, ParallelSplit | ShardedSplit] = {}

    @classmethod
    def load(cls, directory: str | Path) -> PreparedData:
        directory = Path(directory)
        meta = read_meta(directory, FORMAT, READABLE_VERSIONS, ("spm", "splits", "fingerprint", "vocab_size"),
                         "multibranch")
        for name in sorted(set(meta["spm"].values())):
            if not (directory / name).is_file():
                raise DataError(f"{directory / name}: missing; run `multibranch prepare` again")
        return cls(directory, meta)

    @property
    def fingerprint(self) -> str:
        return self.meta["fingerprint"]

    @property
    def split_names(self) -> list[str]:
        return list(self.meta["splits"])

    def verify(self) -> None:
        """Recompute the fingerprint from the files; DataError if they changed since `prepare`."""
        for name in self.split_names:
            self.split(name)  # every shard present and whole, or a DataError naming it
        actual = fingerprint(self.directory, self.meta["spm"], shard_names(self.meta["splits"]))
        if actual != self.fingerprint:
            raise DataError(f"{self.directory}: files do not match data.json's fingerprint; run prepare again")

    def tokenizer(self):
        """The `Tokenizer` of this data (SentencePiece model(s) written by prepare)."""

        spm = self.meta["spm"]
        tgt = None if spm["tgt"] == spm["src"] else self.directory / spm["tgt"]
        return Tokenizer.from_files(self.directory / spm["src"], tgt)

    def split(self, name: str) -> ParallelSplit | ShardedSplit:
        if name not in self.meta["splits"]:
            raise DataError(f"{self.directory}: no split {name!r}; available: {', '.join(self.split_names)}")
        if name not in self._splits:
            entry = self.meta["splits"][name]
            listed = entry.get("shards", [{"name": name, "pairs": entry.get("pairs")}])  # version 1: one shard
            shards = [self._load_shard(shard["name"], shard["pairs"]) for shard in listed]
            raw = (self.directory / f"{name}.src.txt", self.directory / f"{name}.tgt.txt")
            if len(shards) == 1:
                shards[0].check_offsets()
                shards[0].check_ids()
                shards[0].name, shards[0].raw_paths = name, raw
                self._splits[name] = shards[0]
            else:
                self._splits[name] = ShardedSplit(name, shards, raw)
        return self._splits[name]

    def _load_shard(self, stem: str, pairs: int) -> ParallelSplit:
        """The arrays of one shard (read on demand); DataError naming the file when missing or truncated."""
        arrays = {}
        for side in SIDES:
            for kind in ("tokens", "offsets"):
                path = self.directory / f"{stem}.{side}.{kind}.npy"
                if not path.is_file():
                    raise DataError(f"{path}: missing; run `multibranch prepare` again")
                try:
                    arrays[f"{side}_{kind}"] = NpyFile.open(path)
                except (ValueError, OSError) as err:
                    raise DataError(f"{path}: corrupted or truncated ({err}); run `multibranch prepare` again") from None
        for side in SIDES:
            tokens, offsets = arrays[f"{side}_tokens"], arrays[f"{side}_offsets"]
            ok = (
                tokens.ndim == 1 and offsets.ndim == 1 and len(offsets) == pairs + 1
                and np.issubdtype(tokens.dtype, np.integer) and np.issubdtype(offsets.dtype, np.integer)
                and int(offsets[0]) == 0 and int(offsets[-1]) == len(tokens)
            )
            if not ok:
                raise DataError(
                    f"{self.directory}/{stem}.{side}.*.npy: corrupted (shape/offsets do not match data.json); "
                    "run `multibranch prepare` again"
                )
        sizes = self.meta["vocab_size"]
        vocab = (sizes["src"], sizes["tgt"]) if isinstance(sizes, dict) else (int(sizes), int(sizes))
        return ParallelSplit(stem, **arrays, vocab_sizes=vocab)
