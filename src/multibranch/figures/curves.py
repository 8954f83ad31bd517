"""A run's curves from its directory: training/validation metrics and every logged module metric from
RUN/metrics.jsonl, and the rate schedules of RUN/config.yaml evaluated over the planned updates.

    records = read_metrics(run / "metrics.jsonl")
    run_curves(records)                    -> {"train": {key: series}, "valid": {key: series}}
    module_curves(records, window=10)      -> {metric: series + "smoothed"}   (docs/papers.md#weighted-kappa-and-alpha-trajectories)
    schedule_curves(config, points=200)    -> {path: {"schedule", "step", "value"}}   (docs/papers.md#drophead-rate-schedules)
A series is {"step": [...], "value": [...]}.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from multibranch.errors import DataError
from multibranch.schedules import RateConfig, rate_at

TRAIN_KEYS = ("loss", "nll", "ppl", "accuracy", "lr", "grad_norm", "tokens_per_s", "sentences_per_s")
VALID_KEYS = ("loss", "nll", "ppl", "bleu", "accuracy", "macro_f1")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The JSON records of a metrics.jsonl (a last line cut by a kill is skipped; any other bad line is an error)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: not a training run directory?")
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue
            raise DataError(f"{path}:{number} is not a JSON record") from None
        if not isinstance(record, dict) or "step" not in record:
            raise DataError(f"{path}:{number} is not a metrics record (no 'step')")
        records.append(record)
    return records


def _series(records: list[dict[str, Any]], kind: str, key: str) -> dict[str, list] | None:
    rows = [(r["step"], r[key]) for r in records if r.get("type") == kind and isinstance(r.get(key), (int, float))]
    return {"step": [s for s, _ in rows], "value": [v for _, v in rows]} if rows else None


def run_curves(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, list]]]:
    """Train and validation series of the standard keys that the log contains."""
    out: dict[str, dict[str, dict[str, list]]] = {}
    for kind, keys in (("train", TRAIN_KEYS), ("valid", VALID_KEYS)):
        found = {key: s for key in keys if (s := _series(records, kind, key)) is not None}
        out[kind] = found
    return out


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean filter: element i is the mean of values[max(0, i-window+1) .. i]."""
    if window < 1:
        raise ValueError(f"window {window} must be >= 1")
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def module_curves(records: list[dict[str, Any]], window: int = 10) -> dict[str, dict[str, list]]:
    """Every metric under the "modules" key of train records, over steps, with its moving average."""
    names: dict[str, None] = {}
    for record in records:
        if record.get("type") == "train":
            names.update(dict.fromkeys(record.get("modules") or {}))
    out = {}
    for name in names:
        rows = [(r["step"], r["modules"][name]) for r in records
                if r.get("type") == "train" and isinstance((r.get("modules") or {}).get(name), (int, float))]
        values = [float(v) for _, v in rows]
        out[name] = {"step": [s for s, _ in rows], "value": values, "smoothed": moving_average(values, window)}
    return out


def rate_configs(obj: Any, path: str = "") -> dict[str, RateConfig]:
    """Every RateConfig inside a config dataclass tree, by dotted path (those that are 0 throughout skipped)."""
    if isinstance(obj, RateConfig):
        return {} if obj.is_zero else {path: obj}
    found: dict[str, RateConfig] = {}
    if dataclasses.is_dataclass(obj):
        for field in dataclasses.fields(obj):
            found.update(rate_configs(getattr(obj, field.name), f"{path}.{field.name}" if path else field.name))
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            found.update(rate_configs(item, f"{path}.{i}"))
    return found


def schedule_curves(config: Any, points: int = 200) -> dict[str, dict[str, Any]]:
    """Each non-zero rate schedule of an ExperimentConfig at `points` updates spread over 0..T
    (T = train.max_steps, T_w = train.lr.warmup), plus T itself so the end point is exact."""
    total, warmup = config.train.max_steps, config.train.lr.warmup
    out = {}
    for path, cfg in rate_configs(config).items():
        end = cfg.total if cfg.total is not None else total
        if end is None and cfg.needs_total:
            raise DataError(f"the {cfg.schedule!r} schedule {path} needs train.max_steps, which the run does not set")
        end = end or 1
        steps = sorted({round(i * end / max(points - 1, 1)) for i in range(points)} | {end})
        if cfg.schedule == "v":
            steps = sorted({*steps, cfg.warmup if cfg.warmup is not None else warmup})
        out[path] = {"schedule": cfg.schedule, "step": steps,
                     "value": [rate_at(cfg, t, warmup, total) for t in steps]}
    return out
