"""Optional TensorBoard sink for the training metrics (`train --tensorboard DIR`; the `[tb]` extra).

Every numeric field of a metrics.jsonl record becomes a scalar at the record's step: tag "<type>/<key>"
(e.g. "train/loss", "valid/bleu") and "modules/<name>" for the module metrics of train records.
metrics.jsonl stays the source of truth; the sink only mirrors it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multibranch.config import ConfigError

SKIPPED = ("type", "step", "epoch")


def check_tensorboard() -> None:
    """ConfigError with the install line unless TensorBoard's writer can be imported."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ConfigError("--tensorboard needs the tensorboard package: pip install 'multibranch[tb]' "
                          "(or pip install tensorboard)") from None


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars of one metrics record, by tag."""
    kind = record.get("type", "metrics")
    out = {f"{kind}/{key}": float(value) for key, value in record.items()
           if key not in SKIPPED and isinstance(value, (int, float)) and not isinstance(value, bool)}
    for name, value in (record.get("modules") or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"modules/{name}"] = float(value)
    return out


class TensorBoardSink:
    """Writes every metrics record as scalars into an event file under `log_dir`.

    `purge_step`: events at or after this step already in `log_dir` (an interrupted run's, or a
    previous run's) are hidden, as metrics.jsonl drops its records after a resumed step."""

    def __init__(self, log_dir: str | Path, purge_step: int | None = None):
        check_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
