"""`convert export`: a checkpoint as a release directory (checkpoint/export.py writes the files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multibranch.checkpoint.export import export
from multibranch.config import to_dict
from multibranch.convert.payload import experiment_config


def export_release(payload: dict[str, Any], out_dir: str | Path, *, force: bool = False) -> list[Path]:
    """Write `payload` to `out_dir` with its config validated and every default resolved; the written files."""
    return export({**payload, "config": to_dict(experiment_config(payload))}, out_dir, force=force)
