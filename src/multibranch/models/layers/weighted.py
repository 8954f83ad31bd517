"""Layer kind "weighted": the Weighted Transformer (Ahmed et al., 2017; docs/papers.md#weighted-transformer).

BranchedAttention over a query stream q [B, L, d] and a key/value stream kv [B, S, d], M = heads
branches (§3, eq. 5-7):

    head_i = Attn(q W_i^Q, kv W_i^K, kv W_i^V)                     [B, L, d_v]       eq. 5
    b_i    = kappa_i * head_i W^{O_i} + b_O                        [B, L, d]         eq. 6
    c_i    = FFN_i(b_i) = W_2^i act(W_1^i b_i + b_1^i) + b_2       width d_ff / M ("split") or d_ff ("shared")
    r_i    = b_i + c_i  (branch_residual; else r_i = c_i)
    o      = sum_i alpha_i r_i                                                       eq. 7

W^{O_i} is row block i of the attention's W_O ([M, d_v, d] view); b_O and b_2 are shared by the
branches (with alpha on the simplex each appears once in o). Everything runs batched over the
branch axis (einsum over stacked weights). kappa/alpha live in `BranchWeights` (modules/simplex.py).

Encoder layer:  x -> Residual(BranchedAttention(self))                       (replaces MHA + FFN)
Decoder layer:  "cross" (default): y -> Residual(masked MHA) -> Residual(BranchedAttention(y, memory))
                "self":            y -> Residual(masked BranchedAttention) -> Residual(cross MHA)

Parameters: the baseline's MHA and FFN weights are kept (W_O reused as is; d_ff split over the
branches), plus 2M for kappa/alpha; each branched block replaces two residual sublayers with one, so
it has one LayerNorm (2d) fewer unless `branch_norm` puts it back inside the branches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from multibranch.config import ConfigError
from multibranch.models.config import LayerConfig, ModelConfig
from multibranch.models.layers.common import AttentionRole, Residual, build_attention
from multibranch.modules.attention import ParallelAttention
from multibranch.modules.dropout import dropout
from multibranch.modules.feedforward import ACTIVATIONS
from multibranch.modules.init import init_bias, init_weight, uniform_fan_in
from multibranch.modules.simplex import BranchWeights, replace_branch_weights
from multibranch.modules.state import StateView
from multibranch.schedules import LRConfig

__all__ = ["BranchedAttention", "WeightedLayerConfig", "replace_branch_weights"]


@LayerConfig.register("weighted")
@dataclass
class WeightedLayerConfig(LayerConfig):
    """Weighted Transformer layer (M = model.heads branches).

    ffn_mode: "split" (M FFNs of width d_ff/M, the default) or "shared" (one FFN of width d_ff;
      docs/papers.md#weighted-ffn-width).
    branch_residual: r_i = b_i + c_i (default) or the literal eq. 7 r_i = c_i
      (docs/papers.md#weighted-branch-residual).
    branch_norm: one LayerNorm shared by the branches on r_i (post-norm) or on the FFN input
      (pre-norm); restores the baseline's exact parameter count (off by default).
    decoder_branched: which decoder attention is branched, "cross" (default) or "self"
      (docs/papers.md#weighted-decoder-layout).
    normalization: "simplex" (paper) or "softmax" (ablation, paper §3).
    top_k: ablation, hard top-k gating of alpha (None = off).
    kappa_alpha_lr: schedule of the kappa/alpha group (paper §4.1: noam with warm-up 400);
    kappa_alpha_lr_scale: its width d' in d'^-0.5 (None: d_model / N, N = layers of this stack,
      docs/papers.md#weighted-learning-rate-of-kappa-and-alpha).
    freeze_last: kappa/alpha get LR 0 for the last `freeze_last` updates (needs train.max_steps).
    """

    kind: str = "weighted"
    ffn_mode: Literal["split", "shared"] = "split"
    branch_residual: bool = True
    branch_norm: bool = False
    decoder_branched: Literal["cross", "self"] = "cross"
    normalization: Literal["simplex", "softmax"] = "simplex"
    top_k: int | None = None
    kappa_alpha_lr: LRConfig = field(default_factory=lambda: LRConfig(schedule="noam", warmup=400))
    kappa_alpha_lr_scale: float | None = None
    freeze_last: int = 10000

    def validate(self) -> None:
        if self.freeze_last < 0:
            raise ConfigError(f"freeze_last={self.freeze_last} must be >= 0")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k={self.top_k} must be >= 1 (or null to disable gating)")
        if self.kappa_alpha_lr_scale is not None and self.kappa_alpha_lr_scale <= 0:
            raise ConfigError(f"kappa_alpha_lr_scale={self.kappa_alpha_lr_scale} must be > 0")

    def check(self, model: ModelConfig) -> None:
        if self.ffn_mode == "split" and model.ffn_dim % model.heads:
            raise ConfigError(
                f"weighted layer with ffn_mode='split' needs ffn_dim={model.ffn_dim} divisible by the number of "
                f"branches (heads={model.heads}); change ffn_dim or use ffn_mode='shared'"
            )
        if self.top_k is not None and self.top_k > model.heads:
            raise ConfigError(f"top_k={self.top_k} exceeds the number of branches (heads={model.heads})")

    def branched(self, model: ModelConfig, role: AttentionRole, stack: Literal["encoder", "decoder"]) -> BranchedAttention:
        layers = model.encoder_layers if stack == "encoder" else model.decoder_layers
        width = self.kappa_alpha_lr_scale or model.d_model / layers
        weights = BranchWeights(model.heads, self.normalization, self.top_k, self.kappa_alpha_lr, width,
                                self.freeze_last, group=f"kappa_alpha.{stack}")
        return BranchedAttention(model, self, role, weights)

    def build_encoder_layer(self, model: ModelConfig, index: int) -> nn.Module:
        return WeightedEncoderLayer(model, self)

    def build_decoder_layer(self, model: ModelConfig, index: int) -> nn.Module:
        return WeightedDecoderLayer(model, self)


def branch_heads(
    attn: ParallelAttention,
    x: Tensor,
    memory: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    cache: StateView | None = None,
) -> Tensor:
    """Per-head outputs [B, H, L, d_v] of `attn` before W_O, with its KV cache, relative positions,
    attention dropout and DropHead (scaled per head = per branch)."""
    heads, _ = attn.attend_heads(x, memory, key_padding_mask, causal, cache)  # [B, H, L, d_v]
    head_scale, _ = attn.head_scales(x.shape[0], x.device)  # [1 or B, H] or None
    if head_scale is not None:
        heads = heads * head_scale[:, :, None, None]
    return heads


class BranchedAttention(nn.Module):
    """M branches (head i, kappa_i, W^{O_i}, FFN_i) combined by alpha; see the module docstring."""

    def __init__(self, cfg: ModelConfig, layer: WeightedLayerConfig, role: AttentionRole, weights: BranchWeights):
        super().__init__()
        M, d = cfg.heads, cfg.d_model
        self.branches, self.d_model = M, d
        self.hidden = cfg.ffn_dim // M if layer.ffn_mode == "split" else cfg.ffn_dim
        groups = M if layer.ffn_mode == "split" else 1
        self.attention = build_attention(cfg, role)  # Q/K/V, W_O = [W^{O_1}; ...], b_O, DropHead, positions
        self.w1 = nn.Parameter(torch.empty(groups, d, self.hidden))  # [G, d, d_h]
        self.b1 = nn.Parameter(torch.zeros(groups, self.hidden))  # [G, d_h]
        self.w2 = nn.Parameter(torch.empty(groups, self.hidden, d))  # [G, d_h, d]
        self.b2 = nn.Parameter(torch.zeros(d))  # shared b_2
        self.activation = ACTIVATIONS[cfg.activation]
        self.activation_dropout = cfg.activation_dropout
        self.branch_residual = layer.branch_residual
        self.pre_norm = cfg.norm == "pre"
        self.branch_norm = nn.LayerNorm(d, eps=cfg.norm_eps) if layer.branch_norm else None
        self.weights = weights
        self.reset_parameters()

    def reset_parameters(self, scheme: str = "xavier") -> None:
        """Attention as ParallelAttention; each FFN_i like a standalone FFN of width d_h (its own fans)."""
        self.attention.reset_parameters(scheme)
        with torch.no_grad():
            for w, fan_in in ((self.w1, self.d_model), (self.w2, self.hidden)):
                for block in w:  # [d, d_h] / [d_h, d]; xavier is symmetric in the fans
                    if scheme == "xavier":
                        init_weight(block, scheme)
                    else:  # torch Linear default bound, with the fan-in of x @ block
                        uniform_fan_in(block, fan_in)
            init_bias(self.b1, scheme, self.d_model)
            init_bias(self.b2, scheme, self.hidden)
        if self.branch_norm is not None:
            self.branch_norm.reset_parameters()
        self.weights.reset_parameters()

    def output_projections(self) -> Tensor:
        """W^{O_i} stacked: [M, d_v, d] (a view of the attention's W_O, row block i = branch i)."""
        attn = self.attention
        return attn.out_proj.weight.t().reshape(self.branches, attn.head_dim, self.d_model)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: StateView | None = None,
    ) -> Tensor:
        """Queries x [B, L, d] over x (self) or memory [B, S, d] (cross) -> o [B, L, d] (eq. 7)."""
        M = self.branches
        heads = branch_heads(self.attention, x, memory, key_padding_mask, causal, cache)  # [B, M, L, d_v]
        kappa, alpha = self.weights()  # [M], [M]
        w_o = self.output_projections() * kappa[:, None, None]  # [M, d_v, d]: kappa_i W^{O_i}
        b = torch.einsum("bmlv,mvd->bmld", heads, w_o) + self.attention.out_bias[0]  # [B, M, L, d] eq. 6
        f_in = self.branch_norm(b) if (self.branch_norm is not None and self.pre_norm) else b
        w1, w2 = self.w1.expand(M, -1, -1), self.w2.expand(M, -1, -1)  # "shared": one FFN for all branches
        h = self.activation(torch.einsum("bmld,mdh->bmlh", f_in, w1) + self.b1[None, :, None, :])  # [B, M, L, d_h]
        if self.activation_dropout > 0:
            h = dropout(h, self.activation_dropout, self.training)
        r = torch.einsum("bmlh,mhd->bmld", h, w2) + self.b2  # c_i: [B, M, L, d]
        if self.branch_residual:
            r = r + b
        if self.branch_norm is not None and not self.pre_norm:
            r = self.branch_norm(r)
        return torch.einsum("bmld,m->bld", r, alpha)  # [B, L, d]

    def extra_repr(self) -> str:
        return (f"branches={self.branches}, ffn_hidden={self.hidden} x {self.w1.shape[0]}, "
                f"branch_residual={self.branch_residual}")


class WeightedEncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: WeightedLayerConfig):
        super().__init__()
        self.branched = layer.branched(cfg, "encoder_self", "encoder")
        self.branched_residual = Residual(cfg.d_model, cfg.norm, cfg.dropout, cfg.norm_eps)

    def forward(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        """x [B, S, d], padding_mask [B, S] (True at padding) -> [B, S, d]."""
        return self.branched_residual(x, lambda h: self.branched(h, key_padding_mask=padding_mask))


class WeightedDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: WeightedLayerConfig):
        super().__init__()
        self.layout = layer.decoder_branched
        if self.layout == "cross":  # masked MHA, then branched attention over the encoder output
            self.self_attn = build_attention(cfg, "decoder_self")
            self.self_attn_residual = Residual(cfg.d_model, cfg.norm, cfg.dropout, cfg.norm_eps)
            self.branched = layer.branched(cfg, "cross", "decoder")
            self.branched_residual = Residual(cfg.d_model, cfg.norm, cfg.dropout, cfg.norm_eps)
        else:  # masked branched self-attention, then a standard cross-attention (no further FFN)
            self.branched = layer.branched(cfg, "decoder_self", "decoder")
            self.branched_residual = Residual(cfg.d_model, cfg.norm, cfg.dropout, cfg.norm_eps)
            self.cross_attn = build_attention(cfg, "cross")
            self.cross_attn_residual = Residual(cfg.d_model, cfg.norm, cfg.dropout, cfg.norm_eps)

    def forward(
        self, y: Tensor, memory: Tensor, memory_padding_mask: Tensor | None, cache: StateView | None = None
    ) -> Tensor:
        """y [B, T, d] (T = 1 step when incremental), memory [B, S, d] -> [B, T, d]."""
        self_cache = cache.view("self_attn") if cache is not None else None
        cross_cache = cache.view("cross_attn") if cache is not None else None
        if self.layout == "cross":
            y = self.self_attn_residual(y, lambda h: self.self_attn(h, causal=True, cache=self_cache))
            return self.branched_residual(
                y, lambda h: self.branched(h, memory, key_padding_mask=memory_padding_mask, cache=cross_cache)
            )
        y = self.branched_residual(y, lambda h: self.branched(h, causal=True, cache=self_cache))
        return self.cross_attn_residual(
            y, lambda h: self.cross_attn(h, memory, key_padding_mask=memory_padding_mask, cache=cross_cache)
        )
