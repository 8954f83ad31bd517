"""Streaming, sharded `prepare`: shards equal one unsharded pass and SentencePiece's own encoding, the
loader refuses a missing or truncated shard by name, bad input deep in a file is reported with
file:line, an interrupt leaves nothing behind, and training resumes exactly across shard boundaries."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from multibranch import cli
from multibranch.data import shards as shards_module
from multibranch.data.batching import collate
from multibranch.data.parallel_prepare import PrepareConfig
from multibranch.errors import DataError
from multibranch.tasks import train
from multibranch.tasks.translation.dataset import PreparedData, ShardedSplit
from multibranch.tasks.translation.prepare import prepare
from multibranch.tasks.translation.synthetic import generate_synthetic_task
from multibranch.train.trainer import RunOptions
from tests.helpers.cli import one_error_line
from tests.helpers.configs import tiny_experiment


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("raw")
    generate_synthetic_task(root, seed=3, n_train=400, n_valid=24, n_test=24)
    return root


def _cfg(raw: Path, out: Path, **overrides) -> PrepareConfig:
    values = dict(src_lang="src", tgt_lang="tgt", train=str(raw / "train"), valid=str(raw / "valid"),
                  test=[str(raw / "test")], out=str(out), vocab_size=200)
    values.update(overrides)
    return PrepareConfig(**values)


@pytest.fixture(scope="module")
def sharded(raw, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sharded") / "data"
    prepare(_cfg(raw, out, shard_pairs=100, chunk_lines=37, workers=2))
    return out


def test_shards_equal_one_pass_and_sentencepiece(raw, sharded, tmp_path):
    whole = tmp_path / "whole"
    prepare(_cfg(raw, whole, workers=1))
    meta = json.loads((sharded / "data.json").read_text())
    names = [s["name"] for s in meta["splits"]["train"]["shards"]]
    assert names == ["train", "train.1", "train.2", "train.3"] and meta["format_version"] == 2
    assert (sharded / "spm.model").read_bytes() == (whole / "spm.model").read_bytes()
    for side in ("src", "tgt"):  # the shards' arrays, joined, are the unsharded arrays
        tokens = np.concatenate([np.load(sharded / f"{n}.{side}.tokens.npy") for n in names])
        assert tokens.tolist() == np.load(whole / f"train.{side}.tokens.npy").tolist()
    split = PreparedData.load(sharded).split("train")
    assert isinstance(split, ShardedSplit) and len(split) == meta["splits"]["train"]["pairs"]
    sp = spm.SentencePieceProcessor(model_file=str(sharded / "spm.model"))
    lines = split.raw_src_lines()
    for i in range(0, len(split), 13):
        assert split.src(i).tolist() == sp.encode(lines[i])
    whole_meta = json.loads((whole / "data.json").read_text())
    for key in ("pairs", "dropped", "tokens", "length", "unk_rate"):
        assert meta["splits"]["train"][key] == whole_meta["splits"]["train"][key]
    PreparedData.load(sharded).verify()


def _mapped_files(directory) -> list[str]:
    """This process's memory mappings of files under `directory` (Linux /proc)."""
    return [line.split()[-1] for line in open("/proc/self/maps") if str(directory) in line]


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc/self/maps")
def test_shards_are_read_not_mapped_and_their_lengths_computed_one_at_a_time(sharded):
    split = PreparedData.load(sharded).split("train")
    before = [split.src(i).tolist() for i in range(0, len(split), 7)]
    batch = collate(split, np.arange(split.starts[1], split.starts[1] + 5))
    assert batch.src.shape[0] == 5
    assert _mapped_files(sharded) == []  # nothing of the corpus counts in this process's RSS
    lengths = split.shard_lengths()
    assert len(lengths) == 4 and not isinstance(lengths, list)  # computed when indexed, never all at once
    for k, (src, tgt) in enumerate(lengths):
        shard = split.shards[k]
        assert src.tolist() == [len(shard.src(i)) for i in range(len(shard))]
        assert tgt.tolist() == [len(shard.tgt(i)) for i in range(len(shard))]
    assert [split.src(i).tolist() for i in range(0, len(split), 7)] == before


