"""Encoding a parallel corpus chunk by chunk in worker processes: in input order, with bounded memory.

`encode_chunk` does all the per-pair work of `prepare` after reading: dropping pairs with an empty side,
encoding both sides, the training length filters and flattening the ids into arrays. `ChunkEncoder` runs
it in `workers` processes (1: in this process), each with its own copy of the tokenizer and one
SentencePiece thread, keeping at most two chunks per worker in flight so memory stays bounded; results
come back in the order of the chunks, so the output does not depend on the number of workers.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from multibranch.data.text import ParallelChunk
from multibranch.data.tokenizer import Tokenizer

SIDES = ("src", "tgt")


@dataclass(frozen=True)
class LengthFilter:
    """The training filters: drop a pair longer than `max_len` tokens on a side, or with
    `max(ls, lt) > max_len_ratio * min(ls, lt) + ratio_allowance` (None disables either)."""

    max_len: int | None
    max_len_ratio: float | None
    ratio_allowance: int

    def drops(self, ls: np.ndarray, lt: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
        """The mask of pairs to keep, and the drops by reason (empty after encoding, too long, ratio)."""
        empty = (ls == 0) | (lt == 0)
        too_long = np.zeros_like(empty)
        if self.max_len is not None:
            too_long = ~empty & ((ls > self.max_len) | (lt > self.max_len))
        ratio = np.zeros_like(empty)
        if self.max_len_ratio is not None:
            ratio = ~empty & ~too_long & (np.maximum(ls, lt) > self.max_len_ratio * np.minimum(ls, lt)
                                          + self.ratio_allowance)
        drops = {"empty": int(empty.sum()), "too_long": int(too_long.sum()), "ratio": int(ratio.sum())}
        return ~(empty | too_long | ratio), drops


@dataclass
class EncodedChunk:
    """What to write of one chunk: `keep` [n] marks its pairs that stay, `encoded` their ids per side as
    (tokens [N] int32, lengths [kept] int64); `drops` by reason; `non_empty` pairs with text on both sides."""

    keep: np.ndarray
    encoded: dict[str, tuple[np.ndarray, np.ndarray]]
    drops: dict[str, int]
    non_empty: int


def flatten(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Id lists -> (tokens [N] int32, lengths [n] int64)."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
    return tokens, lengths


def encode_side(tokenizer: Tokenizer, side: str, lines: list[str]) -> list[list[int]]:
    """One side's ids: SentencePiece in one thread (the processes are the parallelism), or word lookup."""
    if not lines:
        return []
    if tokenizer.words[side] is not None:
        return tokenizer.encode_src(lines) if side == "src" else tokenizer.encode_tgt(lines)
    return (tokenizer.src if side == "src" else tokenizer.tgt).encode(lines, num_threads=1)


def encode_chunk(tokenizer: Tokenizer, src: list[str], tgt: list[str], filters: LengthFilter | None) -> EncodedChunk:
    """Drop pairs with an empty side, encode the rest, apply `filters` (training data) and flatten."""
    text = np.fromiter((bool(s.strip()) and bool(t.strip()) for s, t in zip(src, tgt, strict=True)),
                       dtype=bool, count=len(src))  # [n]
    kept = {"src": list(itertools.compress(src, text)), "tgt": list(itertools.compress(tgt, text))}
    encoded = {side: flatten(encode_side(tokenizer, side, kept[side])) for side in SIDES}
    drops = {"empty": len(src) - len(kept["src"])}
    keep = text
    if filters is not None:
        good, filtered = filters.drops(encoded["src"][1], encoded["tgt"][1])
        drops = {reason: drops.get(reason, 0) + n for reason, n in filtered.items()}
        if not good.all():
            for side in SIDES:
                tokens, lengths = encoded[side]
                encoded[side] = tokens[np.repeat(good, lengths)], lengths[good]  # np.repeat: [N] token kept?
            keep = text.copy()
            keep[np.flatnonzero(text)[~good]] = False
    return EncodedChunk(keep, encoded, drops, len(kept["src"]))


_WORKER: dict[str, Any] = {}  # the tokenizer of a worker process


def _start_worker(src_proto: bytes, tgt_proto: bytes) -> None:
    # Ctrl-C reaches the whole process group: the parent stops the pool (ChunkEncoder.__exit__), so a worker
    # finishes the chunk it holds instead of dying with it (a chunk lost in a dead worker is never answered)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Pool.terminate's SIGTERM ends a worker whatever it is doing: a handler inherited from the CLI is Python
    # code, which runs only when the worker next executes bytecode
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORKER["tokenizer"] = Tokenizer(src_proto, tgt_proto)


def _encode_in_worker(src: list[str], tgt: list[str], filters: LengthFilter | None) -> EncodedChunk:
    return encode_chunk(_WORKER["tokenizer"], src, tgt, filters)


def _worker_context() -> Any:
    """How the workers start: forked from the caller while it runs one thread (fast, and what a script without
    an `if __name__ == "__main__":` guard needs); from a fork server once it runs others (a server's engine,
    a progress bar's monitor), because a forked child can inherit a lock held by a thread it does not have,
    hang before its first chunk where no Python signal handler runs, and leave `Pool.terminate` waiting for
    it forever. The fork server is a single-threaded process that imported this module once."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


class ChunkEncoder:
    """`encode_chunk` over a stream of chunks in `workers` processes (a context manager).

    On leaving (normally, on an error in the input or on Ctrl-C) the chunks already handed to the workers are
    waited for before the pool is terminated: `Pool.terminate` joins the thread that feeds tasks into the
    workers' pipe, and with a chunk (megabytes) half sent to workers that were just killed that thread never
    returns: `prepare` hung on a bad line in about one run of four before this.
    """

    def __init__(self, tokenizer: Tokenizer, workers: int) -> None:
        self.tokenizer, self.workers = tokenizer, workers
        self.pool: Any = None
        self.pending: collections.deque = collections.deque()  # (chunk, AsyncResult) handed to the workers

    def __enter__(self) -> ChunkEncoder:
        if self.workers > 1:
            self.pool = _worker_context().Pool(self.workers, initializer=_start_worker,
                                     initargs=(self.tokenizer.src_proto, self.tokenizer.tgt_proto))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is None:
            return
        deadline = time.monotonic() + 120  # at most 2 chunks per worker: seconds of work, unless one died
        for _, result in self.pending:
            result.wait(max(0.0, deadline - time.monotonic()))
        self.pending.clear()
        self.pool.terminate()  # SIGTERM, which a worker's default handler obeys at once (`_start_worker`)
        self.pool.join()
        self.pool = None

    def map(self, chunks: Iterable[ParallelChunk], filters: LengthFilter | None
            ) -> Iterator[tuple[ParallelChunk, EncodedChunk]]:
        """(chunk, its encoding) in the order of `chunks`, reading ahead at most 2 chunks per worker."""
        if self.pool is None:
            for chunk in chunks:
                yield chunk, encode_chunk(self.tokenizer, chunk.src, chunk.tgt, filters)
            return
        pending = self.pending
        for chunk in chunks:
            pending.append((chunk, self.pool.apply_async(_encode_in_worker, (chunk.src, chunk.tgt, filters))))
            if len(pending) >= 2 * self.workers:
                done, result = pending.popleft()
                yield done, result.get()
        while pending:
            done, result = pending.popleft()
            yield done, result.get()
