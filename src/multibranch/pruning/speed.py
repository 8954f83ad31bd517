"""Decoding speed of two models, measured side by side.

Each round times one pass of every model over the same set with the same settings, the order alternating
from round to round (A B, B A, ...). On a machine shared with other processes one pass can be several
times slower than the next, so one number (the fastest pass of each) can show a large speed-up or
slow-down that is only noise: `speed_spread` gives every model's sentences/s (fastest, median, slowest
round) and the ratio of the two models within each round (median, min, max); a ratio range that spans 1
is no measurable change.

    timings = side_by_side({"before": scorer_a, "after": scorer_b}, rounds=3)
    spread = speed_spread(timings["before"]["seconds"], timings["after"]["seconds"], sentences)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any


def side_by_side(scorers: Mapping[str, Callable[[], float]], rounds: int = 3,
                 clock: Callable[[], float] = time.perf_counter) -> dict[str, dict[str, Any]]:
    """Time every scorer once per round, alternating the order; {label: {"score", "seconds": [...]}}.

    The score is the first pass's (a model in eval mode scores the same set the same way every time)."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds} must be >= 1")
    labels = list(scorers)
    out: dict[str, dict[str, Any]] = {label: {"score": None, "seconds": []} for label in labels}
    for r in range(rounds):
        for label in labels if r % 2 == 0 else labels[::-1]:
            start = clock()
            score = scorers[label]()
            out[label]["seconds"].append(clock() - start)
            if out[label]["score"] is None:
                out[label]["score"] = score
    return out


def speed_spread(before: list[float], after: list[float], sentences: int) -> dict[str, dict[str, Any]]:
    """Sentences/s of two models timed side by side (`before[r]`, `after[r]`: the seconds of round r) and
    their ratio per round (before / after seconds: > 1 means `after` is faster).

    {"before" / "after": {"sentences_per_s" (the fastest round), "sentences_per_s_median",
    "sentences_per_s_min", "seconds"}, "speed": {"rounds", "speedup_median", "speedup_min", "speedup_max",
    "speedups"}}"""
    if not before or len(before) != len(after):
        raise ValueError(f"{len(before)} and {len(after)} timed rounds: need the same number, at least one")
    out: dict[str, dict[str, Any]] = {}
    for label, seconds in (("before", before), ("after", after)):
        out[label] = {"sentences_per_s": sentences / min(seconds),
                      "sentences_per_s_median": sentences / statistics.median(seconds),
                      "sentences_per_s_min": sentences / max(seconds), "seconds": list(seconds)}
    ratios = [b / a for b, a in zip(before, after, strict=True)]
    out["speed"] = {"rounds": len(ratios), "speedup_median": statistics.median(ratios),
                    "speedup_min": min(ratios), "speedup_max": max(ratios), "speedups": ratios}
    return out
