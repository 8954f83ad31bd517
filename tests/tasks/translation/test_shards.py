"""The pieces of a streaming `prepare`: percentiles from a histogram, the seeded reservoir sample."""

from __future__ import annotations

import numpy as np

from multibranch.data.length_stats import histogram_stats, length_stats
from multibranch.data.sentencepiece_training import Reservoir


def test_histogram_stats_equal_numpy_percentiles_on_the_values():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 1000):
        values = rng.integers(0, 60, n)
        assert histogram_stats(np.bincount(values)) == length_stats(values)
    assert histogram_stats(np.zeros(3, dtype=np.int64)) == length_stats(np.zeros(0, dtype=np.int64))


def test_reservoir_keeps_a_short_stream_whole_and_samples_a_long_one_uniformly():
    short = Reservoir(10, seed=1)
    short.add(["a", "b"])
    short.add(["c"])
    assert short.items == ["a", "b", "c"]
    hits = np.zeros(2000, dtype=np.int64)
    for seed in range(200):
        sample = Reservoir(100, seed=seed)
        for start in range(0, 2000, 300):  # chunks of uneven size
            sample.add([str(i) for i in range(start, min(start + 300, 2000))])
        picked = [int(x) for x in sample.items]
        assert len(picked) == len(set(picked)) == 100
        hits[picked] += 1
    again = Reservoir(100, seed=0)
    again.add([str(i) for i in range(2000)])
    first = Reservoir(100, seed=0)
    first.add([str(i) for i in range(2000)])
    assert again.items == first.items
    # each item is kept with probability 100/2000 = 0.05: 200 draws -> 10 expected; halves of the stream agree
    assert abs(hits[:1000].sum() - hits[1000:].sum()) < 0.1 * hits.sum()
    assert hits.sum() == 200 * 100
