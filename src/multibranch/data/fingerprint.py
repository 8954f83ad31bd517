"""The fingerprint of a prepared data directory: sha256 over named files (each name, then its bytes), so that
loading can tell whether the files still are the ones `prepare` wrote."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def hash_files(directory: Path, names: Iterable[str], digest: Any = None) -> str:
    """The hex sha256 of `digest` (a fresh one by default) updated with each name (NUL-terminated) and the
    bytes of `directory / name`, in order."""
    digest = hashlib.sha256() if digest is None else digest
    for name in names:
        digest.update(name.encode() + b"\0")
        with open(directory / name, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
