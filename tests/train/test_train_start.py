"""A train start is validated completely before the run directory is created or changed.

Every refused start (bad --init-from, a device this machine lacks, a bad data directory, a refused
--resume) leaves the run directory absent, or byte for byte as it was; the corrected rerun then
works without --force. Also: stale temporaries of a killed save are removed on the next start, and
a resume refuses a changed SentencePiece model unless allowed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from multibranch.checkpoint.format import CheckpointError, load_checkpoint, save_checkpoint
from multibranch.config import ConfigError
from multibranch.errors import DataError, UserError
from multibranch.experiment import resolve_config
from multibranch.tasks import train
from multibranch.train.trainer import RunOptions
from tests.helpers.configs import tiny_experiment


def snapshot(run: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) under `run`, by relative path."""
    return {str(p.relative_to(run)): (p.read_bytes() if p.is_file() else None) for p in sorted(run.rglob("*"))}


def unusable_cuda() -> tuple[str, str]:
    """A --device this machine refuses and the refusal's words: any CUDA device on a CPU-only build (CI's), the
    index one past the last visible device on a CUDA build."""
    if torch.version.cuda is None:
        return "cuda", "no CUDA support"
    return f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}", "no such CUDA device"


@pytest.fixture(scope="module")
def wide_checkpoint(tiny_data, tmp_path_factory) -> Path:
    """best.pt of a one-update run with d_model=48 (the tests' runs use 32)."""
    cfg = tiny_experiment(max_steps=1, valid_every=1)
    cfg.model.d_model, cfg.model.ffn_dim = 48, 96
    run = tmp_path_factory.mktemp("wide") / "run"
    train(cfg, RunOptions(tiny_data, run, progress=False))
    return run / "best.pt"


def test_failed_starts_leave_no_run_directory_and_the_rerun_needs_no_force(tiny_data, wide_checkpoint, tmp_path):
    run = tmp_path / "run"
    bad_device, refusal = unusable_cuda()
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    failures = [
        (RunOptions(tiny_data, run, init_from=text), CheckpointError, "notes.txt is not a multibranch checkpoint$"),
        (RunOptions(tiny_data, run, init_from=wide_checkpoint), CheckpointError,
         r"model\.d_model: checkpoint 48, config 32; model\.ffn_dim: checkpoint 96, config 64\)$"),
        (RunOptions(tiny_data, run, init_from=wide_checkpoint.parent), CheckpointError,
         f"is a run directory; did you mean {wide_checkpoint}\\?"),
        (RunOptions(tiny_data, run, device=bad_device), ConfigError, refusal),
        (RunOptions(tmp_path / "no-such-data", run), (DataError, FileNotFoundError), "no-such-data"),
    ]
    for opts, error, message in failures:
        with pytest.raises(error, match=message) as info:
            train(tiny_experiment(max_steps=2), opts)
        assert "weights_only" not in str(info.value).lower().replace(" ", "_")
        assert not run.exists(), f"{opts} left {run}"
    state = train(tiny_experiment(max_steps=2), RunOptions(tiny_data, run, progress=False))  # no --force needed
    assert state.step == 2


def test_a_refused_start_in_an_existing_run_changes_nothing(tiny_data, wide_checkpoint, tmp_path):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=2), RunOptions(tiny_data, run, progress=False))
    before = snapshot(run)
    attempts = [
        RunOptions(tiny_data, run, resume=True, device=f"cuda:{max(7, torch.cuda.device_count())}"),  # none such
        RunOptions(tiny_data, run, force=True, init_from=wide_checkpoint),
        RunOptions(tmp_path / "no-such-data", run, resume=True),
    ]
    for opts in attempts:
        with pytest.raises((ConfigError, CheckpointError, DataError, FileNotFoundError)):
            train(tiny_experiment(max_steps=4), opts)
        assert snapshot(run) == before, opts


