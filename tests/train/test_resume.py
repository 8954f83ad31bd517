"""Exact resume: a run killed with SIGKILL and resumed logs the same losses as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from multibranch.checkpoint.format import CheckpointError, load_checkpoint
from multibranch.tasks import train
from multibranch.train.trainer import RunOptions
from tests.helpers.configs import tiny_experiment


def _train_losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["type"] == "train"}


def _cli(config: Path, data: Path, run: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # CUBLAS_WORKSPACE_CONFIG (conftest.py) for --deterministic on CUDA
    cmd = [sys.executable, "-m", "multibranch", "train", "--data", str(data), "--out", str(run),
           "--config", str(config), "--threads", "1", "--deterministic", "--no-progress", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("length_buckets", [None, pytest.param(3, marks=pytest.mark.slow)],
                         ids=["own-shapes", "fixed-shapes"])
def test_sigkill_then_resume_matches_uninterrupted_run(tiny_data, tmp_path, device, length_buckets):
    """Bit-identical on CUDA too: --deterministic there means deterministic kernels (a fixed cuBLAS workspace),
    and the CUDA generators' states are saved with the CPU's. On CUDA the run replays CUDA graphs (fixed shapes
    by default there); on the CPU the fixed-shape path (its gradient buffer, the device-side normaliser) runs
    eagerly."""
    cfg = tiny_experiment(max_steps=30, valid_every=6, length_buckets=length_buckets)
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    on = ("--device", device.type)

    straight = _cli(config, tiny_data, tmp_path / "straight", *on)
    out, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err

    victim = _cli(config, tiny_data, tmp_path / "killed", *on)
    _kill_at_first_save(victim, tmp_path / "killed")
    killed_at = load_checkpoint(tmp_path / "killed" / "last.pt")["meta"]["step"]
    assert killed_at < 30

    resumed = _cli(config, tiny_data, tmp_path / "killed", "--resume", *on)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err

    expected, got = _train_losses(tmp_path / "straight"), _train_losses(tmp_path / "killed")
    assert sorted(got) == list(range(1, 31)), "every step logged exactly once after the resume"
    assert got == expected  # bit-identical losses, step for step


def test_in_process_resume_extends_a_finished_run_exactly(tiny_data, tmp_path, device):
    on = device.type
    train(tiny_experiment(max_steps=16, deterministic=True), RunOptions(tiny_data, tmp_path / "straight", device=on))
    train(tiny_experiment(max_steps=8, deterministic=True), RunOptions(tiny_data, tmp_path / "two_legs", device=on))
    train(tiny_experiment(max_steps=16, deterministic=True),
          RunOptions(tiny_data, tmp_path / "two_legs", resume=True, device=on))
    assert _train_losses(tmp_path / "two_legs") == _train_losses(tmp_path / "straight")


def test_a_log_window_cut_by_a_pause_logs_the_uninterrupted_losses(tiny_data, tmp_path):
    """Train lines every 4 updates; the run pauses inside a window (after update 6, saving last.pt as a SIGTERM
    does) and is resumed: every logged loss, that of updates 5-8 included, equals the uninterrupted run's (the
    window's sums travel in last.pt)."""
    cfg = {"max_steps": 8, "valid_every": 6, "log_every": 4, "deterministic": True}
    train(tiny_experiment(**cfg), RunOptions(tiny_data, tmp_path / "straight", device="cpu", progress=False))
    expected = _train_losses(tmp_path / "straight")
    assert sorted(expected) == [4, 8]
    paused = tmp_path / "paused"
    train(tiny_experiment(**cfg), RunOptions(tiny_data, paused, device="cpu", progress=False, stop_at_step=6))
    assert load_checkpoint(paused / "last.pt")["meta"]["step"] == 6 and sorted(_train_losses(paused)) == [4]
    train(tiny_experiment(**cfg), RunOptions(tiny_data, paused, device="cpu", progress=False, resume=True))
    assert _train_losses(paused) == expected


