"""The score of a model on a set of sentences, as a function of no arguments: the pruning curve, the
dominant-head table and `prune` call it once per mask (the gates installed around the call decide the
model). Translation: corpus BLEU of beam-search translations; classification: accuracy in percent
(so that both are on a 0-100 scale and a drop is in points).

    scorer = make_scorer(model, tokenizer, data, "valid", max_sentences=500, decode=cfg.decode)
    scorer()  -> 34.1      scorer.metric -> "bleu"      scorer.sentences -> 500
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from multibranch.analysis.batches import teacher_forced_batches
from multibranch.evaluate.metrics import score_corpus
from multibranch.experiment.decoding import DecodeConfig
from multibranch.tasks.translation.translator import Translator


class BleuScorer:
    """Translate `sources` with the current model (beam search of `decode`) and score against `references`.

    `last_hypotheses` keeps the translations of the latest call; `signature` the sacreBLEU signature.
    """

    metric = "bleu"

    def __init__(self, model: nn.Module, tokenizer: Any, sources: list[str], references: list[str],
                 decode: DecodeConfig | None = None, device: str = "cpu"):
        if len(sources) != len(references):
            raise ValueError(f"{len(sources)} sources but {len(references)} references")
        self.translator = Translator(model, tokenizer, decode, device)
        self.sources, self.references = sources, references
        self.last_hypotheses: list[str] = []
        self.signature = ""
        self.calls = 0

    @property
    def sentences(self) -> int:
        return len(self.sources)

    def __call__(self) -> float:
        self.last_hypotheses = self.translator.translate(self.sources)
        result = score_corpus(self.last_hypotheses, [self.references], metrics=("bleu",))
        self.signature = result["bleu"]["signature"]
        self.calls += 1
        return float(result["bleu"]["score"])


class AccuracyScorer:
    """Classify the examples of `batches` (LabelBatches) with the current model; accuracy in percent.

    `last_predictions` keeps the predicted label ids of the latest call, in batch order."""

    metric = "accuracy"
    signature = "accuracy (%)"

    def __init__(self, model: nn.Module, batches: list[Any]):
        if not batches:
            raise ValueError("no examples to classify")
        self.model, self.batches = model, batches
        self.last_predictions: list[int] = []
        self.calls = 0

    @property
    def sentences(self) -> int:
        return sum(len(b) for b in self.batches)

    @torch.no_grad()
    def __call__(self) -> float:
        was_training = self.model.training
        self.model.eval()
        try:
            predictions = [self.model(b.src).argmax(-1).cpu() for b in self.batches]  # [B] each
        finally:
            self.model.train(was_training)
        labels = torch.cat([b.labels.cpu() for b in self.batches])
        predicted = torch.cat(predictions)
        self.last_predictions = predicted.tolist()
        self.calls += 1
        return 100.0 * float((predicted == labels).double().mean())


# the tasks make_scorer scores: a translation model by BLEU, a classifier by accuracy
SCORED_TASKS = ("translation", "classification")


def make_scorer(model: nn.Module, tokenizer: Any, data: Any, split: str, max_sentences: int | None,
                decode: DecodeConfig | None, device: str = "cpu", max_tokens: int = 4096) -> BleuScorer | AccuracyScorer:
    """A BLEU scorer on the first `max_sentences` raw sentences of a translation split, or an accuracy
    scorer on the first `max_sentences` examples of a classification split (by the data's kind)."""

    chosen = data.split(split)
    n = len(chosen) if max_sentences is None else min(max_sentences, len(chosen))
    if hasattr(chosen, "labels"):
        return AccuracyScorer(model, teacher_forced_batches(chosen, model.config, max_tokens, n, device))
    return BleuScorer(model, tokenizer, chosen.raw_src_lines()[:n], chosen.raw_tgt_lines()[:n], decode, device)


def agreement(a: BleuScorer | AccuracyScorer, b: BleuScorer | AccuracyScorer) -> float:
    """Share of sentences on which the latest outputs of two scorers are identical (1.0 = all)."""
    left = a.last_hypotheses if isinstance(a, BleuScorer) else a.last_predictions
    right = b.last_hypotheses if isinstance(b, BleuScorer) else b.last_predictions
    if len(left) != len(right) or not left:
        raise ValueError("the two scorers have not scored the same sentences")
    return float(np.mean([x == y for x, y in zip(left, right, strict=True)]))
