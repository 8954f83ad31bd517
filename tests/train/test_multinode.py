"""Multi-node data parallelism: two torchrun "nodes" (one process each, c10d rendezvous on loopback, gloo) train,
checkpoint once, resume exactly, and equal one process with the same global batch (gradient accumulation 2)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from multibranch.checkpoint.format import load_checkpoint
from tests.helpers.configs import tiny_experiment


def _losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["type"] == "train"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# gloo on the CPU on every machine: with --device auto a CUDA machine would take NCCL, which refuses two ranks on
# one GPU (and these "nodes" share this machine's)
GLOO = ["--device", "cpu"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}


def _start_nodes(train_args: list[str], cwd: Path, run_id: str) -> list[subprocess.Popen]:
    """Both "nodes" as separate torchrun launchers, as two hosts would start them. The second starts once the
    first one's rendezvous store accepts connections: two launchers racing to host the store on one address can
    leave one of them out of the rendezvous."""
    port = _free_port()
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
                "--rdzv-conf", "timeout=120", "-m", "multibranch", *train_args]
    first = subprocess.Popen(launcher, env=_env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and first.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    second = subprocess.Popen(launcher, env=_env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return [first, second]


def _kill_node(launcher: subprocess.Popen) -> None:
    """SIGKILL a node as a power cut would: its torchrun launcher and the workers it started (their own sessions)."""
    workers = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()
    for pid in [launcher.pid, *map(int, workers)]:
        os.kill(pid, signal.SIGKILL)


def _two_nodes(train_args: list[str], cwd: Path, run_id: str) -> None:
    """Run both nodes to the end; both must succeed. torchrun's agent can linger at shutdown after its worker
    has finished (its rendezvous store may be gone with the other node): a launcher still running a minute
    after the other one succeeded is stopped; the run's own results are then checked by the caller."""
    nodes = _start_nodes(train_args, cwd, run_id)
    done: dict[int, str] = {}
    deadline = time.time() + 300
    while len(done) < 2 and time.time() < deadline:
        for i, node in enumerate(nodes):
            if i not in done and node.poll() is not None:
                done[i] = node.communicate()[1]
                deadline = min(deadline, time.time() + 60) if node.returncode == 0 else deadline
        time.sleep(0.1)
    for i, node in enumerate(nodes):
        if i not in done:
            node.kill()
            done[i] = node.communicate()[1]
    finished = [i for i in done if nodes[i].returncode == 0]
    assert finished, "\n".join(err[-3000:] for err in done.values())
    for i, node in enumerate(nodes):
        assert node.returncode in (0, -signal.SIGKILL), done[i][-3000:]


def _config(tmp_path: Path, name: str, max_steps: int, valid_every: int = 4) -> Path:
    """A tiny run of at most 10 updates: the first epoch of `tiny_data` at this batch size. (At an epoch's end the
    two ranks drop an odd last batch that one process would use: data/batching.shard_batches.)"""
    assert max_steps <= 10
    cfg = tiny_experiment(max_steps=max_steps, valid_every=valid_every)
    cfg.model.dropout = 0.0  # per-rank dropout streams differ by design; compare the deterministic part
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    return path


@pytest.mark.distributed
def test_two_nodes_checkpoint_resume_and_equal_one_process(tiny_data, tmp_path):
    common = ["train", "--data", str(tiny_data), "--threads", "1", "--no-progress", *GLOO]
    run = tmp_path / "two_nodes"
    _two_nodes([*common, "--config", str(_config(tmp_path, "four.yaml", 4)), "--out", str(run)], tmp_path, "leg1")
    saved = load_checkpoint(run / "last.pt")
    assert saved["meta"]["step"] == 4
    assert sorted(_losses(run)) == [1, 2, 3, 4]

    _two_nodes([*common, "--config", str(_config(tmp_path, "eight.yaml", 8)), "--out", str(run), "--resume"],
               tmp_path, "leg2")

    single = tmp_path / "single"
    subprocess.run([sys.executable, "-m", "multibranch", *common, "--config", str(tmp_path / "eight.yaml"),
                    "--out", str(single), "--update-freq", "2"], env=_env(), cwd=tmp_path, check=True,
                   capture_output=True)
    nodes, one = _losses(run), _losses(single)
    assert sorted(nodes) == sorted(one) == list(range(1, 9)), "every step logged once across the resume"
    for step in one:
        assert nodes[step] == pytest.approx(one[step], rel=1e-5), step
    assert load_checkpoint(run / "last.pt")["meta"]["step"] == 8


@pytest.mark.distributed
@pytest.mark.slow  # 20 s; the two-node run above keeps multi-node training in the default suite
def test_a_dead_node_stops_the_job_and_auto_resume_continues_exactly(tiny_data, tmp_path):
    common = ["train", "--data", str(tiny_data), "--threads", "1", "--no-progress", *GLOO,
              "--config", str(_config(tmp_path, "ten.yaml", 10, valid_every=2))]
    run = tmp_path / "two_nodes"
    nodes = _start_nodes([*common, "--out", str(run), "--auto-resume"], tmp_path, "first")
    deadline = time.time() + 300
    while not (run / "last.pt").exists() and time.time() < deadline and nodes[0].poll() is None:
        time.sleep(0.01)
    _kill_node(nodes[1])
    nodes[1].communicate()
    nodes[0].communicate(timeout=300)
    assert nodes[0].returncode != 0, "the surviving node must stop, not train on alone"
    saved_at = load_checkpoint(run / "last.pt")["meta"]["step"]
    assert saved_at < 10, "the job finished before a node could be killed"

    _two_nodes([*common, "--out", str(run), "--auto-resume"], tmp_path, "relaunch")  # the same command again

    single = tmp_path / "single"
    subprocess.run([sys.executable, "-m", "multibranch", *common, "--out", str(single), "--update-freq", "2"],
                   env=_env(), cwd=tmp_path, check=True, capture_output=True)
    nodes_losses, one = _losses(run), _losses(single)
    assert sorted(nodes_losses) == list(range(1, 11)), "steps after the checkpoint are logged once, after the restart"
    for step in one:
        assert nodes_losses[step] == pytest.approx(one[step], rel=1e-5), step
