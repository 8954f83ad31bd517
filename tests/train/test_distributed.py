"""Data parallelism with torchrun (2 gloo ranks on loopback) equals gradient accumulation in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers.configs import tiny_experiment


def _losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["type"] == "train"}


def _train(args: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.distributed
@pytest.mark.parametrize("length_buckets, port", [(None, 29517), (3, 29518)], ids=["ddp", "fixed-shapes"])
def test_two_ranks_equal_one_process_with_update_freq_two(tiny_data, tmp_path, length_buckets, port):
    """Without fixed shapes the ranks average their gradients through DDP; with them (the path of CUDA graphs),
    in one collective over the gradients' buffer after the backward, between the graphs."""
    cfg = tiny_experiment(max_steps=5, valid_every=5, length_buckets=length_buckets)
    cfg.model.dropout = 0.0  # per-rank dropout streams differ by design; compare the deterministic part
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    # gloo on the CPU on every machine (--device auto on a CUDA machine would take NCCL, one GPU per rank)
    common = ["train", "--data", str(tiny_data), "--config", str(config), "--threads", "1", "--no-progress",
              "--device", "cpu"]
    _train([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
            "-m", "multibranch", *common, "--out", str(tmp_path / "ddp")], tmp_path)
    _train([sys.executable, "-m", "multibranch", *common, "--out", str(tmp_path / "single"), "--update-freq", "2"],
           tmp_path)
    ddp, single = _losses(tmp_path / "ddp"), _losses(tmp_path / "single")
    assert sorted(ddp) == sorted(single) == [1, 2, 3, 4, 5]
    for step in ddp:
        assert ddp[step] == pytest.approx(single[step], rel=1e-5)
    assert (tmp_path / "ddp" / "last.pt").exists() and not (tmp_path / "ddp" / "checkpoints" / "rank1").exists()


def test_more_processes_a_node_than_gpus_is_a_config_error_before_joining(monkeypatch):
    """torchrun --nproc-per-node 2 on a one-GPU node with --device cuda: rank 1 would need GPU 1. One clear
    error before any process group is joined (faked here: this test needs no GPU)."""
    from multibranch.errors import ConfigError
    from multibranch.train import distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(distributed.dist, "init_process_group",
                        lambda *a, **k: pytest.fail("the process group was joined"))
    with pytest.raises(ConfigError, match="local rank 1 needs GPU 1, but this node has 1; start at most"):
        distributed.init_distributed("cuda")
