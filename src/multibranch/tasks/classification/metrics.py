"""Classification scores: accuracy, per-label precision/recall/F1, macro-F1 and the confusion matrix."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any


def classification_scores(predictions: Sequence[Hashable], references: Sequence[Hashable],
                          labels: Sequence[Hashable] | None = None) -> dict[str, Any]:
    """Scores of `predictions` against `references` (same length, > 0).

    `labels` orders the confusion matrix (rows: reference, columns: prediction) and the per-label
    scores; by default the sorted union of both sides. Macro-F1 averages F1 over the labels that occur
    in the references or the predictions (a label with no true positive scores 0), as scikit-learn does.
    Accuracy and macro-F1 are fractions in [0, 1].
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions vs {len(references)} references")
    if not references:
        raise ValueError("no examples to score")
    seen = set(predictions) | set(references)
    order = list(labels) if labels is not None else sorted(seen, key=str)
    missing = seen - set(order)
    if missing:
        raise ValueError(f"labels not in the label list: {sorted(map(str, missing))}")
    index = {label: i for i, label in enumerate(order)}
    matrix = [[0] * len(order) for _ in order]
    for p, r in zip(predictions, references):
        matrix[index[r]][index[p]] += 1
    per_label: dict[str, dict[str, float]] = {}
    f1s = []
    for i, label in enumerate(order):
        tp = matrix[i][i]
        gold = sum(matrix[i])
        predicted = sum(row[i] for row in matrix)
        precision = tp / predicted if predicted else 0.0
        recall = tp / gold if gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_label[str(label)] = {"precision": precision, "recall": recall, "f1": f1, "support": gold}
        if label in seen:
            f1s.append(f1)
    correct = sum(matrix[i][i] for i in range(len(order)))
    return {"accuracy": correct / len(references), "macro_f1": sum(f1s) / len(f1s), "examples": len(references),
            "labels": [str(x) for x in order], "per_label": per_label, "confusion": matrix}


def labels_not_in_reference(predictions: Sequence[Hashable], references: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Predicted labels that no reference uses, each with the 0-based indices of the predictions that
    give it, in order of first appearance. `classification_scores` counts such labels into macro-F1
    (F1 0) and the confusion matrix; a non-empty answer usually means the two files spell labels
    differently (e.g. `positive` vs `Positive`), sometimes a class that a reference subset lacks."""
    used = set(references)
    found: dict[Hashable, list[int]] = {}
    for i, label in enumerate(predictions):
        if label not in used:
            found.setdefault(label, []).append(i)
    return found
