"""Corpus BLEU of a model on a set of sentences, as a function of no arguments: the pruning curve and the
dominant-head table call it once per mask (the gates installed around the call decide the model)."""

from __future__ import annotations

from typing import Any

from torch import nn

from multibranch.evaluate.metrics import score_corpus
from multibranch.inference.config import DecodeConfig
from multibranch.inference.translator import Translator


class BleuScorer:
    """Translate `sources` with the current model (beam search of `decode`) and score against `references`.

    `last_hypotheses` keeps the translations of the latest call; `signature` the sacreBLEU signature.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, sources: list[str], references: list[str],
                 decode: DecodeConfig | None = None, device: str = "cpu"):
        if len(sources) != len(references):
            raise ValueError(f"{len(sources)} sources but {len(references)} references")
        self.translator = Translator(model, tokenizer, decode, device)
        self.sources, self.references = sources, references
        self.last_hypotheses: list[str] = []
        self.signature = ""
        self.calls = 0

    def __call__(self) -> float:
        self.last_hypotheses = self.translator.translate(self.sources)
        result = score_corpus(self.last_hypotheses, [self.references], metrics=("bleu",))
        self.signature = result["bleu"]["signature"]
        self.calls += 1
        return float(result["bleu"]["score"])