def test_refused_resume_names_the_values_and_keeps_the_run_resumable(tiny_data, tmp_path):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=4), RunOptions(tiny_data, run, progress=False))
    before = snapshot(run)
    changed = tiny_experiment(max_steps=8, lr={"schedule": "inverse_sqrt", "lr": 0.001, "warmup": 5})
    with pytest.raises(CheckpointError, match=r"train\.lr\.lr: run has 0\.002, now 0\.001\): --reset-schedule"):
        train(changed, RunOptions(tiny_data, run, resume=True))
    assert snapshot(run) == before  # config.yaml, train.log, metrics.jsonl untouched
    # a plain `train --resume --out RUN` (no --preset/--config) reads RUN/config.yaml
    plain = resolve_config(None, str(run / "config.yaml"), ["train.max_steps=6"])
    assert train(plain, RunOptions(tiny_data, run, resume=True, progress=False)).step == 6


def test_init_from_with_agreeing_configs_reports_the_tensors(tiny_data, tmp_path):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=1, valid_every=1), RunOptions(tiny_data, run, progress=False))
    payload = load_checkpoint(run / "best.pt")
    del payload["model"]["decoder.layers.1.ffn.fc2.weight"]
    save_checkpoint(tmp_path / "pruned.pt", payload)
    with pytest.raises(CheckpointError, match=r"missing keys \(1\): decoder\.layers\.1\.ffn\.fc2\.weight"):
        train(tiny_experiment(), RunOptions(tiny_data, tmp_path / "new", init_from=tmp_path / "pruned.pt"))
    assert not (tmp_path / "new").exists()


def test_stale_temporaries_of_a_killed_save_are_removed_on_the_next_start(tiny_data, tmp_path, caplog):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=2), RunOptions(tiny_data, run, progress=False))
    planted = [run / ".last.pt.k1ll3d.tmp", run / "checkpoints" / ".step_00000004.pt.x7yz.tmp",
               run / ".best.pt.abc123.tmp"]
    for path in planted:
        path.write_bytes(b"PK\x03\x04 half a checkpoint")
    keep = run / "notes.tmp"  # not a temporary of ours (no leading dot): left alone
    keep.write_text("mine")
    caplog.set_level(logging.INFO, logger="multibranch")
    train(tiny_experiment(max_steps=4), RunOptions(tiny_data, run, resume=True, progress=False))
    assert [p for p in planted if p.exists()] == []
    assert keep.read_text() == "mine"
    log_text = (run / "train.log").read_text()
    assert "removed 3 temporary file(s) left by an interrupted write" in log_text
    assert all(str(p) in log_text for p in planted)


def test_checkpoints_get_ordinary_file_modes(tiny_data, tmp_path):
    old_mask = os.umask(0o022)
    try:
        run = tmp_path / "run"
        train(tiny_experiment(max_steps=2, valid_every=2), RunOptions(tiny_data, run, progress=False))
    finally:
        os.umask(old_mask)
    files = [run / "best.pt", run / "last.pt", run / "config.yaml", *sorted((run / "checkpoints").glob("*.pt"))]
    assert len(files) == 4
    assert {str(p.name): oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {p.name: "0o644" for p in files}


def test_resume_refuses_another_sentencepiece_model_unless_allowed(tiny_data, tmp_path, caplog):
    from multibranch.data.parallel_prepare import PrepareConfig
    from multibranch.tasks.translation.prepare import prepare
    from multibranch.tasks.translation.synthetic import generate_synthetic_task

    generate_synthetic_task(tmp_path / "raw", seed=11, n_train=400, n_valid=24, n_test=24)
    other = tmp_path / "other"
    prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(tmp_path / "raw" / "train"),
                          valid=str(tmp_path / "raw" / "valid"), out=str(other), vocab_size=200))
    assert (other / "spm.model").read_bytes() != (tiny_data / "spm.model").read_bytes()

    run = tmp_path / "run"
    train(tiny_experiment(max_steps=2), RunOptions(tiny_data, run, progress=False))
    before = snapshot(run)
    with pytest.raises(CheckpointError, match="another SentencePiece model .*--allow-new-tokenizer"):
        train(tiny_experiment(max_steps=4), RunOptions(other, run, resume=True, reset_data=True))
    assert snapshot(run) == before
    caplog.set_level(logging.WARNING, logger="multibranch")
    train(tiny_experiment(max_steps=4),
          RunOptions(other, run, resume=True, reset_data=True, allow_new_tokenizer=True, progress=False))
    assert "--allow-new-tokenizer" in caplog.text and "loss to jump" in caplog.text
    assert (run / "tokenizer" / "src.model").read_bytes() == (other / "spm.model").read_bytes()
    assert torch.equal(load_checkpoint(run / "last.pt")["tokenizer"]["src"],
                       torch.frombuffer(bytearray((other / "spm.model").read_bytes()), dtype=torch.uint8))


