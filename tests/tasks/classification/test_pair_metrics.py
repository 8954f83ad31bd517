"""`evaluate --task classify`: the F1 of the positive class (MRPC's metric) and Matthews correlation
(CoLA's), against a hand-computed binary case and Gorodkin's definition computed with numpy."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from multibranch.cli import main
from multibranch.tasks.classification.metrics import classification_scores
from tests.helpers.cli import one_error_line

# TP 3, FN 1, FP 2, TN 4: MCC = (3*4 - 2*1) / sqrt(5*4*6*5), F1(1) = 2*3 / (2*3 + 2 + 1)
REFS = ["1", "1", "1", "1", "0", "0", "0", "0", "0", "0"]
HYPS = ["1", "1", "1", "0", "1", "1", "0", "0", "0", "0"]


def test_binary_mcc_and_positive_f1_by_hand():
    scores = classification_scores(HYPS, REFS, positive="1")
    assert scores["mcc"] == pytest.approx(10 / 600**0.5)
    assert scores["positive_f1"] == pytest.approx(6 / 9)
    assert classification_scores(REFS, REFS)["mcc"] == pytest.approx(1.0)
    assert classification_scores(["0"] * 10, REFS)["mcc"] == 0.0  # one predicted class: undefined, 0 as sklearn


def _gorodkin(hyps: list[str], refs: list[str]) -> float:
    """R_K: the covariance of the one-hot matrices over the square root of their own covariances."""
    labels = sorted(set(hyps) | set(refs))
    x = np.array([[h == k for k in labels] for h in hyps], dtype=float)
    y = np.array([[r == k for k in labels] for r in refs], dtype=float)
    def cov(a, b):
        return float(((a - a.mean(0)) * (b - b.mean(0))).sum())

    return cov(x, y) / np.sqrt(cov(x, x) * cov(y, y))


def test_multiclass_mcc_is_gorodkins_rk():
    rng = random.Random(3)
    refs = [rng.choice("abc") for _ in range(200)]
    hyps = [r if rng.random() < 0.6 else rng.choice("abc") for r in refs]
    assert classification_scores(hyps, refs)["mcc"] == pytest.approx(_gorodkin(hyps, refs))


def test_evaluate_prints_and_writes_them(tmp_path, capsys):
    (tmp_path / "hyp.txt").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(REFS) + "\n", encoding="utf-8")
    base = ["evaluate", "--task", "classify", "--hyp", str(tmp_path / "hyp.txt"), "--ref", str(tmp_path / "ref.txt")]
    assert main([*base, "--json", str(tmp_path / "scores.json")]) == 0
    printed = capsys.readouterr()
    assert "accuracy = 70.00 | macro-F1 = 69.70 | MCC = 0.4082 | F1(1) = 66.67" in printed.out + printed.err
    scores = json.loads((tmp_path / "scores.json").read_text(encoding="utf-8"))
    found = json.dumps(scores)
    assert '"positive_f1": 0.666' in found and '"mcc": 0.408' in found
    assert main([*base, "--positive-label", "0"]) == 0
    printed = capsys.readouterr()
    assert "F1(0) = 72.73" in printed.out + printed.err  # TN 4, FP 2, FN 1: 2*4 / (2*4 + 1 + 2)
    assert main([*base, "--positive-label", "yes"]) == 2
    assert "--positive-label 'yes'" in one_error_line(capsys)
