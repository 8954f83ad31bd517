"""The progress bar of `prepare` (any task): lines with an ETA on stderr, shown on a terminal."""

from __future__ import annotations

import sys

from tqdm import tqdm


class _Bar(tqdm):
    """tqdm without its monitor thread: `prepare` stays single-threaded, so its encoding workers can be forked
    (data/encoding.py)."""

    monitor_interval = 0


def progress_bar(show: bool | None, total: int, desc: str) -> tqdm:
    """A bar with an ETA on stderr, shown on a terminal (`show=None`) or when `show` says so."""
    enabled = sys.stderr.isatty() if show is None else show
    return _Bar(total=total, disable=not enabled, unit=" lines", unit_scale=True, desc=desc, dynamic_ncols=True,
                leave=False, file=sys.stderr)
