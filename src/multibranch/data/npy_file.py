"""A one-dimensional `.npy` array read from its file on demand (`os.pread`), never memory-mapped.

Training reads a few hundred short token runs per batch from shards of hundreds of megabytes. Through a
memory map every page it touches stays mapped into the process, and recent Linux kernels map whole large
folios (up to megabytes) per fault, so after a few batches whole shard files count in `train`'s RSS and an
epoch maps the whole corpus (docs/scale.md). Reading just the bytes a batch needs keeps the process's
memory independent of the corpus; the kernel's page cache still serves repeated reads.

    tokens = NpyFile.open("data/train.src.tokens.npy")
    tokens[10:20], tokens[np.array([3, 4, 5, 90])], np.asarray(tokens)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from multibranch.errors import DataError


class NpyFile:
    """A read-only 1-d array stored in a `.npy` file: slicing, integer indexing and integer-array indexing
    read the needed bytes; `np.asarray` reads it all."""

    ndim = 1

    def __init__(self, path: Path, dtype: np.dtype, length: int, data_offset: int) -> None:
        self.path, self.dtype, self.length, self.data_offset = path, dtype, length, data_offset

    @classmethod
    def open(cls, path: str | Path) -> NpyFile:
        """Read the header; ValueError when the file is not a 1-d C-order `.npy` array or is shorter than the
        header says (truncated)."""
        path = Path(path)
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f".npy format version {version} is not read here (1.0 and 2.0 are)")
            shape, fortran_order, dtype = read_header(handle)
            data_offset = handle.tell()
        if len(shape) != 1 or (fortran_order and shape[0] > 1) or dtype.hasobject:
            raise ValueError(f"expected a 1-d numeric array, found shape {shape} of {dtype}")
        size = path.stat().st_size
        if size < data_offset + shape[0] * dtype.itemsize:
            raise ValueError(f"{size} bytes, but the header's {shape[0]} x {dtype} needs "
                             f"{data_offset + shape[0] * dtype.itemsize}")
        return cls(path, dtype, shape[0], data_offset)

    @property
    def shape(self) -> tuple[int]:
        return (self.length,)

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"NpyFile({str(self.path)!r}, {self.length} x {self.dtype})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = self._read(0, self.length)
        return values if dtype is None else values.astype(dtype, copy=False)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)):
            i = int(key) + (self.length if key < 0 else 0)
            if not 0 <= i < self.length:
                raise IndexError(f"index {int(key)} out of range for {self!r}")
            return self._read(i, 1)[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(self.length)
            if step == 1:
                return self._read(start, max(stop - start, 0))
            return np.asarray(self)[key]
        return self._gather(np.asarray(key))

    def _gather(self, positions: np.ndarray) -> np.ndarray:
        """The values at integer `positions` (any shape): one read per run of consecutive positions."""
        if not np.issubdtype(positions.dtype, np.integer):
            raise IndexError(f"{self!r} takes integer positions, not {positions.dtype}")
        flat = positions.reshape(-1).astype(np.int64, copy=False)
        if len(flat) == 0:
            return np.empty(positions.shape, self.dtype)
        if int(flat.min()) < 0 or int(flat.max()) >= self.length:
            raise IndexError(f"positions {int(flat.min())}..{int(flat.max())} out of range for {self!r}")
        breaks = np.flatnonzero(np.diff(flat) != 1) + 1  # where a new run of consecutive positions starts
        firsts = np.concatenate([[0], breaks])  # [R] into flat
        counts = np.diff(np.concatenate([firsts, [len(flat)]]))  # [R]
        size = self.dtype.itemsize
        byte_offsets = (self.data_offset + flat[firsts] * size).tolist()
        with self._opened() as fd:
            chunks = [self._read_at(fd, offset, count * size) for offset, count in zip(byte_offsets, counts.tolist())]
        return np.frombuffer(b"".join(chunks), self.dtype).reshape(positions.shape)

    def _read(self, start: int, count: int) -> np.ndarray:
        """Elements start .. start + count - 1 (a read-only array, as a read-only memory map's would be)."""
        return np.frombuffer(self._read_bytes(start, count), self.dtype)

    def _read_bytes(self, start: int, count: int) -> bytes:
        with self._opened() as fd:
            return self._read_at(fd, self.data_offset + start * self.dtype.itemsize, count * self.dtype.itemsize)

    @contextmanager
    def _opened(self) -> Iterator[int]:
        """A descriptor for one read operation. None is kept open between operations: a corpus in many shards
        would otherwise hold four per shard, past the usual limit of 1024 open files."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            yield fd
        finally:
            os.close(fd)

    def _read_at(self, fd: int, offset: int, wanted: int) -> bytes:
        """`wanted` bytes of the open file `fd` from byte `offset`."""
        data = os.pread(fd, wanted, offset)
        while len(data) < wanted:  # a short read: the rest, or the file shrank under us
            more = os.pread(fd, wanted - len(data), offset + len(data))
            if not more:
                raise DataError(f"{self.path}: truncated while reading ({wanted} bytes at byte {offset}); "
                                "run `multibranch prepare` again")
            data += more
        return data
