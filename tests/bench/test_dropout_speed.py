"""bench/dropout_speed.py's summary of paired update times, on a hand-computed case."""

from __future__ import annotations

import pytest

from bench.dropout_speed import VARIANTS, summarise


def test_the_summary_takes_the_median_pair_ratio_and_counts_the_pairs_won():
    seconds = {"kernel": [1.0, 1.0, 4.0], "composed": [2.0, 2.0, 2.0], "torch": [2.0, 3.0, 2.0]}
    rows = {row["variant"]: row for row in summarise("p", seconds)}
    assert list(rows) == list(VARIANTS)
    # torch / kernel per pair: 2, 3, 0.5 -> median 2; a spike in one pair moves the mean (2000 ms), not the median
    assert rows["kernel"]["speed_vs_torch"] == 2.0
    assert rows["kernel"]["ms_per_update"] == pytest.approx(2000.0)
    assert rows["kernel"]["faster_than_torch"] == 2
    # torch / composed: 1, 1.5, 1 -> 1; it wins the one pair where torch took longer
    assert rows["composed"]["speed_vs_torch"] == 1.0 and rows["composed"]["faster_than_torch"] == 1
    assert rows["torch"]["speed_vs_torch"] == 1.0 and rows["torch"]["faster_than_torch"] == 0
    assert all(row["pairs"] == 3 and row["preset"] == "p" for row in rows.values())