def test_a_pause_between_validations_leaves_the_uninterrupted_runs_validations_and_checkpoints(tiny_data, tmp_path):
    """Paused at update 7 (validations every 6) and resumed: the same validations (updates 6 and 12, none at 7), the
    same step checkpoints and the same losses as the uninterrupted run; the pause wrote last.pt alone."""
    cfg = {"max_steps": 12, "valid_every": 6, "log_every": 1, "deterministic": True}
    train(tiny_experiment(**cfg), RunOptions(tiny_data, tmp_path / "straight", device="cpu", progress=False))
    paused = tmp_path / "paused"
    train(tiny_experiment(**cfg), RunOptions(tiny_data, paused, device="cpu", progress=False, stop_at_step=7))
    assert load_checkpoint(paused / "last.pt")["meta"]["step"] == 7
    assert sorted(p.name for p in (paused / "checkpoints").glob("*.pt")) == ["step_00000006.pt"]
    train(tiny_experiment(**cfg), RunOptions(tiny_data, paused, device="cpu", progress=False, resume=True))

    def validations(run: Path) -> list[tuple[int, float]]:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"]) for r in records if r["type"] == "valid"]

    assert [step for step, _ in validations(paused)] == [6, 12]
    assert validations(paused) == validations(tmp_path / "straight")
    assert _train_losses(paused) == _train_losses(tmp_path / "straight")
    assert sorted(p.name for p in (paused / "checkpoints").glob("*.pt")) == ["step_00000006.pt", "step_00000012.pt"]


def test_a_log_window_cut_by_sigkill_logs_the_uninterrupted_losses(tiny_data, tmp_path):
    """Killed with SIGKILL after a checkpoint inside a log window (checkpoints every 6 updates, train lines every
    5): the resumed run logs the uninterrupted run's losses."""
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_experiment(max_steps=18, valid_every=6, log_every=5).to_dict()))
    straight = _cli(config, tiny_data, tmp_path / "straight")
    victim = _cli(config, tiny_data, tmp_path / "killed")
    first_save = _kill_at_first_save(victim, tmp_path / "killed")
    assert load_checkpoint(first_save)["meta"]["step"] in (6, 12)  # inside a window of train lines
    _, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err
    resumed = _cli(config, tiny_data, tmp_path / "killed", "--resume")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    expected = _train_losses(tmp_path / "straight")
    assert sorted(expected) == [5, 10, 15] and _train_losses(tmp_path / "killed") == expected


def test_mismatched_resume_is_refused_unless_reset_flags(tiny_data, tmp_path):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=4), RunOptions(tiny_data, run))
    with pytest.raises(CheckpointError, match="--reset-schedule"):
        train(tiny_experiment(max_steps=8, lr={"schedule": "inverse_sqrt", "lr": 0.001, "warmup": 5}),
              RunOptions(tiny_data, run, resume=True))
    with pytest.raises(CheckpointError, match="--reset-data"):
        train(tiny_experiment(max_steps=8, max_tokens=500), RunOptions(tiny_data, run, resume=True))
    with pytest.raises(CheckpointError, match="model config differs"):
        bigger = tiny_experiment(max_steps=8)
        bigger.model.ffn_dim = 128
        train(bigger, RunOptions(tiny_data, run, resume=True))
    state = train(tiny_experiment(max_steps=8, max_tokens=500), RunOptions(tiny_data, run, resume=True, reset_data=True))
    assert state.step == 8


def test_existing_run_dir_needs_resume_or_force(tiny_data, tmp_path):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=2), RunOptions(tiny_data, run))
    with pytest.raises(FileExistsError, match="--resume"):
        train(tiny_experiment(max_steps=2), RunOptions(tiny_data, run))
    train(tiny_experiment(max_steps=2), RunOptions(tiny_data, run, force=True))
    with pytest.raises(CheckpointError, match="no .*last.pt"):
        train(tiny_experiment(max_steps=2), RunOptions(tiny_data, tmp_path / "fresh", resume=True))


def test_corrupted_last_checkpoint_gives_clear_error(tiny_data, tmp_path):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=2), RunOptions(tiny_data, run))
    data = (run / "last.pt").read_bytes()
    (run / "last.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupted"):
        train(tiny_experiment(max_steps=4), RunOptions(tiny_data, run, resume=True))


