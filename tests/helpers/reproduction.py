"""Hand-made results files of bench/reproduce.py (the fields the report reads), for the reproduction's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def run(system: str, seed: int, bleu: float, *, rho: float | None = None, grid: bool = False, status: str = "done",
        updates: int = 1000, best_step: int = 800, minutes: float = 10.0, compare: dict | None = None,
        analyses: dict | None = None, kappa_alpha: list | None = None) -> dict[str, Any]:
    """A run record as bench/reproduce.py writes it (the fields the report reads)."""
    name = f"{system}-rho{rho:g}" if rho is not None else system
    record: dict[str, Any] = {
        "system": system, "seed": seed, "rho": rho, "grid": grid, "dir": f"/w/runs/{name}/seed{seed}",
        "status": status, "stop": "no improvement", "updates": updates, "best_valid_bleu": bleu + 1.0,
        "best_valid_step": best_step, "train_minutes": minutes, "wall_minutes": minutes + 1.0,
        "segments": [{"started": "2026-11-28T01:00:00", "wall_s": 60.0, "jobs": 3}],
        "curve": {"valid": [{"step": 500, "bleu": bleu - 2.0}, {"step": 1000, "bleu": bleu + 1.0}], "train": []},
    }
    if status == "done":
        record["test"] = {"avg": {"bleu": bleu, "chrf": 2 * bleu, "bleu_signature": "nrefs:1|tok:13a"},
                          "best": {"bleu": bleu - 0.5, "chrf": 2 * bleu}}
    if compare is not None:
        record["compare_to_standard"] = compare
    if analyses is not None:
        record["analyses"] = analyses
    if kappa_alpha is not None:
        record["curve"]["kappa_alpha"] = kappa_alpha
    return record


def compared(baseline: float, system: float, p: float) -> dict[str, Any]:
    return {"bleu": {"baseline": baseline, "system": system, "delta": system - baseline, "p_value": p},
            "chrf": {"baseline": 2 * baseline, "system": 2 * system, "p_value": p}}


def results(runs: list[dict], rows: list[dict] | None = None, *, max_updates: int = 12000, jobs: int = 3,
            tiny: bool = False, seeds: tuple[int, ...] = (1, 2, 3), patience: int = 5) -> dict[str, Any]:
    return {"environment": {"gpu": "NVIDIA H100 80GB HBM3", "commit": "0123456789abcdef", "commit_dirty": False,
                            "device": "cuda", "torch": "2.11.0"},
            "settings": {"tiny": tiny, "systems": sorted({r["system"] for r in runs}), "seeds": list(seeds),
                         "max_updates": max_updates, "patience": patience, "valid_every": 500, "average_last": 5,
                         "jobs": jobs, "data": {"vocab_size": {"src": 8000, "tgt": 8000}}},
            "rows": rows or [], "runs": runs, "bleu_signatures": ["nrefs:1|tok:13a"]}


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path
