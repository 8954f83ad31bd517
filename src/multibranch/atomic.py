"""Atomic file output: write a temporary file beside the target, fsync it, rename it over the target.

A reader never sees a half-written file. A crash (even `kill -9`) leaves the previous file, or none,
and at worst a temporary named `.NAME.<random>.tmp` in the same directory, which
`remove_stale_temporaries` deletes on the next start. New files get the ordinary mode
(0o666 minus the umask), not the 0o600 of `tempfile.mkstemp`; an overwritten file keeps its mode.

    with atomic_write("out.txt", "w", encoding="utf-8") as handle:
        handle.write(text)          # out.txt appears (or is replaced) only if this block succeeds

Whole output directories (prepared data, CTranslate2 exports) are built the same way in a temporary
sibling directory that replaces the target only when complete (`atomic_directory`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from multibranch.errors import UserError

TMP_SUFFIX = ".tmp"
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(UserError):
    """A write failed because the device is full (ENOSPC) or the disk quota is used up (EDQUOT)."""


def full_disk_cause(error: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT OSError behind `error` (itself, or in its __cause__/__context__ chain: torch.save
    turns a failed write into a RuntimeError whose context is the OSError); None if there is none."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in FULL_DISK_ERRNOS:
            return current
        current = current.__cause__ or current.__context__
    return None


def full_disk_error(path: str | Path, cause: OSError) -> DiskFullError:
    """The one-line error for a write to `path` that found the device full."""
    what = "disk quota exceeded" if cause.errno == errno.EDQUOT else "no space left on device"
    return DiskFullError(f"cannot write {path}: {what}; nothing was replaced: free some space (or choose another "
                         "location) and run again")


def _interrupted_by(error: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (or Terminated) that is `error` or hides in its chain (torch.save wraps it in a
    RuntimeError); None if there is none."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, KeyboardInterrupt):
            return current
        current = current.__cause__ or current.__context__
    return None


@contextlib.contextmanager
def reporting_full_disk(path: str | Path) -> Iterator[None]:
    """Turn an ENOSPC/EDQUOT failure inside the block into a DiskFullError naming `path`."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as error:
        cause = full_disk_cause(error)
        if cause is None:
            raise
        raise full_disk_error(path, cause) from error


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _new_file_mode(path: Path) -> int:
    """The mode the written file should have: the existing file's, else 0o666 minus the umask."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


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
    as it was. The parent directory must exist. A full device (ENOSPC/EDQUOT, also wrapped as torch.save
    wraps it) becomes a DiskFullError naming `path`; a KeyboardInterrupt wrapped in another exception
    becomes a plain KeyboardInterrupt again (the CLI's clean "interrupted" exit).
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
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        _raise_plain(error, path)
        raise
    fsync_directory(path.parent)


def _raise_plain(error: BaseException, path: Path) -> None:
    """Re-raise a wrapped KeyboardInterrupt as itself and a full disk as a DiskFullError; else return."""
    if isinstance(error, (KeyboardInterrupt, DiskFullError)):
        return
    interrupt = _interrupted_by(error)
    if interrupt is not None:
        raise type(interrupt)(*interrupt.args) from None
    cause = full_disk_cause(error)
    if cause is not None:
        raise full_disk_error(path, cause) from error


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


def _temporary_names(name: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The names of this module's temporaries for an output called `name`: the files of `atomic_write`
    (`.NAME.<random>.tmp`) and the directories of `atomic_directory` (`.NAME.tmp-<random>`); and the
    directory that holds a replaced output until the new one is in place (`.NAME.old-<random>`)."""
    random = "[a-z0-9_]{8}"  # what tempfile puts in a name
    escaped = re.escape(name)
    return (re.compile(rf"\.{escaped}\.(?:{random}{re.escape(TMP_SUFFIX)}|tmp-{random})"),
            re.compile(rf"\.{escaped}\.old-{random}"))


def remove_stale_output_temporaries(out: str | Path) -> list[Path]:
    """Delete what a killed writer of `out` left beside it: the temporaries that `atomic_write` and
    `atomic_directory` name after `out` (nothing else), and a replaced output's `.old-` directory once `out`
    is in place again (without `out`, that directory may hold the only copy and stays). Returns what was
    removed. Only call this where no other process is writing `out` at the same time.
    """
    out = Path(out)
    temporary, old = _temporary_names(out.name)
    try:
        siblings = sorted(out.parent.iterdir()) if out.name else []
    except OSError:  # no such directory (yet), or not readable: nothing of ours there
        return []
    removed = []
    for path in siblings:
        if temporary.fullmatch(path.name) or (old.fullmatch(path.name) and out.exists()):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


@contextlib.contextmanager
def atomic_directory(out: str | Path) -> Iterator[Path]:
    """Yield an empty temporary sibling directory of `out`; on success it replaces `out`.

    The caller fills the yielded directory. An existing `out` is moved aside only once the new one is
    complete, and restored if the final rename fails; on any exception the temporary directory is
    removed and `out` is left as it was. The new directory gets mkdir's ordinary mode.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private
        yield tmp
        _swap_directory(tmp, out)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        _raise_plain(error, out)
        raise


def _swap_directory(tmp: Path, out: Path) -> None:
    """Move the finished `tmp` to `out`, replacing an existing `out` only after `tmp` is complete."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, old / out.name)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old / out.name, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
