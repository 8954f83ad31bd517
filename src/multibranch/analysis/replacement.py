"""The Weighted Transformer's learned weights replaced at test time (its Table 3,
docs/papers.md#weighted-ablations): a split translated with the learned kappa/alpha, with 1/M each ("uniform")
and with random points of the simplex ("random": one seeded Dirichlet(1) draw per vector and draw), each scored
with sacreBLEU. The paper: learned 24.8, random 21.1, uniform 23.4 BLEU (newstest2013 En-De). With
`per_module`, also 1/M in one module at a time, the others learned: which modules' weights the model cannot do
without.

    replacement_scores(model, tokenizer, sources, references, ReplacementOptions(draws=3))
    -> {"sentences", "signatures": {"bleu", "chrf"}, "decode", "learned": {"bleu", "chrf"}, "uniform": {...},
        "random": [{"seed", "bleu", "chrf"}, ...], "random_mean": {"bleu", "chrf"},
        "uniform_per_module": [{"name", "bleu", "chrf"}, ...] (per_module; names as analysis/mixing.py's)}

The model's own kappa/alpha are put back after each replacement, also when a translation fails.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from multibranch.evaluate.metrics import score_corpus
from multibranch.experiment.decoding import DecodeConfig
from multibranch.modules.simplex import BranchWeights, replace_branch_weights
from multibranch.tasks.translation.translator import Translator

METRICS = ("bleu", "chrf")


@dataclass(frozen=True)
class ReplacementOptions:
    split: str = "test"
    max_sentences: int | None = None  # the first N sentences of the split (None: all)
    draws: int = 3  # random replacements, seeds 1..draws
    beam: int | None = None  # None: the checkpoint's decode.beam
    device: str = "cpu"
    per_module: bool = False  # also 1/M in one module at a time


@contextmanager
def weights_restored(model: nn.Module) -> Iterator[None]:
    """Put every BranchWeights' kappa/alpha of `model` back as they were when the block ends."""
    saved = [(p, p.detach().clone()) for m in model.modules() if isinstance(m, BranchWeights) for p in (m.kappa, m.alpha)]
    try:
        yield
    finally:
        with torch.no_grad():
            for param, value in saved:
                param.copy_(value)


def replacement_scores(model: nn.Module, tokenizer: Any, sources: list[str], references: list[str],
                       decode: DecodeConfig, options: ReplacementOptions) -> dict[str, Any]:
    """BLEU and chrF of `sources` translated with the learned, uniform and `options.draws` random kappa/alpha (and
    with `options.per_module`, uniform ones in each module alone).

    ValueError when `model` has no kappa/alpha (not a Weighted Transformer) or the line counts differ."""
    if not any(isinstance(m, BranchWeights) for m in model.modules()):
        raise ValueError("the model has no Weighted Transformer kappa/alpha to replace")
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} sources but {len(references)} references")
    if options.beam is not None:
        decode = dataclasses.replace(decode, beam=options.beam)
    translator = Translator(model, tokenizer, decode, options.device)
    signatures: dict[str, str] = {}

    def scored() -> dict[str, float]:
        result = score_corpus(translator.translate(sources), [references], metrics=METRICS)
        signatures.update({metric: result[metric]["signature"] for metric in METRICS})
        return {metric: float(result[metric]["score"]) for metric in METRICS}

    def scored_with(replace: Callable[[], object]) -> dict[str, float]:
        with weights_restored(model):
            replace()
            return scored()

    learned = scored()
    uniform = scored_with(lambda: replace_branch_weights(model, "uniform"))
    random = [{"seed": seed, **scored_with(lambda seed=seed: replace_branch_weights(model, "random", seed=seed))}
              for seed in range(1, options.draws + 1)]
    mean = {metric: statistics.fmean(r[metric] for r in random) for metric in METRICS} if random else None
    report = {"sentences": len(sources), "signatures": signatures, "decode": dataclasses.asdict(decode),
              "learned": learned, "uniform": uniform, "random": random, "random_mean": mean}
    if options.per_module:
        report["uniform_per_module"] = [
            {"name": name, **scored_with(lambda module=module: module.replace_("uniform"))}
            for name, module in model.named_modules() if isinstance(module, BranchWeights)]
    return report
