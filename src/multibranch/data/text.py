"""Reading raw text the way a parallel corpus needs it: byte-exact lines, strict UTF-8, aligned pairs.

Line rules (the same for every file the toolkit reads as a corpus):

- files are read as bytes and split on `\\n` only, so U+2028, U+2029, U+0085, form feeds and lone
  `\\r` inside a line never split it (Python's `str.splitlines` and universal newlines would);
- one trailing `\\r` per line is removed (CRLF files), a UTF-8 BOM at the start of the file is removed;
- a final newline does not create an extra (empty) line;
- decoding is strict UTF-8 unless the caller opts into `"replace"`, which substitutes U+FFFD and
  counts the affected lines.

Errors are `DataError`s naming the file, the line and the fix.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from multibranch.atomic import DiskFullError, atomic_write
from multibranch.errors import DataError

EncodingErrors = Literal["strict", "replace"]
ENCODING_ERRORS = ("strict", "replace")
BOM = b"\xef\xbb\xbf"
logger = logging.getLogger(__name__)


@dataclass
class TextLines:
    """The decoded lines of one file and how many of them needed byte replacement."""

    path: Path
    lines: list[str]
    replaced: int = 0

    def __len__(self) -> int:
        return len(self.lines)


@dataclass
class ParallelText:
    """Two line-aligned files: `src.lines[i]` translates to `tgt.lines[i]`."""

    src: TextLines
    tgt: TextLines

    def __len__(self) -> int:
        return len(self.src)


def file_problem(path: str | Path) -> str | None:
    """Why `path` cannot be read as a text file ("file not found", "is a directory", ...), or None."""
    path = Path(path)
    if path.is_dir():
        return "is a directory, expected a text file"
    if not path.exists():
        return "file not found"
    if not path.is_file():
        return "not a regular file"
    return None


def check_input_file(path: str | Path) -> None:
    """Raise a DataError naming `path` unless it is a readable regular file."""
    problem = file_problem(path)
    if problem is not None:
        raise DataError(f"{path}: {problem}")


def _read_bytes(path: Path) -> bytes:
    check_input_file(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror or err})") from None
    return data[len(BOM) :] if data.startswith(BOM) else data


def _count_lines(data: bytes) -> int:
    """Number of lines under the rules above (a final newline does not start a new line)."""
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def _split(text: str) -> list[str]:
    """Split decoded text on `\\n` only and drop one trailing `\\r` per line."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _utf8_error(path: Path, data: bytes, err: UnicodeDecodeError) -> DataError:
    start = err.start
    line_no = data.count(b"\n", 0, start) + 1
    line_start = data.rfind(b"\n", 0, start) + 1
    column = len(data[line_start:start].decode("utf-8", errors="replace")) + 1
    return DataError(
        f"{path}:{line_no}: invalid UTF-8 (byte 0x{data[start]:02x} at column {column}); "
        "fix the file or pass --encoding-errors replace"
    )


def _decode(path: Path, data: bytes, encoding_errors: str) -> TextLines:
    if encoding_errors not in ENCODING_ERRORS:
        raise ValueError(f"encoding_errors must be one of {ENCODING_ERRORS}, got {encoding_errors!r}")
    try:
        return TextLines(path, _split(data.decode("utf-8")))
    except UnicodeDecodeError as err:
        if encoding_errors == "strict":
            raise _utf8_error(path, data, err) from None
    # Replace mode with at least one bad byte: decode line by line to count the affected lines.
    raw = data.split(b"\n")
    if data.endswith(b"\n"):
        raw.pop()
    lines, replaced = [], 0
    for chunk in raw:
        try:
            line = chunk.decode("utf-8")
        except UnicodeDecodeError:
            line = chunk.decode("utf-8", errors="replace")
            replaced += 1
        lines.append(line[:-1] if line.endswith("\r") else line)
    return TextLines(path, lines, replaced)


def read_lines(path: str | Path, *, encoding_errors: EncodingErrors = "strict") -> TextLines:
    """Read one text file into lines (see the module docstring for the rules)."""
    path = Path(path)
    return _decode(path, _read_bytes(path), encoding_errors)


def read_parallel(
    src_path: str | Path, tgt_path: str | Path, *, encoding_errors: EncodingErrors = "strict"
) -> ParallelText:
    """Read two line-aligned files; unequal line counts raise a DataError naming the first extra line."""
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    problems = [f"{p}: {file_problem(p)}" for p in (src_path, tgt_path) if file_problem(p)]
    if problems:
        raise DataError("; ".join(problems))
    src_data, tgt_data = _read_bytes(src_path), _read_bytes(tgt_path)
    n_src, n_tgt = _count_lines(src_data), _count_lines(tgt_data)
    if n_src != n_tgt:
        longer = src_path if n_src > n_tgt else tgt_path
        first = min(n_src, n_tgt) + 1
        raise DataError(
            f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has {n_tgt}; "
            f"line {first} exists only in {longer}. Line i of one file must translate line i of the other: "
            "look for a missing or extra line (or a U+2028 / \\r that another tool treated as a line break)"
        )
    return ParallelText(_decode(src_path, src_data, encoding_errors), _decode(tgt_path, tgt_data, encoding_errors))


