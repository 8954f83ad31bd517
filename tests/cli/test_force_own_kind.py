"""`--force` replaces only output of its own kind, by one rule (multibranch.data.directories.refuse_replacing).

An existing --out is replaced only when it is an empty directory or recognisably what the command writes
(prepared data: data.json; a CTranslate2 directory: model.bin + config.json; a release export: its
config.json format; a Hugging Face folder: config.json with model_type; a checkpoint file: the
multibranch checkpoint format). Anything else (a training run, a folder of notes, a text file, another
command's output) is refused with one line naming what it is, exit code 2, and nothing changes.

Each command (each `convert` conversion, `prepare`, `average`) is refused once in a real `python -m multibranch`
process (`process=True`: exactly one line on stderr, nothing logged before it); the other cases run `main()` in
this process (tests/helpers/refusals.py).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from multibranch.cli import main
from tests.helpers.refusals import refusal

pytestmark = pytest.mark.usefixtures("one_thread")


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


def assert_refused(args: list, out: Path, found: str, kind: str, capfd, caplog, *,
                   process: bool = False) -> None:
    before = snapshot(out)
    line = refusal(args, capfd, caplog, process=process)
    assert str(out) in line and f"is a {found}," in line and line.count(f"not a {kind}") == 1, line
    assert snapshot(out) == before


@pytest.mark.parametrize("conversion,kind", [("to-hf", "Hugging Face model folder"),
                                             ("ct2", "CTranslate2 model directory")])
def test_convert_force_keeps_a_training_run(conversion, kind, tiny_checkpoint, run_dir, capfd, caplog):
    assert_refused(["convert", conversion, "--ckpt", tiny_checkpoint, "--out", run_dir, "--force"], run_dir,
                   "training run directory", kind, capfd, caplog, process=True)


@pytest.mark.parametrize("conversion,kind,process", [("to-hf", "Hugging Face model folder", False),
                                                     ("ct2", "CTranslate2 model directory", False),
                                                     ("export", "release export directory", True)])
def test_convert_force_keeps_a_folder_of_notes(conversion, kind, process, tiny_checkpoint, notes, capfd, caplog):
    assert_refused(["convert", conversion, "--ckpt", tiny_checkpoint, "--out", notes, "--force"], notes,
                   "directory of other files", kind, capfd, caplog, process=process)


def test_prepare_force_keeps_an_unmarked_directory(tiny_data, notes, capfd, caplog):
    raw = tiny_data.parent / "raw"
    assert_refused(["prepare", "--src", "src", "--tgt", "tgt", "--train", raw / "train", "--valid", raw / "valid",
                    "--out", notes, "--vocab-size", "200", "--force"], notes,
                   "directory of other files", "prepared data directory", capfd, caplog, process=True)


def test_prepare_force_keeps_a_training_run_kept_inside_the_data(tiny_data, run_dir, tmp_path, capfd, caplog):
    """--force replaces prepared data whole: a run someone trained into it, or a checkpoint averaged into it, would
    go with it, so the replacement is refused, naming them."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    shutil.move(run_dir, data / "runs" / "mat")
    shutil.copy(data / "runs" / "mat" / "last.pt", data / "avg.pt")
    (data / "notes.txt").write_text("not an output\n", encoding="utf-8")
    raw = tiny_data.parent / "raw"
    before = snapshot(data)
    line = refusal(["prepare", "--src", "src", "--tgt", "tgt", "--train", raw / "train", "--valid", raw / "valid",
                    "--out", data, "--vocab-size", "200", "--force"], capfd, caplog, process=True)
    assert line.endswith(f"{data}: holds other commands' output, which replacing it would delete: avg.pt "
                         f"(multibranch checkpoint), runs/mat (training run directory); move it out first, or "
                         "choose another --out"), line
    assert snapshot(data) == before


def test_convert_force_keeps_a_checkpoint_kept_inside_its_output(tiny_checkpoint, tmp_path, capfd, caplog):
    out = tmp_path / "ct2"
    assert main(["convert", "ct2", "--ckpt", str(tiny_checkpoint), "--out", str(out)]) == 0
    shutil.copy(tiny_checkpoint, out / "source.pt")
    before = snapshot(out)
    line = refusal(["convert", "ct2", "--ckpt", tiny_checkpoint, "--out", out, "--force"], capfd, caplog)
    assert "holds other commands' output, which replacing it would delete: source.pt (multibranch checkpoint)" \
        in line, line
    assert snapshot(out) == before


