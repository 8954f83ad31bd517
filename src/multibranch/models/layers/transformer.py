"""Standard Transformer layer and MAT (Multi-branch Attentive Transformer, seed 000).

MAT is the standard layer with N_a attention branches (and optionally N_f FFN branches), averaged,
with drop-branch (MAT eq. 4-8, docs/papers.md#mat). With attention_branches = ffn_branches = 1 and drop_branch = 0 it
*is* the standard Transformer layer (same parameters, same computation).

Encoder layer:  x -> Residual(self-attention) -> Residual(FFN)
Decoder layer:  y -> Residual(masked self-attention) -> Residual(cross-attention) -> Residual(FFN)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor, nn

from multibranch.config import ConfigError
from multibranch.models.config import LayerConfig, ModelConfig
from multibranch.models.layers.common import AttentionRole, Residual, build_attention
from multibranch.modules.attention import ParallelAttention
from multibranch.modules.feedforward import FeedForward
from multibranch.modules.state import StateView
from multibranch.modules.structured_dropout import PathDropout
from multibranch.schedules import RateConfig


@LayerConfig.register("transformer")
@dataclass
class TransformerLayerConfig(LayerConfig):
    """Standard / MAT layer.

    attention_branches: N_a (1 = standard multi-head attention).
    ffn_branches: N_f parallel FFNs of width model.ffn_dim each (MAT §7.1).
    drop_branch: rho for attention branches; ffn_drop_branch defaults to the same rate (eq. 7).
    drop_branch_granularity: "batch" (one mask per call, the released code) or "sample".
    branch_merge: "mean" (1/N, the paper) or "mean_sq" (1/N^2, the released code),
      docs/papers.md#mat-merge-constant.
    head_drop: MAT §7.2 variant (docs/papers.md#mat-head-drop-variant) - drop individual heads of every
      branch with rate rho instead of branches.
    heads / head_dim: per-branch head count and head width (default model.heads, d_model / heads);
      a folded MAT (docs/papers.md#mat-folding) is one branch of N_a*M heads of width d/M.
    layer_heads: head counts after physical pruning (`multibranch prune`), one list per layer of this
      stack with one count per attention in layer order (encoder: [self]; decoder: [self, cross]);
      overrides `heads`, keeps the head width; needs attention_branches = 1.
    """

    kind: str = "transformer"
    attention_branches: int = 1
    ffn_branches: int = 1
    drop_branch: RateConfig = field(default_factory=RateConfig)
    ffn_drop_branch: RateConfig | None = None
    drop_branch_granularity: Literal["batch", "sample"] = "batch"
    branch_merge: Literal["mean", "mean_sq"] = "mean"
    head_drop: bool = False
    heads: int | None = None
    head_dim: int | None = None
    layer_heads: list[list[int]] | None = None

    def validate(self) -> None:
        if self.attention_branches < 1 or self.ffn_branches < 1:
            raise ConfigError("attention_branches and ffn_branches must be >= 1")
        if self.layer_heads is not None:
            if self.attention_branches != 1:
                raise ConfigError("layer_heads (a pruned model) needs attention_branches = 1")
            if any(count < 1 for counts in self.layer_heads for count in counts):
                raise ConfigError(f"layer_heads={self.layer_heads}: every attention keeps at least one head")

    def check(self, model: ModelConfig) -> None:
        if self.layer_heads is None:
            return
        for stack, layers, per_layer in (("encoder", model.encoder_layers, 1), ("decoder", model.decoder_layers, 2)):
            if getattr(model, stack) is not self:
                continue
            if len(self.layer_heads) != layers or any(len(counts) != per_layer for counts in self.layer_heads):
                raise ConfigError(f"{stack}.layer_heads={self.layer_heads} needs {layers} lists of {per_layer} "
                                  f"head count(s) ({'[self]' if per_layer == 1 else '[self, cross]'} per layer)")

    def attention(self, cfg: ModelConfig, role: AttentionRole, index: int = 0) -> ParallelAttention:
        heads = self.heads or cfg.heads
        head_dim = self.head_dim
        if self.layer_heads is not None:
            head_dim = head_dim or cfg.d_model // heads  # pruning keeps the head width
            heads = self.layer_heads[index][1 if role == "cross" else 0]
        return build_attention(
            cfg, role, self.attention_branches, heads=heads, head_dim=head_dim, merge=self.branch_merge,
            drop_branch=self.attention_dropout(heads), head_drop=self.head_drop,
        )

    def attention_dropout(self, heads: int) -> PathDropout | None:
        if self.drop_branch.is_zero:
            return None
        paths = self.attention_branches * heads if self.head_drop else self.attention_branches
        return PathDropout(paths, self.drop_branch, self.drop_branch_granularity == "sample")

    def ffn(self, cfg: ModelConfig) -> FeedForward:
        rate = self.drop_branch if self.ffn_drop_branch is None else self.ffn_drop_branch
        drop = None if rate.is_zero else PathDropout(self.ffn_branches, rate, self.drop_branch_granularity == "sample")
        return FeedForward(
            cfg.d_model,
            cfg.ffn_dim,
            cfg.activation,
            cfg.activation_dropout,
            branches=self.ffn_branches,
            merge=self.branch_merge,
            drop_branch=drop,
        )

    def build_encoder_layer(self, model: ModelConfig, index: int) -> nn.Module:
        return TransformerEncoderLayer(model, self, index)

    def build_decoder_layer(self, model: ModelConfig, index: int) -> nn.Module:
        return TransformerDecoderLayer(model, self, index)


class TransformerEncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: TransformerLayerConfig, index: int = 0):
        super().__init__()
        self.self_attn = layer.attention(cfg, "encoder_self", index)
        self.self_attn_residual = Residual(cfg.d_model, cfg.norm, cfg.dropout, cfg.norm_eps)
        self.ffn = layer.ffn(cfg)
        self.ffn_residual = Residual(cfg.d_model, cfg.norm, cfg.dropout, cfg.norm_eps)

    def forward(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        """x [B, S, d], padding_mask [B, S] (True at padding) -> [B, S, d]."""
        x = self.self_attn_residual(x, lambda h: self.self_attn(h, key_padding_mask=padding_mask))
        return self.ffn_residual(x, self.ffn)


class TransformerDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: TransformerLayerConfig, index: int = 0):
        super().__init__()
        self.self_attn = layer.attention(cfg, "decoder_self", index)
        self.self_attn_residual = Residual(cfg.d_model, cfg.norm, cfg.dropout, cfg.norm_eps)
        self.cross_attn = layer.attention(cfg, "cross", index)
        self.cross_attn_residual = Residual(cfg.d_model, cfg.norm, cfg.dropout, cfg.norm_eps)
        self.ffn = layer.ffn(cfg)
        self.ffn_residual = Residual(cfg.d_model, cfg.norm, cfg.dropout, cfg.norm_eps)

    def forward(
        self, y: Tensor, memory: Tensor, memory_padding_mask: Tensor | None, cache: StateView | None = None
    ) -> Tensor:
        """y [B, T, d] (T = 1 step when incremental), memory [B, S, d] -> [B, T, d]."""
        self_cache = cache.view("self_attn") if cache is not None else None
        cross_cache = cache.view("cross_attn") if cache is not None else None
        y = self.self_attn_residual(y, lambda h: self.self_attn(h, causal=True, cache=self_cache))
        y = self.cross_attn_residual(
            y, lambda h: self.cross_attn(h, memory, key_padding_mask=memory_padding_mask, cache=cross_cache)
        )
        return self.ffn_residual(y, self.ffn)
