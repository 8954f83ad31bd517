"""Label-smoothed cross-entropy fused with the output projection.

Target distribution q for a gold token g (docs/papers.md#shared-label-smoothing):
- "fairseq": q = (1-eps) * onehot(g) + eps / V on every token  ->  (1-eps) NLL + eps * mean_v(-log p_v)
- "onmt":    q = (1-eps) on g, eps / (V-2) on every token except g and pad (OpenNMT / MUTE)
loss = -sum_v q_v log p_v (the onmt KL differs by a constant, so gradients are identical).

`output_layer_loss` computes logits only for the given positions, chunk by chunk, and computes the
gradient w.r.t. the features, weight and bias inside the forward pass: the [N, V] logits are never
stored for backward. Positions are either the non-pad ones (selected by the caller) or all of them
with per-position `weights` (0 for pad): the second keeps every shape independent of the data, as a
captured CUDA graph needs.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Smoothing = Literal["fairseq", "onmt"]


def _weighted_sum(values: Tensor, weights: Tensor | None) -> Tensor:
    """sum_i values[i] (* weights[i])."""
    return values.sum() if weights is None else (values * weights).sum()


def _chunk_loss(
    logits: Tensor, target: Tensor, eps: float, kind: Smoothing, pad_id: int, want_grad: bool,
    weights: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """logits [n, V] fp32, target [n], weights [n] or None -> (loss sum, nll sum, d loss / d logits [n, V] or None)."""
    V = logits.shape[-1]
    lprobs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)  # [n, V]
    gold = lprobs.gather(-1, target[:, None]).squeeze(-1)  # [n]
    nll = -_weighted_sum(gold, weights)
    if eps == 0.0:
        loss = nll
        spread = 0.0
    elif kind == "fairseq":
        spread = eps / V
        loss = (1.0 - eps) * nll - spread * (lprobs.sum() if weights is None else _weighted_sum(lprobs.sum(-1), weights))
    else:
        spread = eps / (V - 2)
        rest = lprobs.sum(-1) - gold - lprobs[:, pad_id]  # [n]
        loss = (1.0 - eps) * nll - spread * _weighted_sum(rest, weights)
    if not want_grad:
        return loss, nll, None
    grad = lprobs.exp_()  # softmax, in place: lprobs is not needed any more
    if spread:
        grad.sub_(spread)
    gold_weight = 1.0 - eps if kind == "fairseq" or eps == 0.0 else 1.0 - eps - spread
    grad.scatter_add_(-1, target[:, None], grad.new_full((target.shape[0], 1), -gold_weight))
    if kind == "onmt" and eps > 0.0:
        grad[:, pad_id] += spread  # q_pad = 0
    if weights is not None:
        grad.mul_(weights[:, None].to(grad.dtype))
    return loss, nll, grad


class _FusedOutputLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, weight, bias, target, eps, kind, pad_id, chunk, weights):  # type: ignore[override]
        # features [N, d], weight [V, d], bias [V] or None, target [N], weights [N] fp32 or None
        acc = torch.promote_types(features.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
        loss = features.new_zeros((), dtype=acc)
        nll = features.new_zeros((), dtype=acc)
        grad_features = torch.empty_like(features)
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        grad_bias = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if bias is not None else None
        for start in range(0, features.shape[0], chunk):
            h = features[start : start + chunk]  # [n, d]
            logits = F.linear(h, weight, bias).to(acc)  # [n, V]
            chunk_loss, chunk_nll, grad = _chunk_loss(logits, target[start : start + chunk], eps, kind, pad_id, True,
                                                      None if weights is None else weights[start : start + chunk])
            loss += chunk_loss
            nll += chunk_nll
            grad = grad.to(logits.dtype if torch.is_autocast_enabled() else features.dtype)
            grad_features[start : start + chunk] = (grad @ weight.to(grad.dtype)).to(features.dtype)
            grad_weight += (grad.t() @ h.to(grad.dtype)).to(acc)
            if grad_bias is not None:
                grad_bias += grad.to(acc).sum(0)
        ctx.save_for_backward(grad_features, grad_weight.to(weight.dtype),
                              grad_bias.to(bias.dtype) if grad_bias is not None else None)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):  # type: ignore[override]
        grad_features, grad_weight, grad_bias = ctx.saved_tensors
        return (
            grad_features * grad_loss.to(grad_features.dtype),
            grad_weight * grad_loss.to(grad_weight.dtype),
            grad_bias * grad_loss.to(grad_bias.dtype) if grad_bias is not None else None,
            None, None, None, None, None, None,
        )


def output_layer_loss(
    features: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    eps: float = 0.1,
    kind: Smoothing = "fairseq",
    pad_id: int = 0,
    chunk: int = 1024,
    weights: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL of `target` [N] given `features` [N, d].

    `weights` [N] (optional) multiplies each position's loss, NLL and gradient: 0 leaves a position out
    without changing any shape. Differentiable w.r.t. features, weight and bias (only the loss; the NLL
    is for reporting).
    """
    if weights is not None:
        weights = weights.to(torch.promote_types(features.dtype, torch.float32))
    if features.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad):
        return _FusedOutputLoss.apply(features, weight, bias, target, eps, kind, pad_id, chunk, weights)
    acc = torch.promote_types(features.dtype, torch.float32)
    loss = features.new_zeros((), dtype=acc)
    nll = features.new_zeros((), dtype=acc)
    for start in range(0, features.shape[0], chunk):
        logits = F.linear(features[start : start + chunk], weight, bias).to(acc)
        chunk_loss, chunk_nll, _ = _chunk_loss(logits, target[start : start + chunk], eps, kind, pad_id, False,
                                               None if weights is None else weights[start : start + chunk])
        loss += chunk_loss
        nll += chunk_nll
    return loss, nll


def reference_loss(logits: Tensor, target: Tensor, eps: float, kind: Smoothing, pad_id: int) -> Tensor:
    """Plain autograd version (for tests): -sum_v q_v log p_v summed over positions."""
    lprobs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # [N, V]
    V = lprobs.shape[-1]
    q = torch.zeros_like(lprobs)
    if kind == "fairseq":
        q += eps / V
        q.scatter_add_(-1, target[:, None], torch.full_like(lprobs[:, :1], 1.0 - eps))
    else:
        q += eps / (V - 2)
        q[:, pad_id] = 0.0
        q.scatter_(-1, target[:, None], 1.0 - eps)
    return -(q * lprobs).sum()
