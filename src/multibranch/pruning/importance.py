"""Head importance (Michel et al., 2019; docs/papers.md#drophead-head-importance): how much the loss depends on each head's gate.

For every head h of every attention module, with all gates at 1 (or at a given mask):

    I_h = (1 / N_tokens) * sum over batches |d NLL_batch / d gate_h|

NLL_batch is the summed teacher-forced token NLL of the batch without label smoothing (the fused
output loss of train/loss.py with eps = 0), in eval mode; for a classifier it is the summed
cross-entropy of the labels and N counts sentences. `normalize` divides each module's scores
by their l2 norm (Michel's --normalize-by-layer), which makes modules comparable.
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
) -> HeadScores:
    """Importance of every head of `sites` (default: all attention modules) over `batches`.

    `gates` (site name -> [H]) evaluates the gradients at a mask instead of at all-ones (the
    pruning curve's recomputed mode); the model is left in eval mode with no gate installed.
    """
    sites = attention_sites(model) if sites is None else sites
    model.eval()
    device = next(model.parameters()).device
    gates = gates or {}
    leaves = {
        s.name: (gates[s.name] if s.name in gates else torch.ones(s.heads)).detach().to(device).float().requires_grad_()
        for s in sites
    }
    totals = {s.name: torch.zeros(s.heads, dtype=torch.float64) for s in sites}
    tokens = 0
    with gates_installed(sites, leaves):
        for batch in batches:
            grads = torch.autograd.grad(batch_nll(model, batch), list(leaves.values()), allow_unused=True)
            for name, grad in zip(leaves, grads, strict=True):
                if grad is not None:
                    totals[name] += grad.detach().abs().double().cpu()
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