def test_cli_unusable_cuda_device_is_one_line(tiny_data, tmp_path):
    run = tmp_path / "run"
    bad_device, refusal = unusable_cuda()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "multibranch", "train", "--data", str(tiny_data), "--out", str(run),
                           "--preset", "transformer-tiny", "--max-steps", "1", "--device", bad_device],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith(f"multibranch train: error: --device {bad_device}: ") and refusal in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not run.exists()


def test_auto_resume_starts_fresh_then_continues_and_refuses_resume_or_force(tiny_data, tmp_path, capsys):
    from multibranch.cli import main
    from tests.helpers.cli import TINY_MODEL, one_error_line

    run = tmp_path / "run"
    base = ["train", "--data", str(tiny_data), "--out", str(run), "--preset", "transformer-tiny", *TINY_MODEL,
            "--threads", "1", "--no-progress", "--valid-every", "2", "--auto-resume"]
    assert main([*base, "--max-steps", "2"]) == 0  # no run yet: a fresh start
    assert load_checkpoint(run / "last.pt")["meta"]["step"] == 2
    assert main([*base, "--max-steps", "4"]) == 0  # the same command with a run there: a resume, not a refusal
    assert load_checkpoint(run / "last.pt")["meta"]["step"] == 4
    capsys.readouterr()
    for extra in ("--resume", "--force"):
        assert main([*base, "--max-steps", "6", extra]) == 2
        assert "--auto-resume decides by itself" in one_error_line(capsys)
    assert load_checkpoint(run / "last.pt")["meta"]["step"] == 4


def test_a_run_killed_before_its_first_checkpoint_is_started_over_by_auto_resume(tiny_data, tmp_path, capsys):
    """SIGKILL after the first logged update, long before the first validation: the directory holds config.yaml,
    tokenizer/, train.log and metrics.jsonl but no checkpoint. --resume and a plain start name the remedies;
    --auto-resume (as a launcher reruns the same command) starts the run over, with nothing of the killed one
    left in its log."""
    import json
    import signal
    import time

    from multibranch.cli import main
    from tests.helpers.cli import TINY_MODEL, one_error_line

    run = tmp_path / "run"
    base = ["train", "--data", str(tiny_data), "--out", str(run), "--preset", "transformer-tiny", *TINY_MODEL,
            "--threads", "1", "--no-progress", "--log-every", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MULTIBRANCH_CPU_KERNELS": "0"}
    victim = subprocess.Popen([sys.executable, "-m", "multibranch", *base, "--max-steps", "100000",
                               "--valid-every", "100000"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    assert victim.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert (run / "config.yaml").is_file() and (run / "train.log").is_file() and (run / "tokenizer").is_dir()
    assert not list(run.rglob("*.pt"))
    before = snapshot(run)

    capsys.readouterr()
    assert main([*base, "--max-steps", "2", "--resume"]) == 2
    err = one_error_line(capsys)
    assert "no " in err and "last.pt to resume from" in err and "--auto-resume or --force" in err
    assert main([*base, "--max-steps", "2"]) == 2
    err = one_error_line(capsys)
    assert "stopped before its first checkpoint" in err and "--auto-resume or --force" in err
    assert snapshot(run) == before

    assert main([*base, "--max-steps", "2", "--valid-every", "2", "--auto-resume"]) == 0
    assert load_checkpoint(run / "last.pt")["meta"]["step"] == 2
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "train"] == [1, 2]  # the killed run's lines are gone
    assert main([*base, "--max-steps", "4", "--valid-every", "2", "--auto-resume"]) == 0  # now a resume
    assert load_checkpoint(run / "last.pt")["meta"]["step"] == 4


def test_auto_resume_keeps_checkpoints_without_last_pt_and_a_folder_of_other_files(tiny_data, tmp_path, capsys):
    """Only a run with no checkpoint at all is started over: best.pt without last.pt, or a directory that is no
    run, is refused as a plain start is, and stays as it was; a folder of other files is refused with --force too."""
    from multibranch.cli import main
    from tests.helpers.cli import TINY_MODEL, one_error_line

    run = tmp_path / "run"
    base = ["train", "--data", str(tiny_data), "--preset", "transformer-tiny", *TINY_MODEL, "--threads", "1",
            "--no-progress", "--max-steps", "2", "--valid-every", "2"]
    assert main([*base, "--out", str(run)]) == 0
    (run / "last.pt").unlink()
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine\n")
    capsys.readouterr()
    for out, said in ((run, "no last.pt to resume from; pass --force"),
                      (notes, "holds files of no training run (todo.txt); training starts only in a new or empty "
                              "directory or a run's own, --force or not")):
        before = snapshot(out)
        for start in ("--auto-resume", "--force"):
            if start == "--force" and out == run:
                continue  # a run's own directory: --force starts it over
            assert main([*base, "--out", str(out), start]) == 2
            err = one_error_line(capsys)
            assert said in err, err
            assert snapshot(out) == before


def test_force_never_deletes_the_checkpoint_it_starts_from(tiny_data, tmp_path):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=1, valid_every=1), RunOptions(tiny_data, run, progress=False))
    before = snapshot(run)
    for source in (run / "best.pt", run / "checkpoints" / ".." / "last.pt"):
        with pytest.raises(UserError, match="is inside the run directory .* whose checkpoints --force deletes"):
            train(tiny_experiment(max_steps=2), RunOptions(tiny_data, run, force=True, init_from=source))
    assert snapshot(run) == before


def test_a_run_under_a_plain_file_is_refused_before_anything_is_written(tiny_data, tmp_path):
    plain = tmp_path / "notes.txt"
    plain.write_text("a file\n")
    with pytest.raises(FileExistsError, match=f"run directory {plain / 'run'}: {plain} is a file, not a directory"):
        train(tiny_experiment(max_steps=1), RunOptions(tiny_data, plain / "run"))
    run = tmp_path / "run"
    with pytest.raises(FileExistsError, match=f"--tensorboard {plain / 'tb'}: {plain} is a file, not a directory"):
        train(tiny_experiment(max_steps=1), RunOptions(tiny_data, run, tensorboard=plain / "tb"))
    assert not run.exists() and plain.read_text() == "a file\n"


def test_a_run_another_process_is_training_is_refused_before_anything_changes(tiny_data, tmp_path):
    """The lock is what a second `train` meets while the first one writes the run; the kernel drops it with
    the process, so a killed run resumes without it."""
    from multibranch.train.run_directory import lock_run

    run = tmp_path / "run"
    train(tiny_experiment(max_steps=1, valid_every=1), RunOptions(tiny_data, run, progress=False))
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(run / ".train.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(run)
        for opts in (RunOptions(tiny_data, run, resume=True, progress=False),
                     RunOptions(tiny_data, run, force=True, progress=False)):
            with pytest.raises(UserError, match=f"run directory {run} is being trained by"):
                train(tiny_experiment(max_steps=2, valid_every=1), opts)
            assert snapshot(run) == before
    finally:
        holder.kill()
        holder.wait()
    assert train(tiny_experiment(max_steps=2, valid_every=1), RunOptions(tiny_data, run, resume=True,
                                                                       progress=False)).step == 2
    held = lock_run(run)  # the finished run released it
    assert held is not None
    held.close()


def test_a_diverged_validation_is_never_the_best(tiny_data, tmp_path, caplog):
    run = tmp_path / "run"
    diverging = tiny_experiment(max_steps=3, valid_every=1, lr={"schedule": "inverse_sqrt", "lr": 1e30, "warmup": 1})
    with caplog.at_level(logging.WARNING):
        state = train(diverging, RunOptions(tiny_data, run, progress=False))
    assert state.step == 3 and not (run / "best.pt").exists() and (run / "last.pt").exists()
    assert any("the training has diverged" in r.getMessage() for r in caplog.records)
    said = [r.getMessage() for r in caplog.records if "the run has diverged" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("the training loss is nan at update ")  # logged every update, said once

    def no_bare_constants(word: str) -> None:
        raise AssertionError(f"metrics.jsonl holds the bare constant {word}, which strict JSON parsers refuse")

    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line, parse_constant=no_bare_constants) for line in lines]
    assert [r["loss"] for r in records if r["type"] == "valid"] == [None, None, None]  # written as null


def test_a_run_or_its_tensorboard_inside_the_prepared_data_is_refused_before_any_write(tiny_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    before = sorted(p.name for p in data.rglob("*"))
    for out, board, where in ((data / "run", None, "is inside"), (tmp_path / "run", data / "tb", "is inside"),
                              (tmp_path / "run", data, "is")):
        opts = RunOptions(data, out, progress=False, tensorboard=board)
        option = "--tensorboard" if board else "--out"
        with pytest.raises(UserError, match=f"{option} {board or out} {where} the prepared data directory {data},"):
            train(tiny_experiment(max_steps=1, valid_every=1), opts)
    assert sorted(p.name for p in data.rglob("*")) == before and not (tmp_path / "run").exists()


def test_a_tensorboard_folder_that_is_another_run_is_refused(tiny_data, tmp_path):
    other = tmp_path / "other"
    train(tiny_experiment(max_steps=1, valid_every=1), RunOptions(tiny_data, other, progress=False))
    with pytest.raises(UserError, match=f"--tensorboard {other} is a training run directory"):
        train(tiny_experiment(max_steps=1, valid_every=1),
              RunOptions(tiny_data, tmp_path / "run", progress=False, tensorboard=other))
    assert not (tmp_path / "run").exists()


def test_a_resume_with_other_max_steps_says_the_schedules_stretch(tiny_data, tmp_path, caplog):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=2, valid_every=2), RunOptions(tiny_data, run, progress=False))
    with caplog.at_level(logging.WARNING):
        train(tiny_experiment(max_steps=4, valid_every=2), RunOptions(tiny_data, run, resume=True, progress=False))
    assert any(r.getMessage().startswith("train.max_steps: run has 2, now 4; schedules planned to the last update")
               for r in caplog.records)


def test_a_signal_just_before_an_update_saves_last_pt_at_the_update_before(tiny_data, tmp_path, monkeypatch):
    """A SIGTERM that lands after one update and before the next one holds the signals is between updates: last.pt
    is saved there (it was lost when the run marked itself mid-update before holding the signals)."""
    import contextlib

    from multibranch.checkpoint.format import load_checkpoint as load
    from multibranch.interrupts import Terminated
    from multibranch.train import trainer as trainer_module

    real = trainer_module.deferred_interrupt
    entered = []

    @contextlib.contextmanager
    def signal_on_the_fourth_update():
        entered.append(1)
        if len(entered) == 4:  # the signal arrives as the block is entered, before it holds anything
            raise Terminated
        with real():
            yield

    monkeypatch.setattr(trainer_module, "deferred_interrupt", signal_on_the_fourth_update)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt, match="interrupted at update 3; continue with --resume"):
        train(tiny_experiment(max_steps=10, valid_every=5), RunOptions(tiny_data, run, progress=False))
    assert load(run / "last.pt")["meta"]["step"] == 3