def write_lines(path: str | Path, lines: Iterable[str]) -> None:
    """Write lines as UTF-8, each terminated by `\\n` (lines must not contain `\\n`), atomically."""
    with atomic_write(path, "wb") as handle:
        for line in lines:
            if "\n" in line:
                raise ValueError(f"{path}: a line contains a newline: {line[:60]!r}")
            handle.write(line.encode("utf-8") + b"\n")


# ---- streaming (translate / evaluate read stdin or files line by line) ---------------------------


def one_line(text: str) -> str:
    """Keep the one-line-per-input contract even if a detokenised string holds a line break."""
    return text.replace("\r", " ").replace("\n", " ")


def iter_lines(stream: BinaryIO, name: str, errors: str = "strict") -> Iterator[str]:
    """Lines of a binary stream under the same rules as `read_lines`, without reading it whole.

    errors="strict" raises DataError naming `name:line`; "replace" substitutes U+FFFD and warns once
    at the end with the number of affected lines.
    """
    replaced = 0
    for lineno, raw in enumerate(stream, start=1):  # binary iteration splits on b"\n" only
        if lineno == 1 and raw.startswith(BOM):
            raw = raw[len(BOM) :]
        raw = raw[:-1] if raw.endswith(b"\n") else raw
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as err:
            if errors != "replace":
                column = len(raw[: err.start].decode("utf-8", errors="replace")) + 1
                raise DataError(
                    f"{name}:{lineno}: invalid UTF-8 (byte 0x{raw[err.start]:02x} at column {column}); "
                    "convert the input to UTF-8 or pass --encoding-errors replace"
                ) from None
            replaced += 1
            yield raw.decode("utf-8", errors="replace")
    if replaced:
        logger.warning("%s: replaced invalid UTF-8 in %d line(s)", name, replaced)


@contextmanager
def open_input(path: str) -> Iterator[BinaryIO]:
    """A binary stream for `path` ('-' = stdin)."""
    if path != "-":
        check_input_file(path)
        with open(path, "rb") as handle:
            yield handle
        return
    buffer = getattr(sys.stdin, "buffer", None)
    yield buffer if buffer is not None else io.BytesIO(sys.stdin.read().encode("utf-8"))


