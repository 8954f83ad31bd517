"""Pieces every layer kind shares: residual sublayers and attention built from the model config."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from torch import Tensor, nn

from multibranch import cpu_kernels
from multibranch.models.config import ModelConfig
from multibranch.modules.attention import ParallelAttention
from multibranch.modules.dropout import dropout
from multibranch.modules.positions import RelativePositions
from multibranch.modules.structured_dropout import DropHead, PathDropout

AttentionRole = Literal["encoder_self", "decoder_self", "cross"]


class Residual(nn.Module):
    """One residual sublayer: post-norm LN(x + Drop(f(x))) or pre-norm x + Drop(f(LN(x))).

    `fused` (set on decoding copies, inference/precision.py): in eval mode on fp32 CPU tensors the post-norm
    LN(x + y) runs as one kernel (`cpu_kernels` add_layer_norm), equal up to summation order."""

    fused = False

    def __init__(self, d_model: int, norm: Literal["post", "pre"], dropout: float, eps: float = 1e-5):
        super().__init__()
        self.pre_norm = norm == "pre"
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = dropout

    def forward(self, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + dropout(fn(self.norm(x)), self.dropout, self.training)
        y = dropout(fn(x), self.dropout, self.training)
        if (self.fused and not self.training and x.is_contiguous() and y.is_contiguous() and x.shape == y.shape
                and cpu_kernels.usable(x, y, self.norm.weight, self.norm.bias)):
            return cpu_kernels.kernels().add_layer_norm(x, y, self.norm.weight, self.norm.bias, self.norm.eps)
        return self.norm(x + y)


def build_attention(
    cfg: ModelConfig,
    role: AttentionRole,
    branches: int = 1,
    heads: int | None = None,
    head_dim: int | None = None,
    merge: Literal["mean", "mean_sq"] = "mean",
    drop_branch: PathDropout | None = None,
    head_drop: bool = False,
) -> ParallelAttention:
    """An attention module with the model-wide options (attention dropout, DropHead, relative
    positions for self-attention) applied, so every layer kind gets them the same way."""
    heads = heads or cfg.heads
    head_dim = head_dim or cfg.d_model // heads
    drophead = None
    if getattr(cfg.drophead, role) and not cfg.drophead.rate.is_zero:
        drophead = DropHead(branches * heads, cfg.drophead.rate, cfg.drophead.max_redraws)
    relative = None
    if cfg.relative_positions > 0 and role != "cross":
        relative = RelativePositions(cfg.relative_positions, head_dim, cfg.share_relative_kv)
    attention = ParallelAttention(
        cfg.d_model,
        heads,
        branches=branches,
        head_dim=head_dim,
        dropout=cfg.attention_dropout,
        merge=merge,
        drop_branch=drop_branch,
        head_drop=head_drop,
        drophead=drophead,
        relative=relative,
    )
    attention.role = role  # which attention type it is, for the head analyses
    return attention