def test_export_force_keeps_prepared_data(tiny_checkpoint, tiny_data, tmp_path, capfd, caplog):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    assert_refused(["convert", "export", "--ckpt", tiny_checkpoint, "--out", data, "--force"], data,
                   "prepared data directory", "release export directory", capfd, caplog)


def test_average_force_keeps_a_text_file(tiny_checkpoint, tmp_path, capfd, caplog):
    out = tmp_path / "notes.txt"
    out.write_text("not a checkpoint\n", encoding="utf-8")
    assert_refused(["average", "--ckpts", tiny_checkpoint, "--out", out, "--force"], out,
                   "file", "multibranch checkpoint", capfd, caplog, process=True)


def test_checkpoint_conversions_force_keep_a_text_file(tiny_checkpoint, tmp_path, capfd, caplog):
    out = tmp_path / "notes.txt"
    out.write_text("not a checkpoint\n", encoding="utf-8")
    assert_refused(["convert", "fold", "--ckpt", tiny_checkpoint, "--out", out, "--force"], out,
                   "file", "multibranch checkpoint", capfd, caplog,
                   process=True)


def test_ct2_force_keeps_a_hugging_face_folder(tiny_checkpoint, tmp_path, capfd, caplog):
    hf = tmp_path / "hf"
    assert main(["convert", "to-hf", "--ckpt", str(tiny_checkpoint), "--out", str(hf)]) == 0
    assert_refused(["convert", "ct2", "--ckpt", tiny_checkpoint, "--out", hf, "--force"], hf,
                   "Hugging Face model folder", "CTranslate2 model directory", capfd, caplog)


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


def test_prepare_force_never_deletes_a_vocabulary_file_it_reuses(tiny_data, tmp_path, capfd, caplog):
    """A model under another name than the output's own would be deleted by the replacement; the data's own
    spm.model is written again (adapted), so re-preparing with it is allowed."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    shutil.copy(data / "spm.model", data / "custom.model")
    raw = tiny_data.parent / "raw"
    before = snapshot(data)
    prepare = ["prepare", "--src", "src", "--tgt", "tgt", "--train", raw / "train", "--valid", raw / "valid",
               "--out", data, "--force", "--spm-model"]
    line = refusal([*prepare, data / "custom.model"], capfd, caplog)
    assert line.endswith(f"{data}: holds the input {data / 'custom.model'}; choose another --out"), line
    assert snapshot(data) == before
    (data / "custom.model").unlink()
    assert main([*map(str, prepare), str(data / "spm.model")]) == 0
    assert (data / "spm.model").is_file() and (data / "data.json").is_file()


@pytest.mark.parametrize("conversion,kind,marker", [("to-hf", "Hugging Face model folder", "multibranch_hf.json"),
                                                    ("ct2", "CTranslate2 model directory", "multibranch_ct2.json")])
def test_convert_force_keeps_a_model_folder_another_program_wrote(conversion, kind, marker, tiny_checkpoint, tmp_path,
                                                                  capfd, caplog):
    """A downloaded Marian model or CTranslate2 directory looks like the converter's own output; only the one
    with the converter's marker file is replaced."""
    out = tmp_path / conversion
    assert main(["convert", conversion, "--ckpt", str(tiny_checkpoint), "--out", str(out)]) == 0
    assert (out / marker).is_file()
    assert main(["convert", conversion, "--ckpt", str(tiny_checkpoint), "--out", str(out), "--force"]) == 0
    (out / marker).unlink()  # now as another program writes it
    (out / "README.md").write_text("# opus-mt-de-en\n", encoding="utf-8")
    before = snapshot(out)
    line = refusal(["convert", conversion, "--ckpt", tiny_checkpoint, "--out", out, "--force"], capfd, caplog)
    assert line.endswith(f"{out}: is a {kind} without {marker}: written by another program (a downloaded model), "
                         "or by multibranch before it marked its folders; --force replaces only a folder it marked: "
                         "delete it yourself or choose another --out"), line
    assert snapshot(out) == before
