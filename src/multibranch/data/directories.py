"""What an existing output directory holds, so that `--force` replaces only a directory of its own kind.

    prepared data       data.json                         (`prepare`)
    training run        config.yaml, last.pt, best.pt, checkpoints/   (`train`)
    analysis report     index.md                          (`analyze ...`, `plot`)

`--force` lets `prepare` replace a data directory, `train` start over in a run directory and `analyze`
write into a report folder (or into a directory of none of these kinds, e.g. a few notes); it never lets
one command destroy or litter another's output: `prepare --out RUN --force` would delete a run's
checkpoints, `train --out DATA --force` would write a run into prepared data.
"""

from __future__ import annotations

from pathlib import Path

from multibranch.checkpoint.format import RUN_DIR_MARKERS
from multibranch.data.meta import META_FILE
from multibranch.errors import UserError

REPORT_INDEX = "index.md"
RUN_CONFIG = "config.yaml"

DATA, RUN, REPORT = "prepared data directory", "training run directory", "analysis report folder"
_MARKERS = {DATA: (META_FILE,), RUN: (RUN_CONFIG, *RUN_DIR_MARKERS), REPORT: (REPORT_INDEX,)}
_MAKERS = {DATA: "multibranch prepare", RUN: "multibranch train", REPORT: "multibranch analyze"}


def directory_kind(path: str | Path) -> str | None:
    """DATA, RUN or REPORT for a directory holding that kind's marker file; None otherwise."""
    path = Path(path)
    if not path.is_dir():
        return None
    for kind, markers in _MARKERS.items():
        if any((path / name).exists() for name in markers):
            return kind
    return None


def refuse_other_kind(path: str | Path, kind: str, option: str = "--out") -> None:
    """UserError if `path` is an existing directory of another kind than `kind` (with or without --force)."""
    found = directory_kind(path)
    if found is not None and found != kind:
        raise UserError(f"{option} {path}: is a {found} (made by `{_MAKERS[found]}`), not a {kind}; "
                        "--force replaces only its own kind of output; choose another directory")


def is_run_checkpoint(path: str | Path, name: str = "last.pt") -> bool:
    """True if `path` is RUN/`name` of a training run directory (whether or not the file exists yet)."""
    path = Path(path)
    return path.name == name and directory_kind(path.parent) == RUN
