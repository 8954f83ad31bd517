"""Head importance (Michel et al., 2019; docs/papers.md#drophead-head-importance): how much the loss depends on each head's gate.

For every head h of every attention module, with all gates at 1 (or at a given mask):

    I_h = (1 / N_tokens) * sum over batches |d NLL_batch / d gate_h|        (per batch, the default)
    I_h = (1 / N_tokens) * sum over examples x |d NLL_x / d gate_h|         (per_example)

NLL is the summed teacher-forced token NLL without label smoothing (the fused output loss of
train/loss.py with eps = 0), in eval mode; for a classifier it is the summed cross-entropy of the
labels and N counts sentences. The per-batch form is Michel et al.'s code: gradients of opposite sign
cancel within a batch, so the scores depend on the batch size. The per-example form is their paper's
formula (an expectation over examples of the absolute derivative) and does not: every example gets a
gate row of its own ([B, H] gates, one backward pass per batch), whose gradient is that example's.
`normalize` divides each module's scores by their l2 norm (Michel's --normalize-by-layer), which makes
modules comparable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multibranch.analysis.batches import AnyBatch, batch_units
from multibranch.analysis.heads import AttentionSite, HeadScores, attention_sites, gates_installed
from multibranch.tasks.classification.task import LabelBatch
from multibranch.train.loss import output_layer_loss


def batch_nll(model: nn.Module, batch: AnyBatch) -> Tensor:
    """Summed NLL without label smoothing, differentiable: of the target tokens (teacher forcing) of a
    translation batch, of the labels of a classification batch."""
    if isinstance(batch, LabelBatch):
        logits = model(batch.src).float()  # [B, C]
        return F.cross_entropy(logits, batch.labels, reduction="sum")
    pad = model.config.pad_id
    features = model(batch.src, batch.prev, features_only=True)  # [B, T, d]
    keep = batch.tgt.ne(pad)  # [B, T]
    loss, _ = output_layer_loss(features[keep], model.output_projection, model.output_bias, batch.tgt[keep],
                                eps=0.0, pad_id=pad)
    return loss


def head_importance(
    model: nn.Module,
    batches: Iterable[AnyBatch],
    sites: list[AttentionSite] | None = None,
    normalize: bool = True,
    gates: Mapping[str, Tensor] | None = None,
    per_example: bool = False,
) -> HeadScores:
    """Importance of every head of `sites` (default: all attention modules) over `batches`.

    `gates` (site name -> [H]) evaluates the gradients at a mask instead of at all-ones (the
    pruning curve's recomputed mode); `per_example` takes the absolute value per example instead of
    per batch (see the module docstring). The model is left in eval mode with no gate installed.
    """
    sites = attention_sites(model) if sites is None else sites
    model.eval()
    device = next(model.parameters()).device
    gates = gates or {}
    base = {s.name: (gates[s.name] if s.name in gates else torch.ones(s.heads)).detach().to(device).float()
            for s in sites}  # [H] each
    totals = {s.name: torch.zeros(s.heads, dtype=torch.float64) for s in sites}
    tokens = 0
    for batch in batches:
        rows = len(batch) if per_example else None
        # [H], or [B, H] per example: row b scales example b's heads, so its gradient is example b's alone
        leaves = {name: (gate if rows is None else gate.expand(rows, -1)).clone().requires_grad_()
                  for name, gate in base.items()}
        with gates_installed(sites, leaves):
            grads = torch.autograd.grad(batch_nll(model, batch), list(leaves.values()), allow_unused=True)
        for name, grad in zip(leaves, grads, strict=True):
            if grad is not None:
                absolute = grad.detach().abs().double()  # [H] or [B, H]
                totals[name] += (absolute if rows is None else absolute.sum(0)).cpu()
        tokens += batch_units(batch)
    if tokens == 0:
        raise ValueError("the importance set has no target tokens")
    scores = {name: (total / tokens).float() for name, total in totals.items()}
    return normalize_per_module(scores) if normalize else scores


def normalize_per_module(scores: HeadScores) -> HeadScores:
    """Each module's scores divided by their l2 norm (all-zero modules stay zero)."""
    out = {}
    for name, values in scores.items():
        norm = values.norm()
        out[name] = values / norm if norm > 0 else values.clone()
    return out
