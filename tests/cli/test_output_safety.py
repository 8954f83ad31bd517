"""`--force` replaces only its own kind of output, and -o never silently replaces a file.

A prepared data directory (data.json), a training run (config.yaml, last.pt, checkpoints/) and an
analysis report folder (index.md) are each only replaced or written into by the command that made them;
no checkpoint command writes over a run's last.pt (which a resume needs) or best.pt; `translate -o` /
`classify -o` refuse an existing file without --force, before a model is loaded.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from multibranch.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"model": {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1},
        "train": {"max_tokens": 600, "lr": {"schedule": "inverse_sqrt", "lr": 0.002, "warmup": 5}, "valid_every": 2,
                  "log_every": 1, "valid_bleu": False, "max_steps": 2, "seed": 7}}


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (relative name -> sha256): equal snapshots mean nothing changed."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def run_dir(tiny_data, tmp_path_factory) -> Path:
    """A trained tiny translation run (2 updates, one validation: last.pt, best.pt, checkpoints/)."""
    root = tmp_path_factory.mktemp("safety")
    (root / "exp.yaml").write_text(yaml.safe_dump(TINY), encoding="utf-8")
    assert main(["train", "--data", str(tiny_data), "--out", str(root / "run"), "--config", str(root / "exp.yaml"),
                 "--no-progress"]) == 0
    return root / "run"


def test_prepare_force_refuses_to_replace_a_training_run(run_dir, tmp_path, capsys):
    before = snapshot(run_dir)
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid"):
        for lang in ("en", "de"):
            (raw / f"{split}.{lang}").write_text("a b c\nd e f\n", encoding="utf-8")
    assert main(["prepare", "--src", "en", "--tgt", "de", "--train", str(raw / "train"), "--valid",
                 str(raw / "valid"), "--out", str(run_dir), "--vocab-size", "20", "--force"]) == 2
    err = one_error_line(capsys)
    assert "training run directory" in err and str(run_dir) in err
    assert snapshot(run_dir) == before


def test_train_force_refuses_to_write_into_prepared_data(tiny_data, tmp_path, capsys):
    before = snapshot(tiny_data)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY), encoding="utf-8")
    assert main(["train", "--data", str(tiny_data), "--out", str(tiny_data), "--config", str(tmp_path / "exp.yaml"),
                 "--no-progress", "--force"]) == 2
    assert "prepared data directory" in one_error_line(capsys)
    assert snapshot(tiny_data) == before


def test_analyze_force_refuses_to_write_into_prepared_data_or_a_run(run_dir, tiny_data, capsys):
    for out, kind in ((tiny_data, "prepared data directory"), (run_dir, "training run directory")):
        before = snapshot(out)
        assert main(["analyze", "heads", "--ckpt", str(run_dir / "last.pt"), "--data", str(tiny_data), "--out",
                     str(out), "--no-dominant", "--no-curve", "--force"]) == 2
        assert kind in one_error_line(capsys)
        assert snapshot(out) == before


def test_force_still_replaces_its_own_kind(run_dir, tiny_data, tmp_path, capsys):
    """The refusals above are about the kind: the same command may still replace its own output."""
    report = tmp_path / "report"
    args = ["analyze", "heads", "--ckpt", str(run_dir / "last.pt"), "--data", str(tiny_data), "--split", "valid",
            "--out", str(report), "--no-dominant", "--no-curve"]
    assert main(args) == 0
    assert main([*args, "--force"]) == 0
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(TINY), encoding="utf-8")
    run = tmp_path / "run"
    train = ["train", "--data", str(tiny_data), "--out", str(run), "--config", str(tmp_path / "exp.yaml"),
             "--no-progress"]
    assert main(train) == 0
    assert main([*train, "--force"]) == 0
    capsys.readouterr()


def test_average_never_replaces_the_last_checkpoint_of_a_run(run_dir, capsys):
    before = snapshot(run_dir)
    for out in (run_dir / "last.pt", run_dir / "checkpoints" / ".." / "last.pt"):
        assert main(["average", "--run", str(run_dir), "--last", "1", "--out", str(out), "--force"]) == 2
        err = one_error_line(capsys)
        assert "last.pt" in err and "--resume" in err
    assert snapshot(run_dir) == before


def test_no_checkpoint_command_replaces_the_best_checkpoint_of_a_run(run_dir, tiny_checkpoint, capsys):
    """best.pt is protected as last.pt is: an average or a conversion written over it would be taken for the
    run's best validated weights (and training compares against it), with or without --force."""
    before = snapshot(run_dir)
    heads = run_dir.parent / "heads.json"
    heads.write_text('[["encoder.layers.0.self_attn", 0]]')
    for argv in (["average", "--run", str(run_dir), "--last", "1"],
                 ["convert", "fold", "--ckpt", str(tiny_checkpoint)],
                 ["prune", "--ckpt", str(tiny_checkpoint), "--heads-json", str(heads), "--no-speed"]):
        for out in (run_dir / "best.pt", run_dir / "checkpoints" / ".." / "best.pt"):
            assert main([*argv, "--out", str(out), "--force"]) == 2
            err = one_error_line(capsys)
            assert f"--out {out}: is the best.pt of a training run" in err, err
    assert snapshot(run_dir) == before


