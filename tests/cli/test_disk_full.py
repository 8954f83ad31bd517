"""A full disk and Ctrl-C while saving: one error line and exit 2 (130 when
interrupted), never a traceback, and nothing corrupted: the previous file stays, no temporary is left.

A full disk is simulated at the lowest write the code reaches (a file object whose write raises
OSError(ENOSPC), numpy.save raising it), Ctrl-C by raising KeyboardInterrupt or sending SIGINT inside
torch.save.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import signal
from collections import namedtuple
from pathlib import Path

import pytest
import torch
import yaml

import multibranch.atomic
import multibranch.checkpoint.format
import multibranch.data.shards
from multibranch.cli import main
from multibranch.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"model": {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1},
        "train": {"max_tokens": 600, "lr": {"schedule": "inverse_sqrt", "lr": 0.002, "warmup": 5}, "valid_every": 2,
                  "log_every": 1, "valid_bleu": False, "max_steps": 2, "seed": 7}}
CLASSIFY = {"model": {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 1, "dropout": 0.1},
            "train": {"max_tokens": 400, "lr": {"schedule": "inverse_sqrt", "lr": 0.003, "warmup": 5},
                      "valid_every": 2, "log_every": 1, "max_steps": 2, "seed": 7, "best_metric": "accuracy"}}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if " | " not in line]  # log lines ("12:00:00 | INFO | ...") aside
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".") and (".tmp" in p.name)]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class FullFile:
    """A file object whose writes fail as on a full device (the data never reaches the disk)."""

    def __init__(self, handle):
        self._handle = handle

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()


@pytest.fixture
def full_disk(monkeypatch):
    """Fill the disk for atomic writes whose target's name matches the predicate set with `.when(...)`
    (all of them by default)."""
    real_fdopen = os.fdopen
    state = {"when": lambda name: True}

    def fdopen(fd, *args, **kwargs):
        handle = real_fdopen(fd, *args, **kwargs)
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        return FullFile(handle) if state["when"](name) else handle

    monkeypatch.setattr(multibranch.atomic.os, "fdopen", fdopen)
    Switch = namedtuple("Switch", "when")
    return Switch(lambda predicate: state.update(when=predicate))


@pytest.fixture(scope="module")
def run_dir(tiny_data, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("disk")
    (root / "exp.yaml").write_text(yaml.safe_dump(TINY), encoding="utf-8")
    assert main(["train", "--data", str(tiny_data), "--out", str(root / "run"), "--config", str(root / "exp.yaml"),
                 "--no-progress", "--threads", "1"]) == 0
    return root / "run"


def resumed_copy(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the 2-update run to resume (the module's run stays as it is)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    return run


# ---- a full disk ----------------------------------------------------------------------------------


def test_translate_output_on_a_full_disk(run_dir, tmp_path, full_disk, capsys):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("a b c\nd e\n", encoding="utf-8")
    out.write_bytes(b"previous\n")
    assert main(["translate", "--ckpt", str(run_dir / "last.pt"), "-i", str(src), "-o", str(out), "--force",
                 "--device", "cpu", "--beam", "1", "--max-len-b", "5"]) == 2
    err = one_error_line(capsys)
    assert str(out) in err and "no space left on device" in err
    assert out.read_bytes() == b"previous\n" and not temporaries(tmp_path)


def test_translate_checks_free_space_before_loading_the_model(tmp_path, monkeypatch, capsys):
    ckpt, src, out = tmp_path / "model.pt", tmp_path / "in.txt", tmp_path / "out.txt"
    ckpt.write_bytes(b"never read: the space check comes first")
    src.write_text("a b c\n" * 1000, encoding="utf-8")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("shutil.disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    assert main(["translate", "--ckpt", str(ckpt), "-i", str(src), "-o", str(out), "--device", "cpu"]) == 2
    err = one_error_line(capsys)
    assert str(out) in err and "no space left on device" in err and not out.exists()


def test_translate_checks_the_output_directory_is_writable(tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root may write anywhere")
    ckpt, src, locked = tmp_path / "model.pt", tmp_path / "in.txt", tmp_path / "locked"
    ckpt.write_bytes(b"never read")
    src.write_text("a b c\n", encoding="utf-8")
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(["translate", "--ckpt", str(ckpt), "-i", str(src), "-o", str(locked / "out.txt")]) == 2
        assert "permission denied" in one_error_line(capsys)
    finally:
        locked.chmod(0o700)


def test_classify_output_on_a_full_disk(tmp_path, full_disk, capsys):
    lines = [f"{label}\t{word} {filler}\n" for i in range(60)
             for label, word, filler in [(("x", "y")[i % 2], ("red", "blue")[i % 2], "the a of to"[: 1 + i % 9])]]
    (tmp_path / "train.tsv").write_text("".join(lines), encoding="utf-8")
    full_disk.when(lambda name: False)
    assert main(["prepare", "--task", "classify", "--train", str(tmp_path / "train.tsv"), "--holdout", "0.2",
                 "--out", str(tmp_path / "data"), "--vocab-size", "30"]) == 0
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(CLASSIFY), encoding="utf-8")
    assert main(["train", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run"), "--config",
                 str(tmp_path / "exp.yaml"), "--no-progress", "--threads", "1"]) == 0
    capsys.readouterr()
    (tmp_path / "in.txt").write_text("red the\nblue a\n", encoding="utf-8")
    out = tmp_path / "labels.txt"
    full_disk.when(lambda name: True)
    assert main(["classify", "--ckpt", str(tmp_path / "run" / "best.pt"), "-i", str(tmp_path / "in.txt"),
                 "-o", str(out), "--device", "cpu"]) == 2
    err = one_error_line(capsys)
    assert str(out) in err and "no space left on device" in err
    assert not out.exists() and not temporaries(tmp_path)


def test_evaluate_json_on_a_full_disk(tmp_path, full_disk, capsys):
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("the cat sat\n", encoding="utf-8")
    out = tmp_path / "scores.json"
    out.write_text("{}\n", encoding="utf-8")
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(hyp), "--json", str(out), "--force"]) == 2
    err = one_error_line(capsys)
    assert str(out) in err and "no space left on device" in err
    assert out.read_text(encoding="utf-8") == "{}\n" and not temporaries(tmp_path)


def test_prepare_on_a_full_disk(tmp_path, monkeypatch, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid"):
        for lang in ("en", "de"):
            (raw / f"{split}.{lang}").write_text("".join(f"w{i} x{i % 7} y\n" for i in range(40)), encoding="utf-8")

    def save(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(multibranch.data.shards.np, "save", save)
    out = tmp_path / "data"
    assert main(["prepare", "--src", "en", "--tgt", "de", "--train", str(raw / "train"), "--valid", str(raw / "valid"),
                 "--out", str(out), "--vocab-size", "40"]) == 2
    err = one_error_line(capsys)
    assert str(out) in err and "no space left on device" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]  # no data dir, no temporary one


def test_train_checkpoint_save_on_a_full_disk_keeps_the_last_checkpoint(run_dir, tiny_data, tmp_path, full_disk,
                                                                        capsys):
    run = resumed_copy(run_dir, tmp_path)
    before = digest(run / "last.pt")
    full_disk.when(lambda name: name.startswith(".last.pt."))
    assert main(["train", "--data", str(tiny_data), "--out", str(run), "--resume", "--max-steps", "4",
                 "--no-progress", "--threads", "1"]) == 2
    err = one_error_line(capsys)
    assert str(run / "last.pt") in err and "no space left on device" in err
    assert digest(run / "last.pt") == before and not temporaries(run)
    assert torch.load(run / "last.pt", weights_only=True)["training"]["state"]["step"] == 2


def test_metrics_log_on_a_full_disk_names_the_file(tmp_path, monkeypatch):
    from multibranch.train.metrics_log import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")
    real_open = Path.open

    def open_full(self, mode="r", *args, **kwargs):
        handle = real_open(self, mode, *args, **kwargs)
        return FullFile(handle) if "a" in mode else handle

    monkeypatch.setattr(Path, "open", open_full)
    with pytest.raises(UserError, match="metrics.jsonl: no space left on device"):
        log.write({"type": "train", "step": 1})


def test_train_log_on_a_full_disk_stops_with_one_error(tmp_path):
    from multibranch.train.trainer import RunLogHandler

    handler = RunLogHandler(tmp_path / "train.log", encoding="utf-8")
    handler.stream = FullFile(handler.stream)
    logger = logging.getLogger("multibranch.test_disk_full")
    logger.addHandler(handler)
    try:
        with pytest.raises(UserError, match="train.log: no space left on device"):
            logger.warning("a line that does not fit")
    finally:
        logger.removeHandler(handler)
        handler.close()


# ---- Ctrl-C while saving --------------------------------------------------------------------------


def test_ctrl_c_during_a_checkpoint_save_finishes_the_save_then_exits_130(run_dir, tiny_data, tmp_path, monkeypatch,
                                                                         capsys):
    """SIGINT arriving while last.pt is written at the end of the run's validation: the save completes (the progress
    is kept), then the same clean exit as between updates, which says where to resume."""
    run = resumed_copy(run_dir, tmp_path)
    real_save = torch.save
    sent = []

    def save_with_ctrl_c(obj, handle, *args, **kwargs):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # delivered at once: between bytecodes of this frame
        return real_save(obj, handle, *args, **kwargs)

    monkeypatch.setattr(multibranch.checkpoint.format.torch, "save", save_with_ctrl_c)
    assert main(["train", "--data", str(tiny_data), "--out", str(run), "--resume", "--max-steps", "4",
                 "--no-progress", "--threads", "1"]) == 130
    err = one_error_line(capsys)
    assert err == "multibranch train: interrupted at update 4; continue with --resume"
    assert torch.load(run / "last.pt", weights_only=True)["training"]["state"]["step"] == 4  # saved whole
    assert not temporaries(run)


def test_an_interrupt_inside_torch_save_abandons_the_file_cleanly(run_dir, tiny_data, tmp_path, monkeypatch, capsys):
    """A KeyboardInterrupt that does get into the write (a second Ctrl-C): the new file is abandoned, the
    previous last.pt stays, no temporary is left, and the exit is the clean 130 (torch.save would turn
    it into a RuntimeError: a double traceback)."""
    run = resumed_copy(run_dir, tmp_path)
    before = digest(run / "last.pt")
    real_save = torch.save

    class Interrupting:
        def __init__(self, handle):
            self.handle, self.calls = handle, 0

        def write(self, data):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt
            return self.handle.write(data)

        def __getattr__(self, name):
            return getattr(self.handle, name)

    def save(obj, handle, *args, **kwargs):
        return real_save(obj, Interrupting(handle), *args, **kwargs)

    monkeypatch.setattr(multibranch.checkpoint.format.torch, "save", save)
    assert main(["train", "--data", str(tiny_data), "--out", str(run), "--resume", "--max-steps", "4",
                 "--no-progress", "--threads", "1"]) == 130
    assert one_error_line(capsys) == "multibranch train: interrupted"
    assert digest(run / "last.pt") == before and not temporaries(run)
