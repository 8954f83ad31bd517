"""`sharded_token_batches`: every example once, a batch inside one shard, seeded, equal to
`token_batches` for one shard; ranks get disjoint batches; `collate` reads the right shard."""

from __future__ import annotations

import numpy as np

from multibranch.data.batching import collate, shard_batches, sharded_token_batches, token_batches
from multibranch.tasks.translation.dataset import ParallelSplit, ShardedSplit


def _shards(sizes: list[int], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(1, 30, n), rng.integers(1, 30, n)) for n in sizes]


def test_every_example_once_and_each_batch_in_one_shard():
    shards = _shards([50, 7, 120, 33])
    starts = np.cumsum([0, 50, 7, 120, 33])
    batches = sharded_token_batches(shards, 200, seed=3, epoch=2)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(210))
    lengths = np.concatenate([np.maximum(s, t) for s, t in shards]) + 1
    for batch in batches:
        owner = np.searchsorted(starts, batch, side="right") - 1
        assert (owner == owner[0]).all()
        assert len(batch) * lengths[batch].max() <= 200


def test_seeded_epoch_dependent_and_single_shard_equals_token_batches():
    shards = _shards([40, 40, 40])
    a = sharded_token_batches(shards, 150, seed=1, epoch=0)
    b = sharded_token_batches(shards, 150, seed=1, epoch=0)
    c = sharded_token_batches(shards, 150, seed=1, epoch=1)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert [x.tolist() for x in a] != [x.tolist() for x in c]
    # batches of all shards are mixed, not one shard after another
    first_shard = [int(batch[0]) // 40 for batch in a]
    assert first_shard != sorted(first_shard)
    one = _shards([90])
    assert [x.tolist() for x in sharded_token_batches(one, 150, seed=4, epoch=3)] == \
        [x.tolist() for x in token_batches(*one[0], 150, seed=4, epoch=3)]


def test_ranks_read_disjoint_batches():
    batches = sharded_token_batches(_shards([60, 45, 80]), 120, seed=2, epoch=0)
    ranks = [shard_batches(batches, r, 3) for r in range(3)]
    seen = [set(np.concatenate(r).tolist()) for r in ranks]
    assert not (seen[0] & seen[1]) and not (seen[0] & seen[2]) and not (seen[1] & seen[2])
    assert len({len(r) for r in ranks}) == 1


def test_collate_over_shards_equals_one_split():
    rng = np.random.default_rng(5)
    src = [rng.integers(4, 50, rng.integers(1, 9)).tolist() for _ in range(30)]
    tgt = [rng.integers(4, 50, rng.integers(1, 9)).tolist() for _ in range(30)]
    whole = ParallelSplit.from_sequences(src, tgt)
    sharded = ShardedSplit("train", [ParallelSplit.from_sequences(src[a:b], tgt[a:b]) for a, b in
                                     ((0, 11), (11, 12), (12, 30))])
    assert len(sharded) == 30 and sharded.src_lengths.tolist() == whole.src_lengths.tolist()
    for indices in ([11], [12, 29, 13], [0, 11, 25], list(range(30))):  # in one shard, and across shards
        got, want = collate(sharded, indices), collate(whole, indices)
        for name in ("src", "prev", "tgt"):
            assert getattr(got, name).tolist() == getattr(want, name).tolist()
        assert got.indices.tolist() == indices
    assert sharded.tgt(12).tolist() == tgt[12]


class _CountingShards:
    """Shard lengths computed when indexed, recording how many are alive at once (as ShardLengths does)."""

    def __init__(self, shards):
        self.shards, self.alive, self.most_alive = shards, 0, 0

    def __len__(self):
        return len(self.shards)

    def __getitem__(self, k):
        import weakref

        src, tgt = (np.array(a) for a in self.shards[k])
        self.alive += 1
        self.most_alive = max(self.most_alive, self.alive)
        weakref.finalize(src, self._freed)
        return src, tgt

    def _freed(self):
        self.alive -= 1


def test_the_plan_holds_int32_indices_and_one_shards_lengths_at_a_time():
    shards = _shards([50, 7, 120, 33])
    lazy = _CountingShards(shards)
    batches = sharded_token_batches(lazy, 200, seed=3, epoch=2)
    assert lazy.most_alive == 1  # never every shard's lengths at once
    assert {b.dtype for b in batches} == {np.dtype(np.int32)}  # 4 bytes per example in an epoch's plan
    assert [b.tolist() for b in batches] == [b.tolist() for b in sharded_token_batches(shards, 200, seed=3, epoch=2)]
    assert {b.dtype for b in token_batches(*shards[0], 200, seed=0, epoch=0)} == {np.dtype(np.int32)}
