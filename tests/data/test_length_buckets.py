"""Fixed-shape batching: `length_buckets`, `bucketed_token_batches`, `batch_shapes`, `collate(shape=...)`
and `sharded_token_batches(buckets=...)`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from multibranch.data.batching import (
    LengthBuckets,
    batch_shapes,
    bucketed_token_batches,
    collate,
    length_buckets,
    sharded_token_batches,
    token_batches,
)
from multibranch.errors import DataError
from multibranch.tasks.translation.dataset import ParallelSplit

PAD, BOS, EOS = 0, 2, 3
SRC, TGT = np.arange(1, 11), np.zeros(10, dtype=np.int64)  # padded sizes 2..11


def _lists(batches):
    return [b.tolist() for b in batches]


def test_quantile_boundaries_and_rows_by_hand():
    def q(*args, **kwargs):
        return length_buckets(*args, method="quantile", **kwargs)

    # sizes 2..11; quantiles (lower) at 1/2 -> 6, at 1 -> 11
    assert q(SRC, TGT, 64, 2, multiple=1) == LengthBuckets((6, 11), (10, 5))
    assert q(SRC, TGT, 64, 2, multiple=4) == LengthBuckets((8, 12), (8, 5))
    assert q(SRC, TGT, 64, 2, multiple=4, max_sentences=6) == LengthBuckets((8, 12), (6, 5))
    # quartiles 4, 6, 8, 11; target lengths count as much as source lengths
    assert q(TGT, SRC, 64, 4, multiple=1) == LengthBuckets((4, 6, 8, 11), (16, 10, 8, 5))
    # duplicates merged after rounding: 100 buckets asked, two lengths left
    assert q(SRC, TGT, 64, 100) == LengthBuckets((8, 16), (8, 4))
    # rounding never goes past the budget: size 11 would round to 16
    assert q(SRC, TGT, 13, 1) == LengthBuckets((13,), (1,))


def test_least_padding_boundaries_by_hand():
    # four examples of size 2, two of size 10, budget 20: one bucket (10) pads 3 batches * 2 * 10 = 60
    # positions; (2, 10) pads 1 * 10 * 2 + 1 * 2 * 10 = 40; more buckets cannot do better
    src = np.array([1, 1, 1, 1, 9, 9])
    assert length_buckets(src, 0 * src, 20, 1, multiple=1) == LengthBuckets((10,), (2,))
    assert length_buckets(src, 0 * src, 20, 2, multiple=1) == LengthBuckets((2, 10), (10, 2))
    assert length_buckets(src, 0 * src, 20, 5, multiple=1) == LengthBuckets((2, 10), (10, 2))
    # sizes 2..11 at budget 64: one bucket (11, 5 rows) pads 2 * 5 * 11 = 110; any split pads more
    # (filler rows of two short batches), so one bucket it is, even when 4 are allowed
    assert length_buckets(SRC, TGT, 64, 4, multiple=1) == LengthBuckets((11,), (5,))
    # budget 13, one row a batch: sizes 2..7 rounded up to 8, 8..11 to 16 capped at 13 (6 * 8 + 4 * 13 = 100)
    assert length_buckets(SRC, TGT, 13, 3) == LengthBuckets((8, 13), (1, 1))


def _epoch_padding(src, tgt, buckets) -> int:
    shapes = batch_shapes(bucketed_token_batches(src, tgt, buckets, seed=0, epoch=0), src, tgt, buckets)
    return sum(count * b * length for (b, length, _), count in shapes.items())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=60), st.integers(41, 300), st.integers(1, 4),
       st.integers(1, 8))
def test_least_padding_is_optimal_by_brute_force(lengths, max_tokens, count, multiple):
    from itertools import combinations

    src = np.array(lengths)
    tgt = np.zeros_like(src)
    chosen = length_buckets(src, tgt, max_tokens, count, multiple=multiple)
    assert len(chosen.lengths) <= count
    cands = sorted({min(-(-(s + 1) // multiple) * multiple, max_tokens) for s in lengths})
    best = min(_epoch_padding(src, tgt, LengthBuckets((*rest, cands[-1]), tuple(max_tokens // x for x in
                                                                                  (*rest, cands[-1]))))
               for k in range(count) for rest in combinations(cands[:-1], k))
    assert _epoch_padding(src, tgt, chosen) == best
    assert _epoch_padding(src, tgt, length_buckets(src, tgt, max_tokens, count, multiple=multiple,
                                                   method="quantile")) >= best


def test_bucket_of_shape_and_shapes():
    b = LengthBuckets((8, 16, 32), (16, 8, 4))
    assert [b.bucket_of(s) for s in (1, 8, 9, 16, 17, 32)] == [0, 0, 1, 1, 2, 2]
    assert b.shape(7, 0) == (16, 8, 8)  # 7 tokens + 1 = 8 fits bucket 0
    assert b.shape(3, 8) == (8, 16, 16)  # the target decides: 8 + 1 = 9
    assert b.shapes == [(16, 8, 8), (8, 16, 16), (4, 32, 32)]
    with pytest.raises(DataError, match="32 tokens .* longest length bucket \\(32\\)"):
        b.bucket_of(33)
    with pytest.raises(ValueError):
        LengthBuckets((8, 8), (1, 1))  # not increasing
    with pytest.raises(ValueError):
        LengthBuckets((8,), (0,))


def test_batches_by_hand():
    b = LengthBuckets((8, 12), (3, 2))
    assert _lists(bucketed_token_batches(SRC, TGT, b, seed=0, epoch=0, shuffle=False)) == \
        [[0, 1, 2], [3, 4, 5], [6], [7, 8], [9]]
    shuffled = bucketed_token_batches(SRC, TGT, b, seed=0, epoch=0)
    assert sorted(map(len, shuffled)) == [1, 1, 2, 3, 3]
    assert batch_shapes(shuffled, SRC, TGT, b) == {(3, 8, 8): 3, (2, 12, 12): 2}
    # without buckets: each batch's own shape
    assert batch_shapes([np.array([0, 3]), np.array([9])], SRC, TGT + 1, None) == {(2, 5, 2): 1, (1, 11, 2): 1}


def _random(n: int, seed: int, top: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, top, n), rng.integers(0, top, n)


def test_every_index_once_seeded_and_each_batch_fits_its_bucket():
    src, tgt = _random(2000, 1)
    buckets = length_buckets(src, tgt, 1024, 6)
    assert len(buckets.lengths) <= 6 and buckets.lengths[-1] >= int(np.maximum(src, tgt).max()) + 1
    assert all(length % 8 == 0 for length in buckets.lengths)
    a = bucketed_token_batches(src, tgt, buckets, seed=3, epoch=1)
    assert sorted(np.concatenate(a).tolist()) == list(range(2000))
    assert _lists(a) == _lists(bucketed_token_batches(src, tgt, buckets, seed=3, epoch=1))
    assert _lists(a) != _lists(bucketed_token_batches(src, tgt, buckets, seed=3, epoch=2))
    assert _lists(a) != _lists(bucketed_token_batches(src, tgt, buckets, seed=4, epoch=1))
    sizes = np.maximum(src, tgt) + 1
    for batch in a:
        k = buckets.bucket_of(int(sizes[batch].max()))
        assert 1 <= len(batch) <= buckets.rows[k]
        assert k == 0 or sizes[batch].min() > buckets.lengths[k - 1]  # each example in its smallest bucket
    shapes = batch_shapes(a, src, tgt, buckets)
    assert len(shapes) <= len(buckets.lengths) and sum(shapes.values()) == len(a)
    assert set(shapes) <= set(buckets.shapes)
    # at most one short batch per bucket
    assert sum(len(b) < buckets.shape(int(src[b].max()), int(tgt[b].max()))[0] for b in a) <= len(buckets.lengths)


def test_unshuffled_is_length_sorted_and_seed_independent():
    src, tgt = _random(500, 2)
    buckets = length_buckets(src, tgt, 512, 4)
    a = bucketed_token_batches(src, tgt, buckets, seed=1, epoch=0, shuffle=False)
    assert _lists(a) == _lists(bucketed_token_batches(src, tgt, buckets, seed=9, epoch=5, shuffle=False))
    assert np.all(np.diff(np.maximum(src, tgt)[np.concatenate(a)]) >= 0)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 80), st.integers(0, 80)), min_size=1, max_size=150),
       st.integers(82, 2000), st.integers(1, 20), st.one_of(st.none(), st.integers(1, 40)),
       st.integers(1, 16), st.integers(0, 2**31 - 1), st.sampled_from(["padding", "quantile"]))
def test_padded_batch_within_budget(pairs, max_tokens, count, max_sentences, multiple, seed, method):
    src = np.array([p[0] for p in pairs])
    tgt = np.array([p[1] for p in pairs])
    buckets = length_buckets(src, tgt, max_tokens, count, max_sentences=max_sentences, multiple=multiple,
                             method=method)
    assert len(buckets.lengths) <= count
    assert buckets.lengths[-1] >= int(np.maximum(src, tgt).max()) + 1
    batches = bucketed_token_batches(src, tgt, buckets, seed=seed, epoch=0)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(pairs)))
    for batch in batches:
        rows, s_len, t_len = buckets.shape(int(src[batch].max()), int(tgt[batch].max()))
        assert len(batch) <= rows and rows * s_len <= max_tokens and rows * t_len <= max_tokens
        assert max_sentences is None or rows <= max_sentences
    assert len(batch_shapes(batches, src, tgt, buckets)) <= count


def test_errors():
    src, tgt = np.array([3, 4, 70, 5]), np.array([3, 90, 2, 5])
    with pytest.raises(DataError) as err:
        length_buckets(src, tgt, 64, 4)
    message = str(err.value)
    assert "example 1" in message and "90 tokens" in message and "max_tokens is 64" in message
    assert "raise max_tokens" in message and "\n" not in message
    with pytest.raises(ValueError, match="buckets=0"):
        length_buckets(src, tgt, 128, 0)
    with pytest.raises(ValueError, match="max_tokens=0"):
        length_buckets(src, tgt, 0, 4)
    with pytest.raises(ValueError, match="method='median'"):
        length_buckets(src, tgt, 128, 4, method="median")
    with pytest.raises(DataError, match="example 2 has 70 tokens .* longest length bucket is 64"):
        bucketed_token_batches(src, np.zeros(4, dtype=np.int64), LengthBuckets((8, 64), (8, 1)), seed=0, epoch=0)
    assert bucketed_token_batches([], [], LengthBuckets((8,), (1,)), seed=0, epoch=0) == []


def test_collate_with_shape_by_hand():
    split = ParallelSplit.from_sequences([[10, 11, 12], [20], [30]], [[40, 41], [50, 51, 52, 53], [60]])
    batch = collate(split, [1, 0], pad_id=PAD, bos_id=BOS, eos_id=EOS, shape=(4, 6, 6))
    assert batch.src.shape == batch.prev.shape == batch.tgt.shape == (4, 6) and len(batch) == 4
    assert all(t.is_contiguous() and t.dtype == torch.long for t in (batch.src, batch.prev, batch.tgt))
    assert batch.src.tolist() == [[20, EOS, PAD, PAD, PAD, PAD],
                                  [10, 11, 12, EOS, PAD, PAD],
                                  [EOS, PAD, PAD, PAD, PAD, PAD],
                                  [EOS, PAD, PAD, PAD, PAD, PAD]]
    assert batch.prev.tolist() == [[BOS, 50, 51, 52, 53, PAD],
                                   [BOS, 40, 41, PAD, PAD, PAD],
                                   [BOS, PAD, PAD, PAD, PAD, PAD],
                                   [BOS, PAD, PAD, PAD, PAD, PAD]]
    assert batch.tgt.tolist() == [[50, 51, 52, 53, EOS, PAD],
                                  [40, 41, EOS, PAD, PAD, PAD],
                                  [PAD] * 6,
                                  [PAD] * 6]
    assert batch.indices.tolist() == [1, 0]
    plain = collate(split, [1, 0], pad_id=PAD, bos_id=BOS, eos_id=EOS)
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (plain.n_src_tokens, plain.n_tgt_tokens) == (6, 8)
    # the shape's exact fit is accepted: longest target 4 + 1 = 5 positions
    assert collate(split, [1, 0, 2], shape=(3, 4, 5)).tgt.shape == (3, 5)


def test_collate_shape_errors():
    split = ParallelSplit.from_sequences([[10, 11, 12], [20], [30]], [[40, 41], [50, 51, 52, 53], [60]])
    with pytest.raises(ValueError, match="3 examples do not fit a batch shape of 2 rows"):
        collate(split, [0, 1, 2], shape=(2, 8, 8))
    with pytest.raises(ValueError, match="need 4 / 5 positions .* has 8 / 4"):
        collate(split, [0, 1], shape=(2, 8, 4))
    with pytest.raises(ValueError, match="need 4 / 3 positions"):
        collate(split, [0], shape=(2, 3, 8))


def _shards(sizes: list[int], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(1, 30, n), rng.integers(1, 30, n)) for n in sizes]


def test_sharded_with_buckets():
    shards = _shards([50, 7, 120, 33])
    src, tgt = (np.concatenate(side) for side in zip(*shards))
    buckets = length_buckets(src, tgt, 200, 3)
    starts = np.cumsum([0, 50, 7, 120, 33])
    batches = sharded_token_batches(shards, 200, seed=3, epoch=2, buckets=buckets)
    assert sorted(np.concatenate(batches).tolist()) == list(range(210))
    assert _lists(batches) == _lists(sharded_token_batches(shards, 200, seed=3, epoch=2, buckets=buckets))
    assert _lists(batches) != _lists(sharded_token_batches(shards, 200, seed=3, epoch=3, buckets=buckets))
    assert _lists(batches) != _lists(sharded_token_batches(shards, 200, seed=3, epoch=2))  # buckets change it
    for batch in batches:
        owner = np.searchsorted(starts, batch, side="right") - 1
        assert (owner == owner[0]).all()  # one shard per batch
        assert len(batch) <= buckets.shape(int(src[batch].max()), int(tgt[batch].max()))[0]
    assert len(batch_shapes(batches, src, tgt, buckets)) <= len(buckets.lengths)
    # unshuffled: the shards' own bucketed batches, offset and concatenated in shard order
    expected = [b + starts[k] for k, shard in enumerate(shards)
                for b in bucketed_token_batches(*shard, buckets, seed=0, epoch=0, shuffle=False)]
    assert _lists(sharded_token_batches(shards, 200, seed=5, epoch=1, shuffle=False, buckets=buckets)) == \
        _lists(expected)
    # one shard: exactly bucketed_token_batches
    one = _shards([90])
    assert _lists(sharded_token_batches(one, 200, seed=4, epoch=3, buckets=buckets)) == \
        _lists(bucketed_token_batches(*one[0], buckets, seed=4, epoch=3))
    # buckets built for another budget are refused; without buckets nothing changes
    with pytest.raises(ValueError, match="exceed max_tokens=100"):
        sharded_token_batches(shards, 100, seed=0, epoch=0, buckets=buckets)
    assert _lists(sharded_token_batches(one, 150, seed=4, epoch=3)) == _lists(token_batches(*one[0], 150, seed=4,
                                                                                              epoch=3))
