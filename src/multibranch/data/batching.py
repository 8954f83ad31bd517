"""Token-budget batching (pure, deterministic) and collation into padded tensors.

`token_batches` sorts examples by length, fills batches greedily under a padded-token budget and
shuffles the batch order with a generator seeded by (seed, epoch): the batches of an epoch are a pure
function of (lengths, max_tokens, seed, epoch), so a resumed run only needs the epoch and the number
of batches already consumed. `sharded_token_batches` does the same for a split stored in several
shards, one shard at a time, so that a batch reads one shard's files. `shard_batches` splits them across
data-parallel ranks; `collate` turns one batch of indices into model inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from multibranch.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from multibranch.errors import DataError


class TokenPairs(Protocol):
    """A split of source/target token sequences stored flat (tasks/translation/dataset.py's ParallelSplit)."""

    src_tokens: np.ndarray  # [total source tokens]
    tgt_tokens: np.ndarray
    src_offsets: np.ndarray  # [N+1] sequence i is tokens[offsets[i]:offsets[i+1]] (no EOS)
    tgt_offsets: np.ndarray


@runtime_checkable
class ShardedPairs(Protocol):
    """A split stored in several TokenPairs (tasks/translation/dataset.py's ShardedSplit)."""

    def locate(self, indices: np.ndarray) -> tuple[TokenPairs, np.ndarray]:
        """(the TokenPairs holding the examples `indices`, their indices there)."""


def token_batches(
    src_lengths: Sequence[int] | np.ndarray,
    tgt_lengths: Sequence[int] | np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    max_sentences: int | None = None,
) -> list[np.ndarray]:
    """Group example indices into batches of at most `max_tokens` padded tokens.

    The padded size of a batch is `len(batch) * (max(src_len, tgt_len over the batch) + 1)`; the +1 is
    the EOS (source/target) or BOS (decoder input). Every index appears in exactly one batch.

    With `shuffle=True` examples are sorted by length with a random tie-break, and the batch order is
    shuffled, both from a generator seeded by (seed, epoch). With `shuffle=False` the order is fixed:
    length-sorted (ties by index), shortest batches first (validation, translation).
    """
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    if src.shape != tgt.shape or src.ndim != 1:
        raise ValueError(f"src_lengths {src.shape} and tgt_lengths {tgt.shape} must be equal 1-d arrays")
    if max_tokens < 1 or (max_sentences is not None and max_sentences < 1):
        raise ValueError(f"max_tokens={max_tokens} and max_sentences={max_sentences} must be >= 1")
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed={seed} and epoch={epoch} must be >= 0")
    n = len(src)
    if n == 0:
        return []
    sizes = np.maximum(src, tgt) + 1  # [n] padded length of each example
    too_big = np.flatnonzero(sizes > max_tokens)
    if len(too_big):
        i = int(too_big[0])
        raise DataError(
            f"example {i} has {int(sizes[i]) - 1} tokens (+1 for EOS) but max_tokens is {max_tokens} "
            f"({len(too_big)} example(s) do not fit); raise max_tokens or prepare with a smaller --max-len"
        )

    rng = np.random.default_rng([seed, epoch]) if shuffle else None
    if rng is not None:
        order = np.lexsort((rng.permutation(n), sizes))  # by size, random tie-break
    else:
        order = np.argsort(sizes, kind="stable")
    order = order.astype(index_dtype(n), copy=False)  # an epoch's plan holds every index once: 4 bytes each
    sorted_sizes = sizes[order]
    limit = max_sentences or n

    batches = []
    start = 0
    while start < n:
        # Sizes are non-decreasing, so the cost k * sizes[start + k - 1] grows with k: take the longest
        # prefix of the window that fits.
        window = min(max_tokens // int(sorted_sizes[start]), limit, n - start)
        cost = np.arange(1, window + 1) * sorted_sizes[start : start + window]
        k = int(np.count_nonzero(cost <= max_tokens))
        batches.append(order[start : start + k].copy())
        start += k
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def index_dtype(n: int) -> type[np.integer]:
    """The smallest of int32/int64 that holds example indices below n."""
    return np.int32 if n <= np.iinfo(np.int32).max else np.int64


def sharded_token_batches(
    shards: Sequence[tuple[np.ndarray, np.ndarray]],
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    max_sentences: int | None = None,
) -> list[np.ndarray]:
    """`token_batches` of a split stored in shards, given each shard's (src_lengths, tgt_lengths).

    Each shard is batched on its own (so a batch never spans two shards and reads one shard's files),
    with indices offset to run over all shards. `shards` may compute each shard's lengths when indexed
    (ShardedSplit.shard_lengths does): only one shard's lengths are then in memory at a time. The shards
    are visited in an order seeded by (seed, epoch) and, with `shuffle`, the batches of all shards are
    then shuffled together, so an epoch mixes
    the whole corpus rather than one shard after another. A pure function of (lengths, max_tokens,
    seed, epoch) like `token_batches`, which it equals for a single shard.
    """
    if len(shards) == 1:
        return token_batches(*shards[0], max_tokens, seed=seed, epoch=epoch, shuffle=shuffle,
                             max_sentences=max_sentences)
    starts = np.concatenate([[0], np.cumsum([len(shards[k][0]) for k in range(len(shards))])])  # [K+1]
    dtype = index_dtype(int(starts[-1]))
    rng = np.random.default_rng([seed, epoch, len(shards)])
    order = rng.permutation(len(shards)) if shuffle else np.arange(len(shards))
    batches = []
    for k in order:
        offset = dtype(starts[k])
        batches += [batch.astype(dtype, copy=False) + offset
                    for batch in token_batches(*shards[k], max_tokens, seed=seed, epoch=epoch, shuffle=shuffle,
                                               max_sentences=max_sentences)]
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def shard_batches(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """Batches of data-parallel `rank`: every `world_size`-th batch starting at `rank`.

    Every rank gets the same number of batches, `len(batches) // world_size`; the last
    `len(batches) % world_size` batches are dropped for this epoch so no rank waits for another
    (with shuffling, a different remainder is dropped each epoch).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    per_rank = len(batches) // world_size
    return batches[rank : per_rank * world_size : world_size]


@dataclass
class Batch:
    """Model inputs for one batch, right-padded with the pad id.

    src  [B, S] long: source ids + EOS
    prev [B, T] long: BOS + target ids (decoder input)
    tgt  [B, T] long: target ids + EOS (what the decoder must predict)
    """

    src: torch.Tensor
    prev: torch.Tensor
    tgt: torch.Tensor
    indices: np.ndarray  # [B] example indices into the split
    n_src_tokens: int  # non-pad source tokens, EOS included
    n_tgt_tokens: int  # non-pad target tokens, EOS included

    def __len__(self) -> int:
        return self.src.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return dataclasses.replace(
            self,
            src=self.src.to(device, non_blocking=non_blocking),
            prev=self.prev.to(device, non_blocking=non_blocking),
            tgt=self.tgt.to(device, non_blocking=non_blocking),
        )


def _gather(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, ...]:
    """Row, in-row position and value of every token of the sequences tokens[starts[b] : starts[b] + lengths[b]]."""
    total = int(lengths.sum())
    rows = np.repeat(np.arange(len(lengths)), lengths)  # [total]
    within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # [total] position in row
    values = tokens[np.repeat(starts, lengths) + within]  # [total]
    return rows, within, values


def collate(
    split: TokenPairs | ShardedPairs,
    indices: Sequence[int] | np.ndarray,
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> Batch:
    """Build the padded tensors of the examples `indices` of `split` (one numpy buffer, one torch view)."""
    idx = np.asarray(indices, dtype=np.int64)
    if idx.ndim != 1 or len(idx) == 0:
        raise ValueError("collate needs a non-empty 1-d list of indices")
    pairs, local = split.locate(idx) if isinstance(split, ShardedPairs) else (split, idx)
    bsz = len(idx)
    ends = np.stack([local, local + 1], axis=1)  # [B, 2] each example's offsets entries, read together
    src_start, src_end = np.asarray(pairs.src_offsets[ends], dtype=np.int64).T  # [B] each
    tgt_start, tgt_end = np.asarray(pairs.tgt_offsets[ends], dtype=np.int64).T  # [B] each
    src_len, tgt_len = src_end - src_start, tgt_end - tgt_start  # [B]
    s_max, t_max = int(src_len.max()) + 1, int(tgt_len.max()) + 1
    flat = np.full(bsz * s_max + 2 * bsz * t_max, pad_id, dtype=np.int64)
    src = flat[: bsz * s_max].reshape(bsz, s_max)  # [B, S]
    prev = flat[bsz * s_max : bsz * (s_max + t_max)].reshape(bsz, t_max)  # [B, T]
    tgt = flat[bsz * (s_max + t_max) :].reshape(bsz, t_max)  # [B, T]
    rows = np.arange(bsz)

    r, c, v = _gather(pairs.src_tokens, src_start, src_len)
    src[r, c] = v
    src[rows, src_len] = eos_id
    r, c, v = _gather(pairs.tgt_tokens, tgt_start, tgt_len)
    tgt[r, c] = v
    tgt[rows, tgt_len] = eos_id
    prev[r, c + 1] = v
    prev[:, 0] = bos_id

    buffer = torch.from_numpy(flat)
    n_src = bsz * s_max
    n_prev = bsz * t_max
    return Batch(
        src=buffer[:n_src].view(bsz, s_max),
        prev=buffer[n_src : n_src + n_prev].view(bsz, t_max),
        tgt=buffer[n_src + n_prev :].view(bsz, t_max),
        indices=idx,
        n_src_tokens=int(src_len.sum()) + bsz,
        n_tgt_tokens=int(tgt_len.sum()) + bsz,
    )
