"""The tools around a classifier checkpoint: the training log's fields, `info --preset` of a
classification preset, `average`, `convert proximal / fold / export` and the `convert ct2` refusal."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from multibranch.cli import main
from multibranch.loading.checkpoint import load_model
from multibranch.models.classifier import Classifier
from multibranch.tasks import train
from multibranch.train.trainer import RunOptions
from tests.helpers.classification import classifier_experiment, synthetic_lines


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory) -> Path:
    """A prepared synthetic labelled set (210 train / 30 valid) and a 3-label classifier trained on it
    (step checkpoints at 10, 20, 30; `log_every` 1)."""
    from multibranch.tasks.classification.prepare import ClassifyPrepareConfig, prepare_classification

    root = tmp_path_factory.mktemp("classify_tools")
    (root / "train.tsv").write_text("".join(synthetic_lines(240, seed=4)), encoding="utf-8")
    prepare_classification(ClassifyPrepareConfig(train=str(root / "train.tsv"), holdout=30, out=str(root / "data"),
                                                 vocab_size=60, seed=2))
    logger = logging.getLogger("multibranch")
    level = logger.level
    logger.setLevel(logging.INFO)  # train.log gets the INFO lines (the CLI sets this level)
    try:
        train(classifier_experiment(max_steps=30, valid_every=10, log_every=1, keep_last=5),
              RunOptions(root / "data", root / "run"))
    finally:
        logger.setLevel(level)
    return root


def _records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]


def _logits(path: Path, src: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return load_model(path).model(src)


# ---- the training log ----------------------------------------------------------------------------


def test_classifier_train_log_reports_accuracy_and_sentences(classifier_run):
    records = _records(classifier_run / "run", "train")
    assert records and all({"accuracy", "sentences", "sentences_per_s"} <= set(r) for r in records)
    assert not any({"ppl", "tokens", "tokens_per_s"} & set(r) for r in records)
    for r in records:
        correct = r["accuracy"] * r["sentences"]
        assert 0.0 <= r["accuracy"] <= 1.0 and correct == pytest.approx(round(correct), abs=1e-6)
    # every training sentence is seen once in epoch 1 (the log of each update is written before the epoch moves on)
    assert sum(r["sentences"] for r in records if r["epoch"] == 1) == 210
    lines = [line for line in (classifier_run / "run" / "train.log").read_text().splitlines() if "| INFO | train |" in line]
    assert lines and all("| accuracy " in line and line.endswith(" sent/s") for line in lines)
    assert not any("ppl" in line or "tok/s" in line for line in lines)


def test_translation_train_log_keeps_its_fields(tiny_data, tmp_path, caplog):
    from tests.helpers.configs import tiny_experiment

    caplog.set_level(logging.INFO, logger="multibranch")
    train(tiny_experiment(max_steps=2, valid_every=2, log_every=1), RunOptions(tiny_data, tmp_path / "run"))
    records = _records(tmp_path / "run", "train")
    assert all({"loss", "nll", "ppl", "tokens", "tokens_per_s", "lr", "grad_norm", "elapsed_s"} <= set(r)
               for r in records)
    assert all(r["ppl"] == pytest.approx(2.718281828459045 ** r["nll"]) for r in records)
    assert not any({"accuracy", "sentences"} & set(r) for r in records)
    lines = [line for line in (tmp_path / "run" / "train.log").read_text().splitlines() if "| INFO | train |" in line]
    assert len(lines) == 2 and all("| ppl " in line and line.endswith(" tok/s") for line in lines)


# ---- info ----------------------------------------------------------------------------------------


def test_info_counts_the_classifier_of_a_classification_preset(capsys):
    assert main(["info", "--preset", "trec6-tiny", "--no-config", "--vocab-size", "1000", "--num-labels", "6"]) == 0
    out = capsys.readouterr().out
    rows = {line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1] for line in out.splitlines()[3:]
            if line.strip() and not line.startswith("total")}
    # by hand: d=256, 3 layers, FFN 1024, 1000 pieces, 6 labels; no decoder, no output projection
    assert rows["embeddings"] == f"{1000 * 256:,d}"
    assert rows["head / dense"] == f"{256 * 256 + 256:,d}" and rows["head / out"] == f"{256 * 6 + 6:,d}"
    assert not any("decoder" in key or "output" in key for key in rows)
    layer = (4 * 256 * 256 + 4 * 256) + (2 * 256 * 1024 + 1024 + 256) + 2 * 2 * 256  # attention, FFN, 2 norms
    assert f"total {1000 * 256 + 3 * layer + 256 * 257 + 256 * 6 + 6:,d}" in " ".join(out.split())


def test_info_num_labels_is_for_classification_presets(capsys):
    assert main(["info", "--preset", "transformer-tiny", "--num-labels", "3"]) == 2
    assert main(["info", "--preset", "sst2-tiny", "--num-labels", "1"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("multibranch info: error: ") for line in errors)


# ---- average -------------------------------------------------------------------------------------


def test_average_best_ranks_classifier_checkpoints_by_accuracy(tmp_path):
    from multibranch.convert.average import select_checkpoints

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    # the lowest losses are not the best accuracies: accuracy must decide (as the trainer's best.pt does)
    for step, accuracy, loss in ((1, 0.70, 0.50), (2, 0.90, 0.80), (3, 0.80, 0.60), (4, 0.60, 0.40)):
        torch.save({"meta": {"step": step, "valid": {"loss": loss, "accuracy": accuracy}}}, folder / f"step_{step:08d}.pt")
    assert [p.name for p in select_checkpoints(tmp_path / "run", best=2)] == ["step_00000002.pt", "step_00000003.pt"]


def test_average_of_classifier_checkpoints_loads_and_is_the_mean(classifier_run, tmp_path, capsys):
    out = tmp_path / "avg.pt"
    assert main(["average", "--run", str(classifier_run / "run"), "--best", "2", "--out", str(out)]) == 0
    chosen = [p for p in capsys.readouterr().out.split(": ")[-1].strip().split(", ")]
    averaged = load_model(out).model
    assert isinstance(averaged, Classifier)
    # on the CPU, as load_model's are: a run on CUDA saves its weights as CUDA tensors
    weights = [torch.load(p, weights_only=True, map_location="cpu")["model"]["out.weight"] for p in chosen]
    torch.testing.assert_close(averaged.out.weight, (weights[0].double() + weights[1].double()).div(2).float())


# ---- convert -------------------------------------------------------------------------------------


def test_proximal_and_fold_of_a_classifier_keep_its_function(classifier_run, tmp_path):
    best = classifier_run / "run" / "best.pt"
    mat, folded = tmp_path / "mat.pt", tmp_path / "folded.pt"
    assert main(["convert", "proximal", "--ckpt", str(best), "--out", str(mat), "--branches", "2",
                 "--drop-branch", "0.2"]) == 0
    assert main(["convert", "fold", "--ckpt", str(mat), "--out", str(folded)]) == 0
    src = torch.tensor([[2, 7, 9, 11, 3, 0], [2, 5, 3, 0, 0, 0]])  # BOS ids EOS, padded
    reference = _logits(best, src)
    loaded = load_model(mat)
    assert isinstance(loaded.model, Classifier) and loaded.config.model.encoder.attention_branches == 2
    assert loaded.config.model.decoder.attention_branches == 1  # a classifier has no decoder to convert
    torch.testing.assert_close(_logits(mat, src), reference, atol=1e-5, rtol=1e-5)
    folded_cfg = load_model(folded).config.model.encoder
    assert folded_cfg.attention_branches == 1 and folded_cfg.heads == 8
    torch.testing.assert_close(_logits(folded, src), reference, atol=1e-5, rtol=1e-5)


def test_export_of_a_classifier_classifies_the_same(classifier_run, tmp_path, capsys):
    best = classifier_run / "run" / "best.pt"
    assert main(["convert", "export", "--ckpt", str(best), "--out", str(tmp_path / "release")]) == 0
    (tmp_path / "in.txt").write_text("the red a\nseven of\n", encoding="utf-8")
    capsys.readouterr()
    outputs = []
    for ckpt in (best, tmp_path / "release"):
        assert main(["classify", "--ckpt", str(ckpt), "-i", str(tmp_path / "in.txt"), "--probs"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 2


def test_ct2_refuses_a_classifier_in_one_line(classifier_run, tmp_path, capsys):
    out = tmp_path / "ct2"
    assert main(["convert", "ct2", "--ckpt", str(classifier_run / "run" / "best.pt"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a classification model; CTranslate2 export is for translation models" in err[0]
    assert not out.exists()
