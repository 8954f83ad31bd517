"""Token-budget batching (property tests), sharding and collation layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from multibranch.data.batching import Batch, collate, shard_batches, token_batches
from multibranch.errors import DataError
from multibranch.tasks.translation.dataset import ParallelSplit

PAD, BOS, EOS = 0, 2, 3

lengths = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=0, max_size=120)
budgets = st.integers(32, 400)
seeds = st.integers(0, 2**31 - 1)


def _padded(batch: np.ndarray, src: np.ndarray, tgt: np.ndarray) -> int:
    return len(batch) * (int(max(src[batch].max(), tgt[batch].max())) + 1)


@settings(max_examples=150, deadline=None)
@given(lengths, budgets, seeds, st.integers(0, 50), st.booleans(), st.one_of(st.none(), st.integers(1, 9)))
def test_budget_respected_and_every_index_once(pairs, max_tokens, seed, epoch, shuffle, max_sentences):
    src = np.array([p[0] for p in pairs], dtype=np.int64)
    tgt = np.array([p[1] for p in pairs], dtype=np.int64)
    batches = token_batches(src, tgt, max_tokens, seed=seed, epoch=epoch, shuffle=shuffle, max_sentences=max_sentences)
    seen = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
    assert sorted(seen.tolist()) == list(range(len(pairs)))
    for batch in batches:
        assert len(batch) >= 1
        assert _padded(batch, src, tgt) <= max_tokens
        if max_sentences is not None:
            assert len(batch) <= max_sentences
    again = token_batches(src, tgt, max_tokens, seed=seed, epoch=epoch, shuffle=shuffle, max_sentences=max_sentences)
    assert [b.tolist() for b in batches] == [b.tolist() for b in again]


@settings(max_examples=50, deadline=None)
@given(lengths, budgets)
def test_unshuffled_order_is_length_sorted_and_seed_independent(pairs, max_tokens):
    src = np.array([p[0] for p in pairs], dtype=np.int64)
    tgt = np.array([p[1] for p in pairs], dtype=np.int64)
    a = token_batches(src, tgt, max_tokens, seed=1, epoch=0, shuffle=False)
    b = token_batches(src, tgt, max_tokens, seed=7, epoch=3, shuffle=False)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    flat = np.concatenate(a) if a else np.zeros(0, dtype=np.int64)
    sizes = np.maximum(src, tgt)[flat]
    assert np.all(np.diff(sizes) >= 0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(1, 1000), max_size=60), min_size=1, max_size=40), st.integers(1, 5))
def test_shards_are_equal_disjoint_and_drop_only_the_remainder(batch_sizes, world_size):
    start = 0
    batches = []
    for size in batch_sizes:
        batches.append(np.arange(start, start + len(size)))
        start += len(size)
    shards = [shard_batches(batches, rank, world_size) for rank in range(world_size)]
    assert len({len(s) for s in shards}) == 1
    assert len(shards[0]) == len(batches) // world_size
    used = [id(b) for s in shards for b in s]
    assert len(used) == len(set(used)) == len(batches) - len(batches) % world_size


def _random_lengths(n: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 50, n), rng.integers(1, 50, n)


def test_epochs_and_seeds_change_the_order():
    src, tgt = _random_lengths()
    orders = {
        (seed, epoch): [b.tolist() for b in token_batches(src, tgt, 300, seed=seed, epoch=epoch)]
        for seed in (1, 2)
        for epoch in (0, 1, 2)
    }
    values = list(orders.values())
    assert all(values[i] != values[j] for i in range(len(values)) for j in range(i + 1, len(values)))


def test_batches_are_length_bucketed():
    src, tgt = _random_lengths()
    sizes = np.maximum(src, tgt)
    batches = token_batches(src, tgt, 400, seed=3, epoch=0)
    # Length-sorted greedy filling: each batch spans a narrow length range.
    spans = [int(sizes[b].max() - sizes[b].min()) for b in batches]
    assert np.mean(spans) <= 3


def test_example_over_budget_names_index_length_and_budget():
    src = np.array([3, 4, 70, 5])
    tgt = np.array([3, 90, 2, 5])
    with pytest.raises(DataError) as err:
        token_batches(src, tgt, 64, seed=0, epoch=0)
    message = str(err.value)
    assert "example 1" in message and "90 tokens" in message and "max_tokens is 64" in message
    assert "2 example(s)" in message


def test_empty_and_bad_arguments():
    assert token_batches([], [], 10, seed=0, epoch=0) == []
    with pytest.raises(ValueError):
        token_batches([1], [1, 2], 10, seed=0, epoch=0)
    with pytest.raises(ValueError):
        shard_batches([], rank=2, world_size=2)


def test_collate_layout():
    src_seqs = [[10, 11, 12], [20], []]
    tgt_seqs = [[30, 31], [40, 41, 42, 43], [50]]
    split = ParallelSplit.from_sequences(src_seqs, tgt_seqs)
    order = [1, 0, 2]
    batch = collate(split, order, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    assert isinstance(batch, Batch) and len(batch) == 3
    assert batch.src.dtype == batch.prev.dtype == batch.tgt.dtype == torch.long
    assert batch.src.shape == (3, 4) and batch.prev.shape == batch.tgt.shape == (3, 5)
    assert all(t.is_contiguous() for t in (batch.src, batch.prev, batch.tgt))
    for row, i in enumerate(order):
        s, t = src_seqs[i], tgt_seqs[i]
        assert batch.src[row].tolist() == s + [EOS] + [PAD] * (4 - len(s) - 1)
        assert batch.tgt[row].tolist() == t + [EOS] + [PAD] * (5 - len(t) - 1)
        assert batch.prev[row].tolist() == [BOS] + t + [PAD] * (5 - len(t) - 1)
    assert batch.indices.tolist() == order
    assert batch.n_src_tokens == int((batch.src != PAD).sum()) == sum(len(s) + 1 for s in src_seqs)
    assert batch.n_tgt_tokens == int((batch.tgt != PAD).sum()) == sum(len(t) + 1 for t in tgt_seqs)
    moved = batch.to("cpu")
    assert torch.equal(moved.tgt, batch.tgt) and moved.n_tgt_tokens == batch.n_tgt_tokens


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(4, 99), max_size=9), st.lists(st.integers(4, 99), max_size=9)),
                min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_collate_matches_a_plain_python_reference(pairs, rnd):
    split = ParallelSplit.from_sequences([p[0] for p in pairs], [p[1] for p in pairs])
    idx = list(range(len(pairs)))
    rnd.shuffle(idx)
    batch = collate(split, idx)
    for row, i in enumerate(idx):
        s, t = pairs[i]
        assert batch.src[row, : len(s) + 1].tolist() == s + [EOS]
        assert batch.tgt[row, : len(t) + 1].tolist() == t + [EOS]
        assert batch.prev[row, : len(t) + 1].tolist() == [BOS] + t
        assert not batch.src[row, len(s) + 1 :].any() and not batch.tgt[row, len(t) + 1 :].any()