def _kill_at_first_save(victim, run_dir: Path) -> Path:
    """SIGKILL the training `victim` as soon as it has written RUN_DIR/last.pt; that file's path."""
    first_save = run_dir / "last.pt"
    deadline = time.time() + 240
    while not first_save.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    assert victim.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    return first_save


def _validations(run: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if r["type"] == "valid"]


def _step_checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("*.pt"))


@pytest.mark.parametrize("max_steps", [12, 7], ids=["at-a-validation-update", "at-the-last-update"])
def test_an_interrupt_during_a_validation_saves_it_as_due_and_the_resume_validates_first(tiny_data, tmp_path,
                                                                                      monkeypatch, max_steps):
    """Ctrl-C or SIGTERM while update 6 is validated (validations every 6; or the last update's, 7): last.pt is
    saved at that update with its validation due, and the resumed run validates there before it goes on: the same
    validations, step checkpoints and losses as the uninterrupted run."""
    from multibranch.interrupts import Terminated
    from multibranch.train.trainer import Trainer

    cfg = {"max_steps": max_steps, "valid_every": 6, "log_every": 1, "deterministic": True}
    train(tiny_experiment(**cfg), RunOptions(tiny_data, tmp_path / "straight", device="cpu", progress=False))
    stopped_at = 6 if max_steps == 12 else 7
    real = Trainer.validate

    def interrupted_at_its_update(self):
        result = real(self)
        if self.state.step == stopped_at:  # the validation's work is done, its record not written, when it comes
            raise Terminated
        return result

    monkeypatch.setattr(Trainer, "validate", interrupted_at_its_update)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt, match=f"interrupted at update {stopped_at}; continue with --resume"):
        train(tiny_experiment(**cfg), RunOptions(tiny_data, run, device="cpu", progress=False))
    saved = load_checkpoint(run / "last.pt")
    assert saved["meta"]["step"] == stopped_at and saved["training"]["state"]["validation_due"]
    assert [step for step, _ in _validations(run)] == ([] if stopped_at == 6 else [6])
    assert _step_checkpoints(run) == ([] if stopped_at == 6 else ["step_00000006.pt"])
    monkeypatch.setattr(Trainer, "validate", real)
    train(tiny_experiment(**cfg), RunOptions(tiny_data, run, device="cpu", progress=False, resume=True))
    assert _validations(run) == _validations(tmp_path / "straight")
    assert [step for step, _ in _validations(run)] == ([6, 12] if max_steps == 12 else [6, 7])
    assert _train_losses(run) == _train_losses(tmp_path / "straight")
    assert _step_checkpoints(run) == _step_checkpoints(tmp_path / "straight")
    assert not load_checkpoint(run / "last.pt")["training"]["state"]["validation_due"]


def test_a_signal_held_through_a_validation_updates_own_update_saves_it_with_the_validation_due(tiny_data, tmp_path,
                                                                                              monkeypatch):
    """A signal that came during update 6 acts when the update is done, before its validation begins: last.pt is
    saved at 6 with the validation due (it was not saved at all before)."""
    import contextlib

    from multibranch.interrupts import Terminated
    from multibranch.train import trainer as trainer_module

    real = trainer_module.deferred_interrupt
    entered = []

    @contextlib.contextmanager
    def signal_held_through_the_sixth_update():
        entered.append(1)
        with real():
            yield
        if len(entered) == 6:  # each update holds the signals once (no save before update 6)
            raise Terminated

    monkeypatch.setattr(trainer_module, "deferred_interrupt", signal_held_through_the_sixth_update)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt, match="interrupted at update 6; continue with --resume"):
        train(tiny_experiment(max_steps=8, valid_every=6), RunOptions(tiny_data, run, device="cpu", progress=False))
    saved = load_checkpoint(run / "last.pt")
    assert saved["meta"]["step"] == 6 and saved["training"]["state"]["validation_due"]
    monkeypatch.setattr(trainer_module, "deferred_interrupt", real)
    train(tiny_experiment(max_steps=8, valid_every=6), RunOptions(tiny_data, run, device="cpu", progress=False,
                                                                 resume=True))
    assert [step for step, _ in _validations(run)] == [6, 8]
