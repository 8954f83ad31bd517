"""Which heads `multibranch prune` removes: a least-important fraction, the last step of the pruning curve
within a metric threshold, or the heads listed in a JSON file.

    remove = least_important(sites, scores, fraction)
    chosen, walked = heads_within_drop(sites, importance, scorer, max_drop, step, recompute)
    remove = read_heads("heads.json")
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from multibranch.analysis.heads import AttentionSite, HeadId, total_heads
from multibranch.errors import UserError
from multibranch.pruning.curve import CurvePoint, Importance, pruning_steps, select_heads, within_drop


def least_important(sites: list[AttentionSite], scores: Mapping[str, torch.Tensor], fraction: float) -> list[HeadId]:
    """round(fraction * all heads) least important heads, every module keeping one (ValueError if impossible)."""
    count = round(fraction * total_heads(sites))
    maskable = total_heads(sites) - len(sites)
    if count > maskable:
        raise ValueError(f"fraction {fraction} removes {count} heads but only {maskable} can go "
                         f"(every one of the {len(sites)} attention modules keeps one)")
    return select_heads(sites, scores, count, [], keep_one=True)


def heads_within_drop(sites: list[AttentionSite], importance: Importance, evaluate: Callable[[], float],
                      max_drop: float, step: float = 0.1,
                      recompute: bool = False) -> tuple[CurvePoint, list[CurvePoint]]:
    """The pruning curve (every module keeping one head) walked until the score drops more than
    `max_drop` below the unpruned one: (the last step within it, every step evaluated)."""
    return within_drop(pruning_steps(sites, importance, evaluate, step, recompute, keep_one=True), max_drop)


def read_heads(path: str | Path) -> list[HeadId]:
    """The heads listed in a JSON file: [[module name, head index], ...] or {"masked": [...]} (a point of
    `analyze heads`' pruning curve)."""
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err})") from None
    if isinstance(data, dict):
        data = data.get("masked")
    ok = isinstance(data, list) and all(
        isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int)
        for item in data
    )
    if not ok:
        raise UserError(f"{path}: expected a list of [module name, head index] pairs (or {{\"masked\": [...]}})")
    return [(name, head) for name, head in data]
