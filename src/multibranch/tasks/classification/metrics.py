"""Classification scores: accuracy, per-label precision/recall/F1, macro-F1, Matthews correlation (CoLA's
metric), the F1 of a positive class (MRPC's) and the confusion matrix."""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Sequence
from typing import Any

from multibranch.errors import DataError

logger = logging.getLogger("multibranch.evaluate")


def matthews_corrcoef(confusion: Sequence[Sequence[int]]) -> float:
    """Matthews correlation of a K x K confusion matrix (rows: reference, columns: prediction), Gorodkin's
    multi-class form (the binary MCC for K = 2, as scikit-learn computes it); 0 when a side has one class."""
    total = sum(map(sum, confusion))
    correct = sum(confusion[i][i] for i in range(len(confusion)))
    gold = [sum(row) for row in confusion]  # t_k
    predicted = [sum(column) for column in zip(*confusion)]  # p_k
    covariance = correct * total - sum(t * p for t, p in zip(gold, predicted))
    denominator = math.sqrt((total**2 - sum(p * p for p in predicted)) * (total**2 - sum(t * t for t in gold)))
    return covariance / denominator if denominator else 0.0


def classification_scores(predictions: Sequence[Hashable], references: Sequence[Hashable],
                          labels: Sequence[Hashable] | None = None, positive: Hashable | None = None) -> dict[str, Any]:
    """Scores of `predictions` against `references` (same length, > 0).

    `labels` orders the confusion matrix (rows: reference, columns: prediction) and the per-label
    scores; by default the sorted union of both sides. Macro-F1 averages F1 over the labels that occur
    in the references or the predictions (a label with no true positive scores 0), as scikit-learn does.
    Accuracy and macro-F1 are fractions in [0, 1]; `mcc` is in [-1, 1]; with `positive` (a label),
    `positive_f1` is that label's F1 (one against the rest).
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
    result = {"accuracy": correct / len(references), "macro_f1": sum(f1s) / len(f1s), "mcc": matthews_corrcoef(matrix),
              "examples": len(references), "labels": [str(x) for x in order], "per_label": per_label,
              "confusion": matrix}
    if positive is not None:
        if positive not in index:
            raise ValueError(f"positive label {positive!r} is not in the label list")
        result["positive"], result["positive_f1"] = str(positive), per_label[str(positive)]["f1"]
    return result


def default_positive(references: Sequence[str]) -> str | None:
    """The positive class when none is named: "1" of two labels "0" and "1" (MRPC, and GLUE's binary tasks
    in their numeric form), else None."""
    return "1" if set(references) == {"0", "1"} else None


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


def score_label_lines(hyp_lines: Sequence[str], ref_lines: Sequence[str], hyp_name: str, ref_name: str,
                      allow_unseen: bool = False, positive: str | None = None) -> dict[str, Any]:
    """`evaluate --task classify`: the scores of one predicted label per line (anything after a TAB, as
    `classify --probs` writes, is ignored) against one gold label per line. DataError for different or
    zero line counts, an empty label, and (unless `allow_unseen`, which scores them as wrong and warns)
    predicted labels that the reference never uses. `positive` names the class whose F1 is reported (default:
    `default_positive`); a label that the reference never uses is a DataError."""
    predictions = [line.split("\t", 1)[0].strip() for line in hyp_lines]
    references = [line.strip() for line in ref_lines]
    if len(predictions) != len(references):
        raise DataError(f"line counts differ: {hyp_name} has {len(predictions)} lines, {ref_name} has "
                        f"{len(references)}")
    if not references:
        raise DataError(f"{ref_name}: no labels to score")
    for name, labels in ((hyp_name, predictions), (ref_name, references)):
        empty = next((i for i, label in enumerate(labels) if not label), None)
        if empty is not None:
            raise DataError(f"{name}:{empty + 1}: empty label (an empty input line has no prediction; remove the "
                            "line from both files)")
    unseen = labels_not_in_reference(predictions, references)
    if unseen and not allow_unseen:
        raise DataError(f"{hyp_name} predicts labels that {ref_name} never uses: "
                        f"{_name_labels(unseen, hyp_name)}; {_reference_hint(unseen, references, ref_name)}; "
                        "pass --allow-unseen-labels to score them as wrong predictions")
    if positive is not None and positive not in set(references):
        raise DataError(f"--positive-label {positive!r}: {ref_name} never uses it; {_reference_hint({}, references, ref_name)}")
    result = classification_scores(predictions, references, positive=positive or default_positive(references))
    if unseen:
        logger.warning("%s predicts labels that %s never uses, scored as wrong predictions: %s", hyp_name,
                       ref_name, _name_labels(unseen, hyp_name))
        result["labels_not_in_reference"] = {str(label): len(lines) for label, lines in unseen.items()}
    return result


def _name_labels(unseen: dict[str, list[int]], hyp_name: str, limit: int = 5) -> str:
    """'label' (N lines, first FILE:LINE), ... for at most `limit` labels."""
    named = [f"{label!r} ({len(lines)} line{'s' * (len(lines) > 1)}, first {hyp_name}:{lines[0] + 1})"
             for label, lines in list(unseen.items())[:limit]]
    more = len(unseen) - limit
    return ", ".join(named) + (f" and {more} more" if more > 0 else "")


def _reference_hint(unseen: dict[str, list[int]], references: list[str], ref_name: str, limit: int = 8) -> str:
    """The reference labels that the unseen ones match but for case, or else the labels the reference uses."""
    used = sorted(set(references))
    folded = {label.casefold() for label in unseen}
    twins = [label for label in used if label.casefold() in folded]
    if twins:
        return f"they differ only in case from {ref_name}'s {', '.join(map(repr, twins))} (labels are case-sensitive)"
    shown = ", ".join(map(repr, used[:limit])) + (f" and {len(used) - limit} more" if len(used) > limit else "")
    return f"{ref_name} uses {shown}"


def format_classification(result: dict[str, Any]) -> list[str]:
    """Accuracy / macro-F1 line, then the confusion matrix (rows: reference, columns: prediction)."""
    labels = result["labels"]
    width = max(8, *(len(x) for x in labels)) + 1
    positive = f" | F1({result['positive']}) = {100 * result['positive_f1']:.2f}" if "positive" in result else ""
    lines = [f"accuracy = {100 * result['accuracy']:.2f} | macro-F1 = {100 * result['macro_f1']:.2f} | "
             f"MCC = {result['mcc']:.4f}{positive} | {result['examples']} examples",
             "confusion matrix (rows: reference, columns: prediction):",
             " " * width + "".join(f"{x:>{width}}" for x in labels)]
    for label, row in zip(labels, result["confusion"]):
        lines.append(f"{label:>{width}}" + "".join(f"{n:>{width}}" for n in row))
    return lines
