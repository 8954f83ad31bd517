"""NpyFile (data/npy_file.py) against numpy's own reading of the same .npy files."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from multibranch.data.npy_file import NpyFile
from multibranch.errors import DataError


@pytest.fixture
def saved(tmp_path):
    values = np.random.default_rng(0).integers(-1000, 1000, 5000).astype(np.int32)
    path = tmp_path / "tokens.npy"
    np.save(path, values)
    return path, values


def test_slices_scalars_and_whole_array_equal_numpy(saved):
    path, values = saved
    array = NpyFile.open(path)
    assert len(array) == 5000 and array.shape == (5000,) and array.dtype == np.int32 and array.ndim == 1
    for key in (slice(0, 10), slice(4990, 6000), slice(100, 100), slice(-7, None), slice(10, 50, 3)):
        assert array[key].tolist() == values[key].tolist()
    for i in (0, 1, 4999, -1, -5000, np.int64(17)):
        assert array[i] == values[i]
    assert np.asarray(array).tolist() == values.tolist()
    assert np.asarray(array, dtype=np.int64).dtype == np.int64
    assert np.diff(np.asarray(array)).tolist() == np.diff(values).tolist()


def test_integer_array_indexing_equals_numpy_for_runs_repeats_and_shapes(saved):
    path, values = saved
    array = NpyFile.open(path)
    rng = np.random.default_rng(1)
    starts = rng.integers(0, 4900, 40)
    runs = np.concatenate([np.arange(s, s + rng.integers(1, 60)) for s in starts])  # runs, in random order
    for positions in (runs, runs[::-1], np.array([5, 5, 5, 4, 3]), np.array([], dtype=np.int64),
                      rng.integers(0, 5000, (30, 2)), np.array([4999])):
        assert array[positions].tolist() == values[positions].tolist()
        assert array[positions].shape == values[positions].shape


def test_out_of_range_and_wrong_index_types_raise(saved):
    array = NpyFile.open(saved[0])
    for bad in (5000, -5001):
        with pytest.raises(IndexError):
            array[bad]
    with pytest.raises(IndexError):
        array[np.array([0, 5000])]
    with pytest.raises(IndexError):
        array[np.array([0.5])]


def test_a_copy_reads_the_same_and_no_descriptor_stays_open(saved):
    """Pickled into another process it reads the same; it holds no open file between reads (a corpus of
    hundreds of shards would otherwise run out of descriptors)."""
    path, values = saved
    array = NpyFile.open(path)

    def open_files() -> set[str]:
        return {os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")} \
            if os.path.isdir("/proc/self/fd") else set()

    before = open_files()
    array[0:3], array[np.array([1, 9, 10])], np.asarray(array)
    copy = pickle.loads(pickle.dumps(array))
    assert copy[10:20].tolist() == values[10:20].tolist()
    assert str(path.resolve()) not in open_files() - before


def test_truncated_or_malformed_files_are_refused(saved, tmp_path):
    path, _ = saved
    short = tmp_path / "short.npy"
    short.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError, match="needs"):
        NpyFile.open(short)
    matrix = tmp_path / "matrix.npy"
    np.save(matrix, np.zeros((3, 4), np.int32))
    with pytest.raises(ValueError, match="1-d"):
        NpyFile.open(matrix)
    text = tmp_path / "text.npy"
    text.write_text("not an array")
    with pytest.raises(ValueError):
        NpyFile.open(text)
    opened = NpyFile.open(path)
    path.write_bytes(path.read_bytes()[:200])  # shrinks after it was opened
    with pytest.raises(DataError, match="truncated while reading"):
        opened[np.array([10, 4000])]