def same_file(a: str | Path, b: str | Path) -> bool:
    """True if both paths exist and name the same file (links and different spellings included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output_file(path: str, inputs: Iterable[str] = (), parent_must_exist: bool = True) -> None:
    """Refuse an output path that names one of `inputs` (also through links or another spelling), a
    directory, or (unless the caller creates it) a file in a missing directory. '-' (stdout) passes."""
    if path == "-":
        return
    for source in inputs:
        if source != "-" and same_file(path, source):
            raise DataError(f"{path}: output is the same file as input {source}; write to another file")
    target = Path(path)
    if target.is_dir():
        raise DataError(f"{path}: is a directory, expected an output file")
    if parent_must_exist and not target.parent.is_dir():
        what = "is not a directory" if target.parent.exists() else "does not exist"
        raise DataError(f"{path}: {target.parent} {what}")


def refuse_existing_output(path: str, force: bool) -> None:
    """FileExistsError (one line in the CLI) if the output file `path` exists and not `force`; '-' passes."""
    if path != "-" and Path(path).exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force to overwrite it")


SPACE_MARGIN = 1 << 20  # bytes kept free beyond an output's expected size


def check_can_write(path: str, expected_bytes: int = 0) -> None:
    """Before a long computation whose result goes to `path`: its directory must be writable and hold
    about `expected_bytes` (plus SPACE_MARGIN) of free space; DataError / DiskFullError naming the path.
    '-' (stdout) passes. A check, not a promise: the disk may still fill up while the work runs."""
    if path == "-":
        return
    directory = Path(path).parent
    if not os.access(directory, os.W_OK | os.X_OK):
        raise DataError(f"{path}: cannot write to directory {directory} (permission denied)")
    try:
        free = shutil.disk_usage(directory).free
    except OSError:  # a file system that does not say
        return
    if free < expected_bytes + SPACE_MARGIN:
        raise DiskFullError(f"cannot write {path}: no space left on device ({free / 2**20:.1f} MiB free in "
                            f"{directory}, about {(expected_bytes + SPACE_MARGIN) / 2**20:.1f} MiB needed); free "
                            "some space or choose another location")


def scan_lines(path: str, errors: str = "strict") -> int:
    """Read a text file through once as `iter_lines` would: DataError naming the first line of invalid
    UTF-8 (errors="strict"), so a long job over it cannot fail half-way; returns its line count."""
    if errors != "strict":
        return count_lines(path) or 0
    with open_input(path) as stream:
        return sum(1 for _ in iter_lines(stream, path, errors))


def count_lines(path: str) -> int | None:
    """Lines of a regular input file (as `iter_lines` splits them), None for stdin or a non-file."""
    if path == "-" or not Path(path).is_file():
        return None
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


@contextmanager
def open_output(path: str) -> Iterator[BinaryIO]:
    """A binary stream for `path` ('-' = stdout, left open).

    A file is written atomically: to a temporary file beside it, renamed over `path` only when the
    block succeeds, so a failure leaves an existing `path` untouched.
    """
    if path != "-":
        check_output_file(path)
        with atomic_write(path, "wb") as handle:
            yield handle
        return
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is not None:
        yield buffer
        buffer.flush()
        return
    text = io.BytesIO()  # stdout replaced by a text-only stream (tests, notebooks)
    yield text
    sys.stdout.write(text.getvalue().decode("utf-8"))
    sys.stdout.flush()


# ---- streaming a parallel corpus in bounded chunks (prepare at any size) -------------------------


@dataclass
class ParallelChunk:
    """Up to `chunk_lines` aligned lines of two files; `first_line` is the 1-based number of the first."""

    first_line: int
    src: list[str]
    tgt: list[str]
    replaced: tuple[int, int] = (0, 0)

    def __len__(self) -> int:
        return len(self.src)


def _decode_chunk(path: Path, raw: list[bytes], first_line: int, encoding_errors: str) -> tuple[list[str], int]:
    """Decode raw lines (newline included) under the module's rules; DataError at path:line when strict."""
    if first_line == 1 and raw and raw[0].startswith(BOM):
        raw[0] = raw[0][len(BOM) :]
    try:
        return _split(b"".join(raw).decode("utf-8") + ("" if raw[-1].endswith(b"\n") else "\n")), 0
    except UnicodeDecodeError:
        pass
    lines, replaced = [], 0
    for offset, chunk in enumerate(raw):
        chunk = chunk[:-1] if chunk.endswith(b"\n") else chunk
        try:
            line = chunk.decode("utf-8")
        except UnicodeDecodeError as err:
            if encoding_errors == "strict":
                column = len(chunk[: err.start].decode("utf-8", errors="replace")) + 1
                raise DataError(f"{path}:{first_line + offset}: invalid UTF-8 (byte 0x{chunk[err.start]:02x} at "
                                f"column {column}); fix the file or pass --encoding-errors replace") from None
            line = chunk.decode("utf-8", errors="replace")
            replaced += 1
        lines.append(line[:-1] if line.endswith("\r") else line)
    return lines, replaced


def iter_parallel(src_path: str | Path, tgt_path: str | Path, chunk_lines: int = 65536, *,
                  encoding_errors: EncodingErrors = "strict") -> Iterator[ParallelChunk]:
    """Read two line-aligned files in chunks of `chunk_lines` pairs, in constant memory, under the same
    rules and with the same errors as `read_parallel` (invalid UTF-8 as file:line, unequal line counts
    naming the first extra line), each raised as soon as the chunk holding it is read."""
    if encoding_errors not in ENCODING_ERRORS:
        raise ValueError(f"encoding_errors must be one of {ENCODING_ERRORS}, got {encoding_errors!r}")
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    problems = [f"{p}: {file_problem(p)}" for p in (src_path, tgt_path) if file_problem(p)]
    if problems:
        raise DataError("; ".join(problems))
    first = 1
    with open(src_path, "rb") as src, open(tgt_path, "rb") as tgt:
        while True:
            raw_src, raw_tgt = list(itertools.islice(src, chunk_lines)), list(itertools.islice(tgt, chunk_lines))
            if len(raw_src) != len(raw_tgt):
                _unequal_counts(src_path, tgt_path)
            if not raw_src:
                return
            src_lines, src_replaced = _decode_chunk(src_path, raw_src, first, encoding_errors)
            tgt_lines, tgt_replaced = _decode_chunk(tgt_path, raw_tgt, first, encoding_errors)
            yield ParallelChunk(first, src_lines, tgt_lines, (src_replaced, tgt_replaced))
            first += len(raw_src)


def _unequal_counts(src_path: Path, tgt_path: Path) -> None:
    n_src, n_tgt = count_lines(str(src_path)) or 0, count_lines(str(tgt_path)) or 0
    longer = src_path if n_src > n_tgt else tgt_path
    raise DataError(
        f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has {n_tgt}; "
        f"line {min(n_src, n_tgt) + 1} exists only in {longer}. Line i of one file must translate line i of the "
        "other: look for a missing or extra line (or a U+2028 / \\r that another tool treated as a line break)"
    )
