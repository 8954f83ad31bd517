"""Token-budget batching (pure, deterministic) and collation into padded tensors.

`token_batches` sorts examples by length, fills batches greedily under a padded-token budget and
shuffles the batch order with a generator seeded by (seed, epoch): the batches of an epoch are a pure
function of (lengths, max_tokens, seed, epoch), so a resumed run only needs the epoch and the number
of batches already consumed. `sharded_token_batches` does the same for a split stored in several
shards, one shard at a time, so that a batch reads one shard's files. `shard_batches` splits them across
data-parallel ranks; `collate` turns one batch of indices into model inputs.

Fixed shapes (CUDA graphs): `length_buckets` picks a few padded lengths for the data (those that pad
the least, or at quantiles as fairseq's `num_batch_buckets`), each with a row count that fills the token
budget; `bucketed_token_batches` groups examples by bucket, and `collate(..., shape=buckets.shape(...))`
pads every batch to its bucket's (B, L, L), filler rows included, so an epoch has at most
`len(buckets.lengths)` batch shapes.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
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
    src, tgt = _lengths(src_lengths, tgt_lengths)
    if max_tokens < 1 or (max_sentences is not None and max_sentences < 1):
        raise ValueError(f"max_tokens={max_tokens} and max_sentences={max_sentences} must be >= 1")
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed={seed} and epoch={epoch} must be >= 0")
    n = len(src)
    if n == 0:
        return []
    sizes = np.maximum(src, tgt) + 1  # [n] padded length of each example
    _check_fits(sizes, max_tokens)

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


def _lengths(src_lengths, tgt_lengths) -> tuple[np.ndarray, np.ndarray]:
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    if src.shape != tgt.shape or src.ndim != 1:
        raise ValueError(f"src_lengths {src.shape} and tgt_lengths {tgt.shape} must be equal 1-d arrays")
    return src, tgt


def _check_fits(sizes: np.ndarray, max_tokens: int) -> None:
    """DataError naming the first example whose padded size is over max_tokens."""
    too_big = np.flatnonzero(sizes > max_tokens)
    if len(too_big):
        i = int(too_big[0])
        raise DataError(
            f"example {i} has {int(sizes[i]) - 1} tokens (+1 for EOS) but max_tokens is {max_tokens} "
            f"({len(too_big)} example(s) do not fit); raise max_tokens (--max-tokens) to at least "
            f"{int(sizes.max())}, or shorten or remove the longer examples"
        )


@dataclass(frozen=True)
class LengthBuckets:
    """Fixed batch shapes: bucket k holds examples of padded size (max(src, tgt) + 1) <= lengths[k];
    each of its batches is padded to rows[k] rows and lengths[k] positions (source and target alike)."""

    lengths: tuple[int, ...]  # increasing
    rows: tuple[int, ...]  # rows[k] = min(max_tokens // lengths[k], max_sentences or inf), >= 1

    def __post_init__(self) -> None:
        lengths, rows = tuple(int(x) for x in self.lengths), tuple(int(x) for x in self.rows)
        if not lengths or len(lengths) != len(rows):
            raise ValueError(f"LengthBuckets: lengths {lengths} and rows {rows} must be non-empty and equally long")
        if lengths[0] < 1 or any(a >= b for a, b in zip(lengths, lengths[1:])) or min(rows) < 1:
            raise ValueError(f"LengthBuckets: lengths {lengths} must increase from >= 1 and rows {rows} be >= 1")
        object.__setattr__(self, "lengths", lengths)
        object.__setattr__(self, "rows", rows)

    def bucket_of(self, size: int) -> int:
        """The smallest k with lengths[k] >= size (a padded size: tokens + 1); DataError if none."""
        k = int(np.searchsorted(self.lengths, size, side="left"))
        if k == len(self.lengths):
            raise DataError(f"a sequence of {size - 1} tokens (+1 for EOS) is longer than the longest length bucket "
                            f"({self.lengths[-1]}); build the buckets from data that includes it")
        return k

    def shape(self, src_max: int, tgt_max: int) -> tuple[int, int, int]:
        """(B, S, T) for a batch whose longest source / target have src_max / tgt_max tokens (without the +1):
        the bucket of max(src_max, tgt_max) + 1 -> (rows[k], lengths[k], lengths[k])."""
        k = self.bucket_of(max(int(src_max), int(tgt_max)) + 1)
        return self.rows[k], self.lengths[k], self.lengths[k]

    @property
    def shapes(self) -> list[tuple[int, int, int]]:
        """Every (B, S, T), one per bucket, shortest first."""
        return [(b, length, length) for b, length in zip(self.rows, self.lengths)]


def length_buckets(
    src_lengths: Sequence[int] | np.ndarray,
    tgt_lengths: Sequence[int] | np.ndarray,
    max_tokens: int,
    buckets: int,
    *,
    max_sentences: int | None = None,
    multiple: int = 8,
    method: str = "padding",
) -> LengthBuckets:
    """At most `buckets` fixed batch shapes for the padded sizes (max(src, tgt) + 1) of the data.

    Every boundary is a padded size of the data rounded up to a multiple of `multiple` (tensor-core
    friendly) but never above max_tokens, the last one >= the longest example, duplicates merged (so
    `buckets` is an upper bound on their number). rows[k] = min(max_tokens // lengths[k], max_sentences),
    so a bucket's batch holds at most max_tokens padded positions per side. A pure function of its inputs.

    method="padding" (default): the boundaries that pad an epoch of `bucketed_token_batches` the least
    (rows[k] * lengths[k] per batch, the short last batch of each bucket included: exact, by dynamic
    programming over the distinct rounded sizes; of equal choices, the fewest buckets).
    method="quantile": boundary k (k = 1..buckets) at the k/buckets quantile of the sizes (the lower data
    value, as fairseq's `get_buckets` for `num_batch_buckets`); simpler, but a long tail then shares the
    last bucket with much shorter examples.
    """
    if buckets < 1 or max_tokens < 1 or multiple < 1 or (max_sentences is not None and max_sentences < 1):
        raise ValueError(f"buckets={buckets}, max_tokens={max_tokens}, multiple={multiple} and "
                         f"max_sentences={max_sentences} must be >= 1")
    if method not in ("padding", "quantile"):
        raise ValueError(f"length_buckets: method={method!r}; choose 'padding' or 'quantile'")
    src, tgt = _lengths(src_lengths, tgt_lengths)
    if len(src) == 0:
        raise DataError("length_buckets: no examples to take bucket lengths from")
    sizes = np.maximum(src, tgt) + 1  # [n]
    _check_fits(sizes, max_tokens)
    limit = max_sentences or max_tokens

    def rounded(x: np.ndarray) -> np.ndarray:  # up to the multiple, capped at the budget
        return np.minimum(-(-x // multiple) * multiple, max_tokens)

    if method == "quantile":
        quantiles = np.quantile(sizes, np.arange(1, buckets + 1) / buckets, method="lower")  # [buckets]
        quantiles[-1] = sizes.max()  # exact, whatever the float arithmetic of the last quantile
        lengths = [int(x) for x in np.unique(rounded(quantiles.astype(np.int64)))]
    else:
        lengths = _least_padding(rounded(sizes), buckets, max_tokens, limit)
    return LengthBuckets(tuple(lengths), tuple(min(max_tokens // length, limit) for length in lengths))


def _least_padding(sizes: np.ndarray, buckets: int, max_tokens: int, limit: int) -> list[int]:
    """Increasing boundaries, at most `buckets` of them, all values of `sizes` (the last its maximum), that
    minimise an epoch's padded positions: sum over buckets of ceil(n_k / rows_k) * rows_k * L_k."""
    cands, counts = np.unique(sizes, return_counts=True)  # [V] each
    V = len(cands)
    before = np.concatenate([[0], np.cumsum(counts)])  # [V+1] examples below candidate p
    rows = np.minimum(max_tokens // cands, limit)  # [V]
    # best[p]: least cost of the examples below candidate p with the last boundary at p - 1 (p = 0: none)
    best = np.full(V + 1, np.inf)
    best[0] = 0.0
    choice = []  # per round, [V+1]: the previous boundary q (bucket = candidates q..p-1), or -1 for no change
    for _ in range(buckets):
        new = best.copy()
        took = np.full(V + 1, -1)
        for p in range(1, V + 1):
            n = before[p] - before[:p]  # [p] examples in the bucket q..p-1, for every q < p
            cost = best[:p] + -(-n // rows[p - 1]) * rows[p - 1] * cands[p - 1]  # [p]
            q = int(np.argmin(cost))
            if cost[q] < new[p]:  # strictly: a tie keeps fewer buckets
                new[p], took[p] = cost[q], q
        best = new
        choice.append(took)
    lengths, p = [], V
    for took in reversed(choice):
        if p == 0:
            break
        if took[p] >= 0:
            lengths.append(int(cands[p - 1]))
            p = int(took[p])
    return lengths[::-1]


def bucketed_token_batches(
    src_lengths: Sequence[int] | np.ndarray,
    tgt_lengths: Sequence[int] | np.ndarray,
    buckets: LengthBuckets,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """Batches whose padded shape is a bucket's (collate with `shape=buckets.shape(...)`).

    Examples are grouped by bucket and each group is cut into batches of rows[k] examples (the last one
    of a group may be shorter; collate fills it up with filler rows). With `shuffle` the order within a
    group is random and the batches of all groups are shuffled together, from a generator seeded by
    (seed, epoch); without, examples are length-sorted (ties by index) and the batches run shortest
    bucket first. Every index appears in exactly one batch. A pure function like `token_batches`.
    """
    src, tgt = _lengths(src_lengths, tgt_lengths)
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed={seed} and epoch={epoch} must be >= 0")
    n = len(src)
    if n == 0:
        return []
    sizes = np.maximum(src, tgt) + 1  # [n]
    bucket = np.searchsorted(np.asarray(buckets.lengths), sizes, side="left")  # [n] smallest fitting bucket
    too_long = np.flatnonzero(bucket == len(buckets.lengths))
    if len(too_long):
        i = int(too_long[0])
        raise DataError(f"example {i} has {int(sizes[i]) - 1} tokens (+1 for EOS) but the longest length bucket "
                        f"is {buckets.lengths[-1]} ({len(too_long)} example(s) do not fit); build the buckets "
                        f"with length_buckets from the lengths of this data")
    rng = np.random.default_rng([seed, epoch]) if shuffle else None
    if rng is not None:
        order = np.lexsort((rng.permutation(n), bucket))  # grouped by bucket, random within
    else:
        order = np.argsort(sizes, kind="stable")  # length-sorted, hence grouped by bucket
    order = order.astype(index_dtype(n), copy=False)
    counts = np.bincount(bucket, minlength=len(buckets.lengths))  # [K]
    batches = []
    start = 0
    for count, rows in zip(counts.tolist(), buckets.rows):
        batches += [order[a : min(a + rows, start + count)].copy() for a in range(start, start + count, rows)]
        start += count
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def batch_shapes(
    batches: Sequence[np.ndarray],
    src_lengths: Sequence[int] | np.ndarray,
    tgt_lengths: Sequence[int] | np.ndarray,
    buckets: LengthBuckets | None,
) -> Counter[tuple[int, int, int]]:
    """How many batches have each padded shape (B, S, T): the bucket's shape, or with `buckets=None` the
    batch's own (its size, longest source + 1, longest target + 1), as `collate` without `shape` pads it."""
    src, tgt = _lengths(src_lengths, tgt_lengths)
    shapes: Counter[tuple[int, int, int]] = Counter()
    for batch in batches:
        s, t = int(src[batch].max()), int(tgt[batch].max())
        shapes[buckets.shape(s, t) if buckets is not None else (len(batch), s + 1, t + 1)] += 1
    return shapes


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
    buckets: LengthBuckets | None = None,
) -> list[np.ndarray]:
    """`token_batches` of a split stored in shards, given each shard's (src_lengths, tgt_lengths).

    Each shard is batched on its own (so a batch never spans two shards and reads one shard's files),
    with indices offset to run over all shards. `shards` may compute each shard's lengths when indexed
    (ShardedSplit.shard_lengths does): only one shard's lengths are then in memory at a time. The shards
    are visited in an order seeded by (seed, epoch) and, with `shuffle`, the batches of all shards are
    then shuffled together, so an epoch mixes
    the whole corpus rather than one shard after another. A pure function of (lengths, max_tokens,
    seed, epoch) like `token_batches`, which it equals for a single shard.

    With `buckets` (from `length_buckets` at the same max_tokens / max_sentences), each shard is batched
    with `bucketed_token_batches` instead (each shard then ends each bucket with its own short batch).
    """
    if buckets is not None:
        over = [shape for shape in buckets.shapes if shape[0] * shape[1] > max_tokens
                or (max_sentences is not None and shape[0] > max_sentences)]
        if over:
            raise ValueError(f"buckets with shapes {over} exceed max_tokens={max_tokens} / "
                             f"max_sentences={max_sentences}; build them with length_buckets at these values")

    def batched(k: int) -> list[np.ndarray]:
        if buckets is not None:
            return bucketed_token_batches(*shards[k], buckets, seed=seed, epoch=epoch, shuffle=shuffle)
        return token_batches(*shards[k], max_tokens, seed=seed, epoch=epoch, shuffle=shuffle,
                             max_sentences=max_sentences)

    if len(shards) == 1:
        return batched(0)
    starts = np.concatenate([[0], np.cumsum([len(shards[k][0]) for k in range(len(shards))])])  # [K+1]
    dtype = index_dtype(int(starts[-1]))
    rng = np.random.default_rng([seed, epoch, len(shards)])
    order = rng.permutation(len(shards)) if shuffle else np.arange(len(shards))
    batches = []
    for k in order:
        offset = dtype(starts[k])
        batches += [batch.astype(dtype, copy=False) + offset for batch in batched(k)]
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

    With a fixed shape (`collate(..., shape=...)`) the last B - len(indices) rows are fillers (src EOS,
    prev BOS, tgt all pad): `len(batch)` is B, `len(batch.indices)` the number of real examples.
    """

    src: torch.Tensor
    prev: torch.Tensor
    tgt: torch.Tensor
    indices: np.ndarray  # [n <= B] example indices into the split, one per real row
    n_src_tokens: int  # non-pad source tokens of the real rows, EOS included
    n_tgt_tokens: int  # non-pad target tokens of the real rows, EOS included

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
    shape: tuple[int, int, int] | None = None,
) -> Batch:
    """Build the padded tensors of the examples `indices` of `split` (one numpy buffer, one torch view).

    Without `shape` the tensors are [n, longest source + 1] and [n, longest target + 1]. With
    `shape=(B, S, T)` (`LengthBuckets.shape`) they are exactly [B, S] and [B, T]: the n real rows, then
    B - n filler rows (src = EOS then pad, prev = BOS then pad, tgt = all pad), so that no attention row
    is fully masked and the loss, which ignores pad targets, gives the fillers no weight.
    """
    idx = np.asarray(indices, dtype=np.int64)
    if idx.ndim != 1 or len(idx) == 0:
        raise ValueError("collate needs a non-empty 1-d list of indices")
    pairs, local = split.locate(idx) if isinstance(split, ShardedPairs) else (split, idx)
    n = len(idx)
    ends = np.stack([local, local + 1], axis=1)  # [n, 2] each example's offsets entries, read together
    src_start, src_end = np.asarray(pairs.src_offsets[ends], dtype=np.int64).T  # [n] each
    tgt_start, tgt_end = np.asarray(pairs.tgt_offsets[ends], dtype=np.int64).T  # [n] each
    src_len, tgt_len = src_end - src_start, tgt_end - tgt_start  # [n]
    s_need, t_need = int(src_len.max()) + 1, int(tgt_len.max()) + 1
    if shape is None:
        bsz, s_max, t_max = n, s_need, t_need
    else:
        bsz, s_max, t_max = (int(x) for x in shape)
        if n > bsz:
            raise ValueError(f"collate: {n} examples do not fit a batch shape of {bsz} rows {tuple(shape)}")
        if s_need > s_max or t_need > t_max:
            raise ValueError(f"collate: the longest source / target need {s_need} / {t_need} positions (+1 for "
                             f"EOS/BOS) but the batch shape {tuple(shape)} has {s_max} / {t_max}")
    flat = np.full(bsz * s_max + 2 * bsz * t_max, pad_id, dtype=np.int64)
    src = flat[: bsz * s_max].reshape(bsz, s_max)  # [B, S]
    prev = flat[bsz * s_max : bsz * (s_max + t_max)].reshape(bsz, t_max)  # [B, T]
    tgt = flat[bsz * (s_max + t_max) :].reshape(bsz, t_max)  # [B, T]
    rows = np.arange(n)

    r, c, v = _gather(pairs.src_tokens, src_start, src_len)
    src[r, c] = v
    src[rows, src_len] = eos_id
    src[n:, 0] = eos_id  # filler rows (none without shape)
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
        n_src_tokens=int(src_len.sum()) + n,
        n_tgt_tokens=int(tgt_len.sum()) + n,
    )
