"""Atomic file output: write a temporary file beside the target, fsync it, rename it over the target.

A reader never sees a half-written file. A crash (even `kill -9`) leaves the previous file, or none,
and at worst a temporary named `.NAME.<random>.tmp` in the same directory, which
`remove_stale_temporaries` deletes on the next start. New files get the ordinary mode
(0o666 minus the umask), not the 0o600 of `tempfile.mkstemp`; an overwritten file keeps its mode.

    with atomic_write("out.txt", "w", encoding="utf-8") as handle:
        handle.write(text)          # out.txt appears (or is replaced) only if this block succeeds
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TMP_SUFFIX = ".tmp"


def _new_file_mode(path: Path) -> int:
    """The mode the written file should have: the existing file's, else 0o666 minus the umask."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def fsync_directory(directory: Path) -> None:
    """Make a rename inside `directory` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb", encoding: str | None = None) -> Iterator[IO[Any]]:
    """Open a temporary file beside `path` for writing; on success it is fsynced and renamed to `path`.

    On any exception (including KeyboardInterrupt) the temporary file is removed and `path` is left
    as it was. The parent directory must exist.
    """
    if "w" not in mode or "+" in mode:
        raise ValueError(f"atomic_write needs a write-only mode ('w' or 'wb'), got {mode!r}")
    path = Path(path)
    file_mode = _new_file_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        os.fchmod(fd, file_mode)
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_write(path, "wb") as handle:
        handle.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write UTF-8 text atomically (no newline translation)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def stale_temporaries(directory: str | Path) -> list[Path]:
    """Temporaries that an interrupted `atomic_write` left in `directory` (`.NAME.<random>.tmp`)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob(f".*{TMP_SUFFIX}") if p.is_file())


def remove_stale_temporaries(directory: str | Path) -> list[Path]:
    """Delete the temporaries of interrupted writes in `directory`; returns what was removed.

    Only call this where no other process is writing into `directory` at the same time.
    """
    removed = []
    for path in stale_temporaries(directory):
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed
