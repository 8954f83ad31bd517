"""The classification commands end to end: `prepare --task classify`, `train` on its directory,
`classify` (labels, --probs, empty lines, atomic -o) and their bad-input errors."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
import yaml

from multibranch.cli import main
from tests.helpers.classification import classifier_experiment, synthetic_lines


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("classify_cli")
    (root / "train.tsv").write_text("".join(synthetic_lines(240, seed=3)), encoding="utf-8")
    assert main(["prepare", "--task", "classify", "--train", str(root / "train.tsv"), "--holdout", "0.1",
                 "--out", str(root / "data"), "--vocab-size", "60", "--seed", "2"]) == 0
    cfg = classifier_experiment(max_steps=60, valid_every=30).to_dict()
    (root / "exp.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    assert main(["train", "--data", str(root / "data"), "--out", str(root / "run"), "--config", str(root / "exp.yaml"),
                 "--no-progress", "--threads", "1"]) == 0
    return root


def test_classify_labels_lines_and_keeps_empty_lines(classify_run, tmp_path, capsys):
    rng = random.Random(5)
    words = "the a of to is on in it and".split()
    keywords = {"north": "place", "seven": "number", "red": "colour"}
    cases = [(k, " ".join(rng.choices(words, k=3) + [k])) for k in keywords for _ in range(5)]
    text = "\n".join(x for _, x in cases[:7]) + "\n\n" + "\n".join(x for _, x in cases[7:]) + "\n"
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "labels.txt"
    assert main(["classify", "--ckpt", str(classify_run / "run" / "best.pt"), "-i", str(tmp_path / "in.txt"),
                 "-o", str(out), "--device", "cpu"]) == 0
    got = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(got) == len(cases) + 1 and got[7] == ""  # one line per input line; the empty one stays empty
    predicted = got[:7] + got[8:]
    correct = sum(p == keywords[k] for p, (k, _) in zip(predicted, cases))
    assert correct >= 13  # of 15

    assert main(["classify", "--ckpt", str(classify_run / "run" / "best.pt"), "-i", str(tmp_path / "in.txt"),
                 "--probs", "--device", "cpu"]) == 0
    first = capsys.readouterr().out.split("\n")[0]
    label, probs = first.split("\t")
    values = dict(item.split("=") for item in probs.split())
    assert sorted(values) == ["colour", "number", "place"]
    assert sum(map(float, values.values())) == pytest.approx(1.0, abs=2e-4)
    assert label == max(values, key=lambda k: float(values[k])) == got[0]


def test_classify_says_how_many_texts_it_cut_to_the_model_s_positions(classify_run, tmp_path, capsys, caplog):
    from multibranch.loading.checkpoint import load_model

    limit = load_model(classify_run / "run" / "best.pt").config.model.max_positions - 2
    long = " ".join(["north the a"] * limit)
    (tmp_path / "in.txt").write_text(f"the north\n{long}\nis seven\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert main(["classify", "--ckpt", str(classify_run / "run" / "best.pt"), "-i", str(tmp_path / "in.txt"),
                     "--device", "cpu"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"1 of 3 texts are longer than the classifier's {limit} tokens; each is classified from its "
                        f"first {limit} tokens (pairs: both texts shortened, longest first), as prepare cut the "
                        "training data"]


def test_classify_refuses_bad_arguments(classify_run, tmp_path, capsys):
    ckpt = str(classify_run / "run" / "best.pt")
    (tmp_path / "in.txt").write_text("red car\n", encoding="utf-8")
    assert main(["classify", "--ckpt", ckpt, "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "in.txt")]) == 2
    assert (tmp_path / "in.txt").read_text() == "red car\n"
    assert main(["classify", "--ckpt", ckpt, "-i", str(tmp_path / "missing.txt")]) == 2
    assert main(["classify", "--ckpt", str(tmp_path / "nope.pt"), "-i", str(tmp_path / "in.txt")]) == 2
    assert main(["classify", "--ckpt", ckpt, "-i", str(tmp_path / "in.txt"), "--batch-size", "0"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 4 and all(line.startswith("multibranch classify: error: ") for line in errors)


def test_classify_refuses_a_translation_checkpoint(tiny_data, tmp_path, capsys):
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions
    from tests.helpers.configs import tiny_experiment

    train(tiny_experiment(max_steps=1, valid_every=1), RunOptions(tiny_data, tmp_path / "run"))
    (tmp_path / "in.txt").write_text("a b\n", encoding="utf-8")
    assert main(["classify", "--ckpt", str(tmp_path / "run" / "last.pt"), "-i", str(tmp_path / "in.txt")]) == 2
    assert "is a translation model, not a classification model; use `multibranch translate`" in capsys.readouterr().err


def test_translate_refuses_a_classification_checkpoint(classify_run, tmp_path, capsys):
    ckpt = classify_run / "run" / "best.pt"
    (tmp_path / "in.txt").write_text("a b\n", encoding="utf-8")
    assert main(["translate", "--ckpt", str(ckpt), "-i", str(tmp_path / "in.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"multibranch translate: error: {ckpt} is a classification model, not a translation model; "
                   "use `multibranch classify`"]


def test_prepare_classify_flag_errors(tmp_path, capsys):
    (tmp_path / "t.tsv").write_text("".join(synthetic_lines(30, seed=1)), encoding="utf-8")
    base = ["prepare", "--train", str(tmp_path / "t.tsv"), "--out", str(tmp_path / "d")]
    assert main([*base, "--task", "classify"]) == 2  # neither --valid nor --holdout
    assert main([*base, "--task", "classify", "--holdout", "5", "--valid", str(tmp_path / "t.tsv")]) == 2
    assert main([*base, "--task", "classify", "--holdout", "5", "--src", "en"]) == 2
    assert main([*base, "--holdout", "5"]) == 2  # a classification flag without --task classify
    assert main([*base, "--task", "classify", "--holdout", "1.5"]) == 2
    assert main([*base, "--task", "classify", "--holdout", "5", "--label-column", "1", "--text-column", "1"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 6 and all(line.startswith("multibranch prepare: error: ") for line in errors)
    assert not (tmp_path / "d").exists()
    assert main([*base, "--task", "classify", "--holdout", "5", "--format", "trec"]) == 2  # rows are not TREC
    assert "multibranch prepare: error: " in capsys.readouterr().err


def test_evaluate_classify_scores_and_confusion(tmp_path, capsys):
    (tmp_path / "hyp.txt").write_text("a\ta=0.9 b=0.1\na\nb\nb\nc\nc\n", encoding="utf-8")  # --probs columns ignored
    (tmp_path / "ref.txt").write_text("a\na\na\nb\nb\nc\n", encoding="utf-8")
    assert main(["evaluate", "--task", "classify", "--hyp", str(tmp_path / "hyp.txt"), "--ref", str(tmp_path / "ref.txt"),
                 "--json", "-"]) == 0
    captured = capsys.readouterr()
    import json

    report = json.loads(captured.out)
    assert report["accuracy"] == pytest.approx(4 / 6)
    assert report["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    assert report["confusion"] == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert "accuracy = 66.67" in captured.err


def test_evaluate_classify_bad_input(tmp_path, capsys):
    (tmp_path / "hyp.txt").write_text("a\n\nb\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("a\nb\nb\n", encoding="utf-8")
    (tmp_path / "short.txt").write_text("a\n", encoding="utf-8")
    base = ["evaluate", "--task", "classify", "--hyp", str(tmp_path / "hyp.txt")]
    assert main([*base, "--ref", str(tmp_path / "ref.txt")]) == 2  # empty label on line 2
    assert main([*base, "--ref", str(tmp_path / "short.txt")]) == 2
    assert main([*base, "--ref", str(tmp_path / "ref.txt"), "--sentence-level"]) == 2
    assert main([*base, "--ref", str(tmp_path / "ref.txt"), "--ref", str(tmp_path / "ref.txt")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 4 and all(line.startswith("multibranch evaluate: error: ") for line in errors)
    assert "hyp.txt:2: empty label" in errors[0]


def test_train_refuses_a_classification_preset_on_translation_data(tiny_data, tmp_path, capsys):
    """The data decides the task; a preset made for another task is one clear line, not a silent
    translation run (and the run directory is not made)."""
    out = tmp_path / "run"
    assert main(["train", "--preset", "trec6-tiny", "--data", str(tiny_data), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"multibranch train: error: the config is for classification but {tiny_data} holds translation "
                   "data; prepare it with `multibranch prepare --task classify` or pick a translation preset"]
    assert not out.exists()


def test_classify_ensemble_averages_the_members_probabilities(classify_run, tmp_path, capsys):
    import torch

    from multibranch.checkpoint.format import load_checkpoint, save_checkpoint
    from multibranch.commands.classify import format_line
    from multibranch.loading.checkpoint import load_model
    from multibranch.tasks.classification.inference import classify_lines, label_names

    members = sorted(str(p) for p in (classify_run / "run" / "checkpoints").glob("step_*.pt"))[-2:]
    lines = ["red of the", "seven it is", "the north", "a a red seven"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    assert main(["classify", "--ckpt", *members, "-i", str(tmp_path / "in.txt"), "-o", str(out), "--probs",
                 "--device", "cpu"]) == 0
    loaded = [load_model(m, "cpu", task="classification") for m in members]
    probs = [classify_lines(m.model, m.tokenizer, lines) for m in loaded]
    assert not torch.allclose(probs[0], probs[1], atol=1e-3)  # two different members
    mean = (probs[0] + probs[1]) / 2
    expected = [format_line(label_names(loaded[0].config), row.tolist(), True) for row in mean]
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expected

    # a member with other labels (here: the same ones in another order) is refused before anything is written
    payload = load_checkpoint(members[0])
    payload["config"]["classifier"]["labels"] = payload["config"]["classifier"]["labels"][::-1]
    save_checkpoint(tmp_path / "reordered.pt", payload)
    out.unlink()
    assert main(["classify", "--ckpt", members[0], str(tmp_path / "reordered.pt"), "-i", str(tmp_path / "in.txt"),
                 "-o", str(out), "--device", "cpu"]) == 2
    assert "same labels in the same order" in capsys.readouterr().err and not out.exists()
    # and the output may not overwrite a member
    assert main(["classify", "--ckpt", *members, "-i", str(tmp_path / "in.txt"), "-o", members[0]]) == 2
    assert "same file as input" in capsys.readouterr().err
