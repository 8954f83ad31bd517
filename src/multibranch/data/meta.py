"""data.json, the description every prepared data directory (translation or classification) starts with."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from multibranch.errors import DataError
from multibranch.json_file import read_json_object

AGAIN = "run `multibranch prepare` again"
META_FILE = "data.json"


def read_meta(directory: Path, fmt: str, version: int | tuple[int, ...], required: Sequence[str],
              kind: str) -> dict[str, Any]:
    """The checked data.json of `directory`: a JSON object of format `fmt` and version `version` (or one
    of several readable versions) holding every `required` key; DataError (naming the file) otherwise. `kind` names the directory
    type in the messages ("multibranch", "classification")."""
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        hint = "" if directory.is_dir() else " (the directory does not exist)"
        raise DataError(f"{meta_path}: not found{hint}; create the directory with `multibranch prepare`")
    meta = read_json_object(meta_path, DataError, AGAIN)
    if meta.get("format") != fmt:
        found = meta.get("format")
        raise DataError(f"{meta_path}: not a {kind} data directory (format {found!r})")
    versions = version if isinstance(version, tuple) else (version,)
    if meta.get("format_version") not in versions:
        raise DataError(f"{meta_path}: format version {meta.get('format_version')} but this multibranch "
                        f"reads version {' or '.join(map(str, versions))}; {AGAIN}")
    for key in required:
        if key not in meta:
            raise DataError(f"{meta_path}: corrupted (missing {key!r}); {AGAIN}")
    return meta


def require_examples(directory: str | Path, split: str, examples: int) -> None:
    """DataError (one line) when the prepared `split` of `directory` holds no example: training would
    divide by zero at its first validation, an analysis would have nothing to score. Today's `prepare`
    refuses an empty --valid; a directory prepared by an older version may still hold one."""
    if examples == 0:
        flag = "--test" if split.startswith("test") else f"--{split}"
        raise DataError(f"{directory}: the {split} split is empty (0 examples); {AGAIN} with a non-empty {flag}")