def test_missing_or_truncated_shard_is_refused_by_name(sharded, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(sharded, copy)
    path = copy / "train.2.tgt.tokens.npy"
    path.write_bytes(path.read_bytes()[:-40])  # truncated
    with pytest.raises(DataError, match="train.2.tgt"):
        PreparedData.load(copy).split("train")
    path.unlink()
    with pytest.raises(DataError, match="train.2.tgt.tokens.npy: missing"):
        PreparedData.load(copy).split("train")


def test_train_resumes_exactly_across_shards(sharded, tmp_path):
    cfg = dict(max_steps=16, deterministic=True, max_tokens=300)  # ~10 batches an epoch over 4 shards
    train(tiny_experiment(**cfg), RunOptions(sharded, tmp_path / "straight"))
    train(tiny_experiment(**{**cfg, "max_steps": 7}), RunOptions(sharded, tmp_path / "legs"))
    train(tiny_experiment(**cfg), RunOptions(sharded, tmp_path / "legs", resume=True))

    def losses(run: Path) -> dict[int, float]:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in records if r["type"] == "train"}

    assert losses(tmp_path / "legs") == losses(tmp_path / "straight") and len(losses(tmp_path / "legs")) == 16


def _write(prefix: Path, src: list[bytes], tgt: list[bytes]) -> str:
    Path(f"{prefix}.src").write_bytes(b"".join(line + b"\n" for line in src))
    Path(f"{prefix}.tgt").write_bytes(b"".join(line + b"\n" for line in tgt))
    return str(prefix)


@pytest.mark.parametrize("problem", ["utf8", "count", "utf8-one-pass"])
def test_bad_input_deep_in_a_file_names_file_and_line(raw, sharded, tmp_path, capsys, problem):
    src = [f"w{i} x y".encode() for i in range(3000)]
    tgt = [f"v{i} z".encode() for i in range(3000)]
    if problem.startswith("utf8"):
        tgt[2345] = b"bad \xff byte"
    else:
        tgt = tgt[:-1]
    train_prefix = _write(tmp_path / "big", src, tgt)
    out = tmp_path / "data"
    code = cli.main(["prepare", "--src", "src", "--tgt", "tgt", "--train", train_prefix, "--valid",
                     str(raw / "valid"), "--out", str(out),
                     *(["--spm-model", str(sharded / "spm.model")] if problem == "utf8-one-pass" else [])])
    assert code == 2
    err = one_error_line(capsys)
    expected = "big.tgt:2346: invalid UTF-8" if problem.startswith("utf8") else "line 3000 exists only in"
    assert expected in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.src", "big.tgt"]  # nothing written


def test_interrupt_while_writing_leaves_nothing(raw, tmp_path, monkeypatch):
    calls = []
    add = shards_module.SplitWriter.add

    def interrupted(self, *args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return add(self, *args)

    monkeypatch.setattr(shards_module.SplitWriter, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(_cfg(raw, tmp_path / "data", chunk_lines=50, shard_pairs=60))
    assert [p.name for p in tmp_path.iterdir()] == []  # no output, no temporary sibling


def test_progress_bar_when_asked(raw, tmp_path, capsys):
    prepare(_cfg(raw, tmp_path / "data", progress=True))
    err = capsys.readouterr().err
    assert "prepare: reading" in err and "prepare: encoding" in err and "lines" in err


def test_a_version_1_directory_still_loads(raw, tmp_path):
    out = tmp_path / "data"
    prepare(_cfg(raw, out))
    meta = json.loads((out / "data.json").read_text())
    for entry in meta["splits"].values():
        del entry["shards"]  # version 1: one unnamed shard per split, files named like the split
    (out / "data.json").write_text(json.dumps({**meta, "format_version": 1}))
    data = PreparedData.load(out)
    data.verify()
    assert len(data.split("train")) == meta["splits"]["train"]["pairs"]


def test_full_disk_while_writing_a_shard_is_one_line(raw, tmp_path, monkeypatch, capsys):
    import errno
    import os

    def full(self, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shards_module.SplitWriter, "_flush", full)
    code = cli.main(["prepare", "--src", "src", "--tgt", "tgt", "--train", str(raw / "train"), "--valid",
                     str(raw / "valid"), "--out", str(tmp_path / "data"), "--vocab-size", "200"])
    assert code == 2 and "no space left on device" in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []
