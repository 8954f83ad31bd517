"""Length statistics of a prepared split (min, mean, percentiles, max), from the lengths themselves or
from a histogram of them (what a streaming `prepare` keeps, in memory that does not grow with the corpus)."""

from __future__ import annotations

import numpy as np

EMPTY = {"min": 0, "mean": 0.0, "p50": 0, "p90": 0, "p95": 0, "p99": 0, "max": 0}


def length_stats(lengths: np.ndarray) -> dict[str, float]:
    """min / mean / p50 / p90 / p95 / p99 / max of `lengths` [n]."""
    if len(lengths) == 0:
        return dict(EMPTY)
    p50, p90, p95, p99 = (float(v) for v in np.percentile(lengths, [50, 90, 95, 99]))
    return {
        "min": int(lengths.min()), "mean": round(float(lengths.mean()), 2),
        "p50": p50, "p90": p90, "p95": p95, "p99": p99, "max": int(lengths.max()),
    }


def histogram_stats(hist: np.ndarray) -> dict[str, float]:
    """min / mean / percentiles / max of the values whose counts are `hist` (value v counted hist[v] times),
    the same numbers `np.percentile` (linear interpolation) gives on the values themselves."""
    total = int(hist.sum())
    if total == 0:
        return dict(EMPTY)
    values = np.flatnonzero(hist)
    cumulative = np.cumsum(hist[values])  # [distinct values] how many are <= each value

    def value_at(rank: int) -> int:  # the rank-th smallest value (0-based)
        return int(values[np.searchsorted(cumulative, rank, side="right")])

    def percentile(q: float) -> float:
        position = q / 100 * (total - 1)
        low = int(np.floor(position))
        below, above = value_at(low), value_at(min(low + 1, total - 1))
        return float(below + (above - below) * (position - low))

    mean = float((np.arange(len(hist)) * hist).sum() / total)
    return {"min": int(values[0]), "mean": round(mean, 2), "p50": percentile(50), "p90": percentile(90),
            "p95": percentile(95), "p99": percentile(99), "max": int(values[-1])}
