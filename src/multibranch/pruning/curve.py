"""The pruning curve by masking (docs/papers.md#drophead-pruning-curve-and-dominant-heads).

Pruning curve: rank every head of every attention module globally by ascending importance and mask
the lowest 10%, 20%, ... of the total head count (cumulative: step k masks round(k * step * total) heads in
all, so the steps' sizes alternate around step * total), scoring the model after each step. Importance is computed once (default) or recomputed
under the current mask after each step (`recompute`); `keep_one` never masks the last unmasked head
of a module (the curve then stops at the last reachable step). Masking = gate 0, no rescale.

Threshold (`prune --max-drop`): walk the same curve and keep the last step whose score is at most
`max_drop` below the unpruned score, stopping at the first step that drops more (`within_drop`).

All take `evaluate`, a function of no arguments returning the score of the model as it is (with the
gates installed around the call), e.g. `pruning.scoring.BleuScorer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from torch import Tensor

from multibranch.analysis.heads import AttentionSite, HeadId, gates_installed, mask_gates, total_heads

Importance = Callable[[Mapping[str, Tensor]], Mapping[str, Tensor]]  # gates -> site name -> [H]


@dataclass
class CurvePoint:
    """One step of the curve: the planned fraction, the heads masked so far and the score."""

    fraction: float
    score: float
    masked: list[HeadId] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"fraction": self.fraction, "masked_heads": len(self.masked), "score": self.score,
                "masked": [[name, head] for name, head in self.masked]}


def planned_counts(total: int, step: float = 0.1, maskable: int | None = None) -> list[tuple[float, int]]:
    """(fraction, heads to mask) for fractions 0, step, 2*step, ... <= 1 while the count is <= maskable."""
    if not 0.0 < step <= 1.0:
        raise ValueError(f"step={step} must be in (0, 1]")
    maskable = total if maskable is None else maskable
    plan = []
    k = 0
    while k * step <= 1.0 + 1e-9:
        fraction = round(k * step, 10)
        count = round(fraction * total)
        if count > maskable:
            break
        plan.append((fraction, count))
        k += 1
    return plan


def select_heads(
    sites: list[AttentionSite],
    scores: Mapping[str, Tensor],
    count: int,
    already: list[HeadId],
    keep_one: bool = False,
) -> list[HeadId]:
    """`already` plus the least important unmasked heads until `count` heads are masked.

    Ties go to module order, then head index. With `keep_one`, a module's last unmasked head is skipped.
    """
    masked = list(already)
    taken = set(masked)
    left = {s.name: s.heads - sum(1 for name, _ in masked if name == s.name) for s in sites}
    order = sorted(
        ((float(scores[s.name][h]), i, h, s.name) for i, s in enumerate(sites) for h in range(s.heads)),
    )
    for _, _, head, name in order:
        if len(masked) >= count:
            break
        if (name, head) in taken or (keep_one and left[name] <= 1):
            continue
        masked.append((name, head))
        taken.add((name, head))
        left[name] -= 1
    if len(masked) < count:
        raise ValueError(f"cannot mask {count} heads (only {len(masked)} maskable)")
    return masked


def pruning_steps(
    sites: list[AttentionSite],
    importance: Importance,
    evaluate: Callable[[], float],
    step: float = 0.1,
    recompute: bool = False,
    keep_one: bool = False,
) -> Iterator[CurvePoint]:
    """The curve's points one at a time (a caller may stop early; no gate stays installed between points)."""
    total = total_heads(sites)
    maskable = total - len(sites) if keep_one else total
    scores = importance({})
    masked: list[HeadId] = []
    for fraction, count in planned_counts(total, step, maskable):
        if recompute and masked:
            scores = importance(mask_gates(sites, masked))
        masked = select_heads(sites, scores, count, masked, keep_one)
        with gates_installed(sites, mask_gates(sites, masked)):
            score = evaluate()
        yield CurvePoint(fraction, score, list(masked))


def pruning_curve(
    sites: list[AttentionSite],
    importance: Importance,
    evaluate: Callable[[], float],
    step: float = 0.1,
    recompute: bool = False,
    keep_one: bool = False,
) -> list[CurvePoint]:
    """The score after masking the globally least important 0%, step, 2*step, ... of all heads."""
    return list(pruning_steps(sites, importance, evaluate, step, recompute, keep_one))


def within_drop(points: Iterable[CurvePoint], max_drop: float) -> tuple[CurvePoint, list[CurvePoint]]:
    """Walk the curve until a point scores more than `max_drop` below the first (unpruned) one.

    Returns (the last point within the threshold, every point evaluated, the failing one included);
    the walk stops at the first failure, so later points are never computed."""
    if max_drop < 0:
        raise ValueError(f"max_drop={max_drop} must be >= 0")
    seen: list[CurvePoint] = []
    chosen: CurvePoint | None = None
    for point in points:
        seen.append(point)
        if point.score < seen[0].score - max_drop:
            break
        chosen = point
    if chosen is None:
        raise ValueError("the curve has no point")
    return chosen, seen
