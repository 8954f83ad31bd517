"""metrics.jsonl: one JSON object per line, the source of truth for curves and analyses.

Every line is strict JSON (RFC 8259), readable by any parser: a value that is not a finite number (a
diverged loss, an overflowed gradient norm) is written as `null`, as JavaScript's JSON.stringify writes it;
the TensorBoard sinks still get the value itself.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from multibranch.atomic import atomic_write_text, reporting_full_disk


def finite_or_null(value: Any) -> Any:
    """`value` with every NaN or infinite float in it (in dicts and lists too) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


class MetricsLog:
    """Append-only JSON-lines log; `truncate_after(step)` drops entries a resumed run will redo.

    `sinks` (objects with `write(record)` and `close()`, e.g. train/tensorboard.py) get every record too."""

    def __init__(self, path: str | Path, enabled: bool = True, sinks: list[Any] | None = None):
        self.path = Path(path)
        self.enabled = enabled
        self.sinks = list(sinks or []) if enabled else []

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with reporting_full_disk(self.path), self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(finite_or_null(record), sort_keys=False, allow_nan=False) + "\n")
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        """Keep only records with record["step"] <= step (atomically rewritten, each as strict JSON: a log written
        with bare NaNs comes back with nulls)."""
        if not self.enabled or not self.path.exists():
            return
        lines = self.path.read_text(encoding="utf-8").splitlines()
        kept = []
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill
                continue
            if record.get("step", 0) <= step:
                kept.append(json.dumps(finite_or_null(record), sort_keys=False, allow_nan=False))
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))
