"""A shard of several is checked when first read: decreasing offsets when its lengths are computed, ids outside
the vocabulary when its tokens are first read; the other shards load and read as before."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from multibranch.data.batching import collate
from multibranch.data.parallel_prepare import PrepareConfig
from multibranch.errors import DataError
from multibranch.tasks.translation.dataset import PreparedData
from multibranch.tasks.translation.prepare import prepare
from multibranch.tasks.translation.synthetic import generate_synthetic_task


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shard_checks")
    generate_synthetic_task(root / "raw", seed=3, n_train=300, n_valid=8, n_test=4)
    prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(root / "raw" / "train"),
                          valid=str(root / "raw" / "valid"), test=[str(root / "raw" / "test")],
                          out=str(root / "data"), vocab_size=200, shard_pairs=100))
    return root / "data"


def test_an_id_outside_the_vocabulary_is_refused_when_its_shard_is_first_read(sharded, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(sharded, copy)
    tokens = np.load(copy / "train.2.src.tokens.npy", mmap_mode="r+")
    tokens[7] = 200
    tokens.flush()
    split = PreparedData.load(copy).split("train")  # no shard's tokens read yet
    first = collate(split, np.arange(0, 4))
    assert first.src.shape[0] == 4
    with pytest.raises(DataError, match=r"train\.2\.src\.tokens\.npy: corrupted \(token 7 has id 200, outside the "
                                        r"vocabulary of 200 ids\)"):
        collate(split, np.arange(split.starts[2], split.starts[2] + 4))


def test_decreasing_offsets_are_refused_when_the_shard_lengths_are_computed(sharded, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(sharded, copy)
    offsets = np.load(copy / "train.1.tgt.offsets.npy", mmap_mode="r+")
    offsets[3], offsets[4] = int(offsets[4]), int(offsets[3])
    offsets.flush()
    lengths = PreparedData.load(copy).split("train").shard_lengths()
    assert len(lengths[0][0]) == 100
    with pytest.raises(DataError, match=r"train\.1\.tgt\.offsets\.npy: corrupted \(offsets decrease"):
        lengths[1]