def test_prune_never_writes_over_its_heads_file(tiny_checkpoint, tmp_path, capsys):
    heads = tmp_path / "heads.json"
    heads.write_text('[["encoder.layers.0.self_attn", 0]]')
    assert main(["prune", "--ckpt", str(tiny_checkpoint), "--heads-json", str(heads), "--no-speed",
                 "--out", str(tmp_path / "pruned.pt"), "--report", str(heads), "--force"]) == 2
    assert f"output is the same file as input {heads}" in one_error_line(capsys)
    assert heads.read_text() == '[["encoder.layers.0.self_attn", 0]]'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heads.json"]


def test_an_output_under_a_file_or_a_missing_folder_is_named_as_such(tiny_checkpoint, tmp_path, capsys):
    src, plain = tmp_path / "in.txt", tmp_path / "plain.txt"
    src.write_text("a b c\n", encoding="utf-8")
    plain.write_text("not a folder\n", encoding="utf-8")
    for out, why in ((plain / "out.txt", f"{plain} is not a directory"),
                     (tmp_path / "missing" / "out.txt", f"{tmp_path / 'missing'} does not exist")):
        assert main(["translate", "--ckpt", str(tiny_checkpoint), "-i", str(src), "-o", str(out)]) == 2
        assert why in one_error_line(capsys)


def test_average_never_replaces_one_of_its_inputs(run_dir, capsys):
    before = snapshot(run_dir)
    step = sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1]
    assert main(["average", "--run", str(run_dir), "--last", "1", "--out", str(step), "--force"]) == 2
    assert "same file as input" in one_error_line(capsys)
    assert snapshot(run_dir) == before


# ---- translate -o / classify -o --------------------------------------------------------------------


def test_translate_refuses_an_existing_output_without_force(run_dir, tmp_path, capsys):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("a b c\n", encoding="utf-8")
    out.write_bytes(b"yesterday's translations\n")
    argv = ["translate", "--ckpt", str(run_dir / "last.pt"), "-i", str(src), "-o", str(out), "--device", "cpu",
            "--beam", "1", "--max-len-b", "5"]
    assert main(argv) == 2
    err = one_error_line(capsys)
    assert str(out) in err and "exists" in err and "--force" in err
    assert out.read_bytes() == b"yesterday's translations\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]
    assert main([*argv, "--force"]) == 0
    assert out.read_bytes() != b"yesterday's translations\n" and out.read_text(encoding="utf-8").count("\n") == 1


def test_translate_score_reference_refuses_an_existing_output_without_force(run_dir, tmp_path, capsys):
    src, out = tmp_path / "in.txt", tmp_path / "scores.tsv"
    src.write_text("a b c\n", encoding="utf-8")
    out.write_bytes(b"old\n")
    argv = ["translate", "--ckpt", str(run_dir / "last.pt"), "-i", str(src), "--score-reference", str(src),
            "-o", str(out), "--device", "cpu"]
    assert main(argv) == 2
    assert "--force" in one_error_line(capsys)
    assert out.read_bytes() == b"old\n"
    assert main([*argv, "--force"]) == 0 and out.read_text(encoding="utf-8").count("\t") == 2


def test_classify_refuses_an_existing_output_without_force(tmp_path, capsys):
    """Refused before the checkpoint is read (here: not even a checkpoint)."""
    ckpt, src, out = tmp_path / "model.pt", tmp_path / "in.txt", tmp_path / "labels.txt"
    ckpt.write_bytes(b"not read: the output check comes first")
    src.write_text("some text\n", encoding="utf-8")
    out.write_bytes(b"earlier labels\n")
    assert main(["classify", "--ckpt", str(ckpt), "-i", str(src), "-o", str(out), "--device", "cpu"]) == 2
    err = one_error_line(capsys)
    assert str(out) in err and "exists" in err and "--force" in err
    assert out.read_bytes() == b"earlier labels\n"
    # with --force the output check passes and the (unreadable) checkpoint is what fails
    assert main(["classify", "--ckpt", str(ckpt), "-i", str(src), "-o", str(out), "--device", "cpu", "--force"]) == 2
    assert "not a multibranch checkpoint" in one_error_line(capsys)
    assert out.read_bytes() == b"earlier labels\n"


def test_no_checkpoint_command_writes_into_a_runs_checkpoints_folder(run_dir, capsys):
    """A file there is taken for a step checkpoint: `average --last` reads it and the training's clean-up deletes it."""
    before = snapshot(run_dir)
    (step,) = sorted((run_dir / "checkpoints").glob("step_*.pt"))
    for out in (step, run_dir / "checkpoints" / "mine.pt"):
        assert main(["average", "--ckpts", str(run_dir / "best.pt"), "--out", str(out), "--force"]) == 2
        err = one_error_line(capsys)
        assert f"--out {out}: is in the checkpoints/ folder of the training run" in err, err
    assert snapshot(run_dir) == before


def test_text_outputs_never_replace_another_commands_output_even_with_force(run_dir, tiny_data, tmp_path, capsys):
    """-o / --json / --report with --force replace an earlier translation or report, never a checkpoint, a file of
    prepared data or a run's own files; a new file beside them is fine."""
    src = tmp_path / "in.txt"
    src.write_text("a b c\n", encoding="utf-8")
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("a b c\n", encoding="utf-8")
    data_before, run_before = snapshot(tiny_data), snapshot(run_dir)
    translate = ["translate", "--ckpt", str(run_dir / "best.pt"), "-i", str(src), "--device", "cpu", "--beam", "1",
                 "--max-len-b", "5", "--force", "-o"]
    evaluate = ["evaluate", "--hyp", str(hyp), "--ref", str(src), "--force", "--json"]
    cases = [(translate, run_dir / "last.pt", "is a multibranch checkpoint"),
             (translate, run_dir / "metrics.jsonl", f"is a file the training run {run_dir.resolve()} keeps"),
             (translate, run_dir / "tokenizer" / "src.model", f"is a file the training run {run_dir.resolve()} keeps"),
             (evaluate, tiny_data / "data.json", f"is inside the prepared data directory {tiny_data.resolve()}, "
                                                  "which its own command writes and replaces whole"),
             (evaluate, tiny_data / "new-scores.json", "is inside the prepared data directory"),
             (translate, run_dir / "checkpoints" / "new.hyp", f"is a file the training run {run_dir.resolve()} keeps")]
    for argv, out, said in cases:
        assert out.exists() or out.name.startswith("new"), out
        assert main([*argv, str(out)]) == 2
        err = one_error_line(capsys)
        assert f" {out}: {said}" in err, err
    assert snapshot(tiny_data) == data_before and snapshot(run_dir) == run_before
    assert main([*translate, str(run_dir / "test.hyp")]) == 0  # a new file in the run: fine
    (run_dir / "test.hyp").unlink()
    assert main([*evaluate, str(tmp_path / "scores.json")]) == 0
    assert main([*evaluate, str(tmp_path / "scores.json")]) == 0  # its own earlier output: replaced


def test_a_report_never_replaces_an_index_md_no_report_wrote(run_dir, tmp_path, capsys):
    """A documentation folder has an index.md too: a report (plot, analyze) adds to such a folder only when its own
    index.md would replace none; a report folder (index.md beside its numbers) is the report's to rewrite."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# My project\n", encoding="utf-8")
    before = snapshot(docs)
    assert main(["plot", str(run_dir), "--out", str(docs), "--force"]) == 2
    assert one_error_line(capsys).endswith(f"{docs} holds an index.md that no report wrote, which the report's "
                                           "would replace; write the report into another folder")
    assert snapshot(docs) == before
    report = tmp_path / "report"
    assert main(["plot", str(run_dir), "--out", str(report)]) == 0
    assert main(["plot", str(run_dir), "--out", str(report), "--force"]) == 0  # its own: rewritten
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine\n", encoding="utf-8")
    assert main(["plot", str(run_dir), "--out", str(notes), "--force"]) == 0  # added to a folder of notes
    assert (notes / "todo.txt").read_text(encoding="utf-8") == "mine\n" and (notes / "index.md").is_file()


def test_a_report_added_to_a_folder_of_other_files_replaces_none_of_them(run_dir, tmp_path, capsys):
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "curves.png").write_bytes(b"a figure drawn by hand")
    before = snapshot(figures)
    assert main(["plot", str(run_dir), "--out", str(figures), "--force"]) == 2
    err = one_error_line(capsys)
    assert f"{figures / 'curves.png'} exists in a folder of other files, and the report does not replace it" in err
    assert snapshot(figures) == before  # the report's files written before the refusal are gone again


def test_a_name_a_report_would_replace_is_refused_before_the_analysis_runs(run_dir, tiny_data, tmp_path, capsys,
                                                                          monkeypatch):
    """The refusal comes before the checkpoint is loaded, so no analysis is computed only to be thrown away."""
    from multibranch.pruning import head_report

    def no_loading(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before the output folder was checked")

    monkeypatch.setattr(head_report, "load_model", no_loading)
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "entropy.png").write_bytes(b"a figure drawn by hand")
    before = snapshot(figures)
    assert main(["analyze", "heads", "--ckpt", str(run_dir / "best.pt"), "--data", str(tiny_data), "--out", str(figures),
                 "--force", "--no-curve"]) == 2
    assert f"{figures / 'entropy.png'} exists in a folder of other files" in one_error_line(capsys)
    assert snapshot(figures) == before


def test_a_report_writes_only_the_names_it_declares(tmp_path):
    from multibranch.figures.report import ReportFolder

    folder = ReportFolder.create(tmp_path / "report", files=("numbers.json", "map_*.png"))
    folder.write_json("numbers.json", {"x": 1})
    folder.write_text("map_0.png", "not really a png")
    folder.write_text("index.md", "# report\n")
    with pytest.raises(ValueError, match="other.json: not among the files this report declared"):
        folder.write_json("other.json", {})
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["index.md", "map_0.png", "numbers.json"]


def test_a_report_cut_short_before_its_index_is_rewritten_by_the_next_run(run_dir, tmp_path):
    report = tmp_path / "report"
    assert main(["plot", str(run_dir), "--out", str(report)]) == 0
    (report / "index.md").unlink()  # as a run killed while drawing leaves it
    assert main(["plot", str(run_dir), "--out", str(report), "--force"]) == 0
    assert (report / "index.md").is_file()
