"""Writing a prepared parallel split as memory-mappable shards, in bounded memory, with its statistics.

A split is one raw text file per side (`{split}.{side}.txt`, the kept lines) and one or more shards
(`{stem}.{side}.tokens.npy` int32 + `{stem}.{side}.offsets.npy` int64 [n+1]); shard k of split S has
the stem `S` (k = 0) or `S.k`. A shard is written once `shard_pairs` pairs are buffered, so memory holds
at most one shard's tokens (plus one chunk); lengths and id counts are kept as histograms, whose size does not grow with
the corpus. `binarise` gives the same tokens + offsets layout for id lists held in memory.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from multibranch.data.length_stats import histogram_stats

SIDES = ("src", "tgt")
ARRAY_KINDS = ("tokens", "offsets")


def shard_stem(split: str, index: int) -> str:
    """The file stem of shard `index` of `split`: `train`, `train.1`, `train.2`, ..."""
    return split if index == 0 else f"{split}.{index}"


def shard_files(stem: str) -> list[str]:
    """The array files of one shard, in fingerprint order."""
    return [f"{stem}.{side}.{kind}.npy" for side in SIDES for kind in ARRAY_KINDS]


def shard_names(splits: dict[str, Any]) -> list[str]:
    """Every shard stem of data.json's splits, in order (format version 1: one per split, the split's name)."""
    return [shard["name"] for name, entry in splits.items() for shard in entry.get("shards", [{"name": name}])]


def binarise(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated int32 tokens and int64 offsets [n+1]."""
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
    return tokens, offsets


class SideStats:
    """Length histogram and id counts of one side of a split."""

    def __init__(self, vocab_size: int) -> None:
        self.lengths = np.zeros(1, dtype=np.int64)
        self.ids = np.zeros(vocab_size, dtype=np.int64)

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        counts = np.bincount(lengths, minlength=len(self.lengths))
        counts[: len(self.lengths)] += self.lengths
        self.lengths = counts
        self.ids += np.bincount(tokens, minlength=len(self.ids))[: len(self.ids)]

    def summary(self, unk_id: int) -> dict[str, Any]:
        tokens = int(self.ids.sum())
        return {"length": histogram_stats(self.lengths), "unk_rate": float(self.ids[unk_id] / max(tokens, 1)),
                "types": int(np.count_nonzero(self.ids)), "tokens": tokens}


class SplitWriter:
    """Appends encoded pairs of one split to its text files and shards; `close()` lists the shards."""

    def __init__(self, out: Path, split: str, shard_pairs: int, vocab_sizes: dict[str, int]) -> None:
        self.out, self.split, self.shard_pairs = out, split, shard_pairs
        self.text: dict[str, BinaryIO] = {side: open(out / f"{split}.{side}.txt", "wb") for side in SIDES}
        self.buffers: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {side: [] for side in SIDES}
        self.buffered = 0
        self.shards: list[dict[str, Any]] = []
        self.stats = {side: SideStats(vocab_sizes[side]) for side in SIDES}

    def add(self, lines: dict[str, list[str]], encoded: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Kept pairs: raw lines and (tokens [N] int32, lengths [n] int64) per side; a shard is written
        each time `shard_pairs` pairs are buffered (so every shard but a split's last holds exactly that)."""
        for side in SIDES:
            if lines[side]:
                self.text[side].write(("\n".join(lines[side]) + "\n").encode("utf-8"))
            self.stats[side].add(*encoded[side])
        start, n = 0, len(lines["src"])
        while start < n:
            take = min(self.shard_pairs - self.buffered, n - start)
            for side in SIDES:
                tokens, lengths = encoded[side]
                first = int(lengths[:start].sum())
                part = lengths[start : start + take]
                self.buffers[side].append((tokens[first : first + int(part.sum())], part))
            self.buffered += take
            start += take
            if self.buffered == self.shard_pairs:
                self._flush()

    def _flush(self) -> None:
        stem = shard_stem(self.split, len(self.shards))
        for side in SIDES:
            parts = self.buffers[side]
            tokens = np.concatenate([t for t, _ in parts]) if parts else np.zeros(0, dtype=np.int32)
            lengths = np.concatenate([n for _, n in parts]) if parts else np.zeros(0, dtype=np.int64)
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            np.save(self.out / f"{stem}.{side}.tokens.npy", tokens.astype(np.int32, copy=False))
            np.save(self.out / f"{stem}.{side}.offsets.npy", offsets)
            self.buffers[side] = []
        self.shards.append({"name": stem, "pairs": self.buffered})
        self.buffered = 0

    def close(self) -> list[dict[str, Any]]:
        """Write the last shard (an empty split still gets one) and close the text files."""
        if self.buffered or not self.shards:
            self._flush()
        for handle in self.text.values():
            handle.close()
        return self.shards

    def abort(self) -> None:
        for handle in self.text.values():
            handle.close()
