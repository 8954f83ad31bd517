"""metrics.jsonl: one JSON object per line, the source of truth for curves and analyses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from multibranch.atomic import atomic_write_text, reporting_full_disk


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
            handle.write(json.dumps(record, sort_keys=False) + "\n")
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
        """Keep only records with record["step"] <= step (atomically rewritten)."""
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
                kept.append(line)
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))
