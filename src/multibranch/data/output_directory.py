"""Whether `prepare` (any task) may write its output directory: not a file, not a directory that holds
its inputs, not another command's output, and not a non-empty directory without `--force`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from multibranch.data.directories import DATA, refuse_replacing
from multibranch.errors import DataError


def check_out_dir(out: Path, inputs: Iterable[Path], force: bool) -> None:
    """DataError naming `out` when `prepare` must not write it; `inputs`: the files it reads."""
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory; choose another --out")
    if force and out.is_dir() and any(out.iterdir()):
        resolved = out.resolve()
        for path in inputs:
            if path.resolve().is_relative_to(resolved):
                raise DataError(f"{out}: refusing --force because input {path} is inside it; choose another --out")
    refuse_replacing(out, DATA, error=DataError)  # --force replaces only prepared data
    if out.is_dir() and any(out.iterdir()) and not force:
        raise DataError(f"{out}: output directory exists and is not empty; pass --force to replace it")
