"""SIGTERM (kill, timeout, systemd, docker, SLURM) stops every command as Ctrl-C does: one line, exit 143,
temporaries removed, outputs whole; `train` saves a resumable last.pt first. And what a killed run left
beside its output (SIGKILL) is removed by the next run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from multibranch.atomic import remove_stale_output_temporaries
from multibranch.checkpoint.format import load_checkpoint
from multibranch.cli import main
from multibranch.interrupts import Terminated, deferred_interrupt
from multibranch.tasks.translation.synthetic import generate_synthetic_task
from tests.helpers.configs import tiny_experiment

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MULTIBRANCH_CPU_KERNELS": "0"}


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "multibranch", *args], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(condition, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while not condition() and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "the command finished before it could be stopped"
    assert condition()


def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err, err


# ---- SIGTERM -------------------------------------------------------------------------------------------


def test_sigterm_during_prepare_with_workers_leaves_no_temporary(tmp_path):
    generate_synthetic_task(tmp_path / "raw", seed=3, n_train=60000, n_valid=24, n_test=24)
    out = tmp_path / "data"
    prepare = _start("prepare", "--src", "src", "--tgt", "tgt", "--train", str(tmp_path / "raw" / "train"),
                     "--valid", str(tmp_path / "raw" / "valid"), "--out", str(out), "--vocab-size", "200",
                     "--workers", "2", "--shard-pairs", "5000")
    _wait_for(lambda: any(tmp_path.glob(".data.tmp-*/train*")), prepare)
    prepare.send_signal(signal.SIGTERM)
    _, err = prepare.communicate(timeout=60)
    assert prepare.returncode == 143, err
    assert _last_line(err) == "multibranch prepare: terminated"
    _no_traceback(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]  # no output, no temporary


def test_sigterm_during_translate_keeps_the_old_output_and_no_temporary(tiny_checkpoint, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("".join(f"a b c d e f g h {i % 7} a b c\n" for i in range(20000)))
    output = tmp_path / "out.txt"
    output.write_text("old\n")
    translate = _start("translate", "--ckpt", str(tiny_checkpoint), "-i", str(source), "-o", str(output),
                       "--force", "--threads", "1", "--device", "cpu")
    _wait_for(lambda: any(tmp_path.glob(".out.txt.*.tmp")), translate)
    time.sleep(0.5)
    translate.send_signal(signal.SIGTERM)
    _, err = translate.communicate(timeout=60)
    assert translate.returncode == 143, err
    assert _last_line(err) == "multibranch translate: terminated"
    _no_traceback(err)
    assert output.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]


def _train_losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["type"] == "train"}


def test_sigterm_during_train_saves_last_pt_and_resume_matches_an_uninterrupted_run(tiny_data, tmp_path):
    """SLURM sends SIGTERM before it kills: the update under way finishes, last.pt is saved at it (not only
    at the last validation), and --resume continues exactly."""
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_experiment(max_steps=60, valid_every=50).to_dict()))
    common = ("--data", str(tiny_data), "--config", str(config), "--threads", "1", "--deterministic",
              "--no-progress", "--device", "cpu")
    straight = _start("train", "--out", str(tmp_path / "straight"), *common)
    victim = _start("train", "--out", str(tmp_path / "stopped"), *common)
    metrics = tmp_path / "stopped" / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and metrics.read_text().count('"train"') >= 3, victim)
    victim.send_signal(signal.SIGTERM)
    _, err = victim.communicate(timeout=120)
    assert victim.returncode == 143, err
    _no_traceback(err)
    stopped_at = load_checkpoint(tmp_path / "stopped" / "last.pt")["meta"]["step"]
    assert 3 <= stopped_at < 50  # saved at the interrupted update, before any validation
    assert _last_line(err) == f"multibranch train: interrupted at update {stopped_at}; continue with --resume"
    assert err.count("multibranch train:") == 1
    assert not list((tmp_path / "stopped").glob(".*.tmp"))

    _, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err
    resumed = _start("train", "--out", str(tmp_path / "stopped"), "--resume", *common)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    got = _train_losses(tmp_path / "stopped")
    assert sorted(got) == list(range(1, 61))
    assert got == _train_losses(tmp_path / "straight")
    # the step checkpoints `average --last` reads are the uninterrupted run's, not one at the interrupted update
    assert _step_checkpoints(tmp_path / "stopped") == _step_checkpoints(tmp_path / "straight") == [
        "step_00000050.pt", "step_00000060.pt"]


def _step_checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step_*.pt"))


def test_sigterm_is_held_while_a_save_is_under_way():
    def raise_terminated(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    done = []
    try:
        try:
            with deferred_interrupt():
                os.kill(os.getpid(), signal.SIGTERM)
                done.append(True)
        except Terminated:
            pass
        else:
            raise AssertionError("the held SIGTERM was not raised after the block")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert done == [True]


def test_the_cli_handler_is_removed_after_the_command(tmp_path, capsys):
    before = signal.getsignal(signal.SIGTERM)
    assert main(["info", "--ckpt", str(tmp_path / "missing.pt")]) == 2
    assert signal.getsignal(signal.SIGTERM) is before


# ---- what a killed run left ------------------------------------------------------------------------------


def _left_by_killed_runs(folder: Path, name: str) -> tuple[list[Path], list[Path]]:
    """(temporaries of `name`'s writers, files that only look alike and must stay)."""
    ours = [folder / f".{name}.tmp-ab12_xyz", folder / f".{name}.k3j4h5g6.tmp"]
    (ours[0] / "train").mkdir(parents=True)
    (ours[0] / "train" / "shard_0.npy").write_bytes(b"x" * 1000)
    ours[1].write_text("partial")
    others = [folder / f".{name}.de.k3j4h5g6.tmp", folder / f".{name}x.tmp-ab12_xyz", folder / f"{name}.tmp",
              folder / ".other.k3j4h5g6.tmp", folder / f".{name}.tmp-toolong12"]
    for other in others:
        other.write_text("keep")
    return ours, others


def test_remove_stale_output_temporaries_removes_only_the_outputs_own(tmp_path):
    ours, others = _left_by_killed_runs(tmp_path, "out")
    old = tmp_path / ".out.old-aaaabbbb"
    old.mkdir()
    assert sorted(remove_stale_output_temporaries(tmp_path / "out")) == sorted(ours)
    assert all(p.exists() for p in others) and old.exists()  # without `out`, .old- may hold the only copy
    (tmp_path / "out").mkdir()
    assert remove_stale_output_temporaries(tmp_path / "out") == [old]


def test_prepare_removes_what_a_killed_prepare_left(tmp_path, capsys, caplog):
    generate_synthetic_task(tmp_path / "raw", seed=3, n_train=200, n_valid=24, n_test=24)
    ours, others = _left_by_killed_runs(tmp_path, "data")
    assert main(["prepare", "--src", "src", "--tgt", "tgt", "--train", str(tmp_path / "raw" / "train"),
                 "--valid", str(tmp_path / "raw" / "valid"), "--out", str(tmp_path / "data"),
                 "--vocab-size", "100", "--workers", "1"]) == 0
    assert not any(p.exists() for p in ours) and all(p.exists() for p in others)
    lines = [r.getMessage() for r in caplog.records if "left by an interrupted run" in r.getMessage()]
    assert len(lines) == 1 and "removed 2 " in lines[0]


def test_translate_removes_what_a_killed_translate_left(tiny_checkpoint, tmp_path, capsys, caplog):
    source = tmp_path / "in.txt"
    source.write_text("a b c\n")
    ours, others = _left_by_killed_runs(tmp_path, "out.txt")
    assert main(["translate", "--ckpt", str(tiny_checkpoint), "-i", str(source), "-o", str(tmp_path / "out.txt"),
                 "--device", "cpu"]) == 0
    assert (tmp_path / "out.txt").exists()
    assert not any(p.exists() for p in ours) and all(p.exists() for p in others)
    lines = [r.getMessage() for r in caplog.records if "left by an interrupted run" in r.getMessage()]
    assert len(lines) == 1 and "removed 2 " in lines[0]
