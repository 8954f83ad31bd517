"""`--force` replaces only output of its own kind, by one rule (multibranch.data.directories.refuse_replacing).

An existing --out is replaced only when it is an empty directory or recognisably what the command writes
(prepared data: data.json; a CTranslate2 directory: model.bin + config.json; a release export: its
config.json format; a Hugging Face folder: config.json with model_type; a checkpoint file: the
multibranch checkpoint format). Anything else (a training run, a folder of notes, a text file, another
command's output) is refused with one line naming what it is, exit code 2, and nothing changes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from multibranch.cli import main

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MULTIBRANCH_CPU_KERNELS": "0"}

pytestmark = pytest.mark.usefixtures("one_thread")


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "multibranch", *map(str, args)], env=ENV, capture_output=True,
                          text=True, timeout=300)


def refused(done: subprocess.CompletedProcess) -> str:
    """The one error line of a refused command."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (or `root` itself) -> sha256: equal snapshots mean nothing changed."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture
def run_dir(tiny_checkpoint, tmp_path) -> Path:
    """A training run directory: config.yaml, last.pt, checkpoints/step_12.pt."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {}\n", encoding="utf-8")
    shutil.copy(tiny_checkpoint, run / "last.pt")
    shutil.copy(tiny_checkpoint, run / "checkpoints" / "step_12.pt")
    return run


@pytest.fixture
def notes(tmp_path) -> Path:
    """A directory of the user's own files."""
    folder = tmp_path / "notes"
    (folder / "drafts").mkdir(parents=True)
    (folder / "todo.txt").write_text("finish the paper\n", encoding="utf-8")
    (folder / "drafts" / "intro.md").write_text("# Intro\n", encoding="utf-8")
    return folder


def assert_refused(args: list, out: Path, found: str, kind: str) -> None:
    before = snapshot(out)
    line = refused(cli(*args))
    assert str(out) in line and f"is a {found}" in line and f"not a {kind}" in line, line
    assert snapshot(out) == before


@pytest.mark.parametrize("conversion,kind", [("to-hf", "Hugging Face model folder"),
                                             ("ct2", "CTranslate2 model directory")])
def test_convert_force_keeps_a_training_run(conversion, kind, tiny_checkpoint, run_dir):
    assert_refused(["convert", conversion, "--ckpt", tiny_checkpoint, "--out", run_dir, "--force"], run_dir,
                   "training run directory", kind)


@pytest.mark.parametrize("conversion,kind", [("to-hf", "Hugging Face model folder"),
                                             ("ct2", "CTranslate2 model directory"),
                                             ("export", "release export directory")])
def test_convert_force_keeps_a_folder_of_notes(conversion, kind, tiny_checkpoint, notes):
    assert_refused(["convert", conversion, "--ckpt", tiny_checkpoint, "--out", notes, "--force"], notes,
                   "directory of other files", kind)


def test_prepare_force_keeps_an_unmarked_directory(tiny_data, notes):
    raw = tiny_data.parent / "raw"
    assert_refused(["prepare", "--src", "src", "--tgt", "tgt", "--train", raw / "train", "--valid", raw / "valid",
                    "--out", notes, "--vocab-size", "200", "--force"], notes,
                   "directory of other files", "prepared data directory")


def test_export_force_keeps_prepared_data(tiny_checkpoint, tiny_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    assert_refused(["convert", "export", "--ckpt", tiny_checkpoint, "--out", data, "--force"], data,
                   "prepared data directory", "release export directory")


def test_average_force_keeps_a_text_file(tiny_checkpoint, tmp_path):
    out = tmp_path / "notes.txt"
    out.write_text("not a checkpoint\n", encoding="utf-8")
    assert_refused(["average", "--ckpts", tiny_checkpoint, "--out", out, "--force"], out,
                   "file that is not a multibranch checkpoint", "multibranch checkpoint")


def test_checkpoint_conversions_force_keep_a_text_file(tiny_checkpoint, tmp_path):
    out = tmp_path / "notes.txt"
    out.write_text("not a checkpoint\n", encoding="utf-8")
    assert_refused(["convert", "fold", "--ckpt", tiny_checkpoint, "--out", out, "--force"], out,
                   "file that is not a multibranch checkpoint", "multibranch checkpoint")


def test_ct2_force_keeps_a_hugging_face_folder(tiny_checkpoint, tmp_path, capsys):
    hf = tmp_path / "hf"
    assert main(["convert", "to-hf", "--ckpt", str(tiny_checkpoint), "--out", str(hf)]) == 0
    assert_refused(["convert", "ct2", "--ckpt", tiny_checkpoint, "--out", hf, "--force"], hf,
                   "Hugging Face model folder", "CTranslate2 model directory")
    capsys.readouterr()


def test_force_replaces_its_own_kind_and_an_empty_directory(tiny_checkpoint, tiny_data, tmp_path, capsys):
    """The refusals above are about the kind: each command still replaces its own output, or fills an empty
    directory, with --force (and refuses its own output without --force)."""
    ckpt = str(tiny_checkpoint)
    for conversion in ("ct2", "to-hf", "export"):
        out = tmp_path / conversion
        out.mkdir()  # empty: allowed
        args = ["convert", conversion, "--ckpt", ckpt, "--out", str(out)]
        assert main([*args, "--force"]) == 0
        assert main(args) == 2
        assert main([*args, "--force"]) == 0
    average = tmp_path / "avg.pt"
    args = ["average", "--ckpts", ckpt, "--out", str(average)]
    assert main(args) == 0
    assert main([*args, "--force"]) == 0
    raw = tiny_data.parent / "raw"
    prepare = ["prepare", "--src", "src", "--tgt", "tgt", "--train", str(raw / "train"), "--valid",
               str(raw / "valid"), "--out", str(tmp_path / "data"), "--vocab-size", "200"]
    assert main(prepare) == 0
    assert main([*prepare, "--force"]) == 0
    capsys.readouterr()
