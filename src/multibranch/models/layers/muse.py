"""Layer kind 'muse': MUSE and MUSE-simple, parallel multi-scale attention (Zhao et al., 2019;
docs/papers.md#muse).

Every branch reads the same layer input; one residual and one LayerNorm per layer (post-norm):

    encoder:  X_l = LN(X + Drop(SelfAttn(X) [+ Conv(X)]) + Drop(FFN(X)))
    decoder:  Y_l = LN(Y + Drop(SelfAttn(Y) [+ CausalConv(Y)]) + Drop(CrossAttn(Y, Z)) + Drop(FFN(Y)))

(pre-norm: X + sum of Drop(branch(LN X)), with the stack's final LN.) MUSE-simple has no conv
(`conv: false`). Attention and convolution share the value projection and one output projection,
    SelfAttn(X) + Conv(X) = [A ; C] W_out + b,   A = heads(Q, K, V),  C = DynConv(V)   (docs/papers.md#muse-shared-projection),
stored as the attention's own W_O, b_O plus a bias-free `conv_out` (the two column blocks of W_out).
Like the reference, attention and conv pass through one residual dropout (they are one output).
Input dropout acts on the self-attention/conv input only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from multibranch.config import ConfigError
from multibranch.models.config import LayerConfig, ModelConfig
from multibranch.models.layers.common import build_attention
from multibranch.modules.attention import ParallelAttention
from multibranch.modules.dropout import dropout
from multibranch.modules.dynconv import DynamicConv, check_kernel_sizes
from multibranch.modules.feedforward import FeedForward
from multibranch.modules.init import init_weight
from multibranch.modules.state import StateView


@LayerConfig.register("muse")
@dataclass
class MuseLayerConfig(LayerConfig):
    """MUSE / MUSE-simple layer.

    conv: add the dynamic-convolution branch (false = MUSE-simple).
    kernel_sizes: odd kernel sizes of every layer's convolution (default {3, 15}, gated).
    layer_kernel_sizes: per-layer kernel lists (one entry per layer of this stack), overriding
      `kernel_sizes`, e.g. [[3], [3], [7], [7], [15], [15]] ("grow kernels among layers").
    kernel_mix: "gate" (softmax(g)-weighted sum, the reported MUSE) or "concat" (no gate: every
      kernel's output gets its own block of W_out).
    conv_projection: "shared" (conv input = the attention's V) or "separate" (own d x d projection,
      the ablation).
    conv_weight_dropout: DropConnect rate on the normalised kernels (reference: 0.1, hard-coded).
    conv_mask_padding: zero V at padded source positions before the encoder conv (false = the
      reference's default, where padding leaks into real positions).
    conv_band_max_len: band-matrix conv up to this length, unfold beyond (0 = always unfold).
    conv_kernel_init: "xavier" (spec) or "torch" (what the reference's reset_parameters leaves).
    input_dropout: dropout on the self-attention/conv input (0 IWSLT, 0.1 WMT).
    """

    kind: str = "muse"
    conv: bool = True
    kernel_sizes: list[int] = field(default_factory=lambda: [3, 15])
    layer_kernel_sizes: list[list[int]] | None = None
    kernel_mix: Literal["gate", "concat"] = "gate"
    conv_projection: Literal["shared", "separate"] = "shared"
    conv_weight_dropout: float = 0.1
    conv_mask_padding: bool = True
    conv_band_max_len: int = 512
    conv_kernel_init: Literal["xavier", "torch"] = "xavier"
    input_dropout: float = 0.0

    def validate(self) -> None:
        try:
            check_kernel_sizes(self.kernel_sizes)
            for i, sizes in enumerate(self.layer_kernel_sizes or []):
                check_kernel_sizes(sizes, f"layer_kernel_sizes[{i}]")
        except ValueError as err:
            raise ConfigError(str(err)) from None
        for name in ("conv_weight_dropout", "input_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name}={getattr(self, name)} must be in [0, 1)")

    def check(self, model: ModelConfig) -> None:
        if self.layer_kernel_sizes is None:
            return
        for stack, layers in (("encoder", model.encoder_layers), ("decoder", model.decoder_layers)):
            if getattr(model, stack) is self and len(self.layer_kernel_sizes) != layers:
                raise ConfigError(
                    f"{stack}.layer_kernel_sizes has {len(self.layer_kernel_sizes)} entries for {layers} layers"
                )

    def kernels(self, index: int) -> list[int]:
        return list(self.layer_kernel_sizes[index]) if self.layer_kernel_sizes is not None else list(self.kernel_sizes)

    def self_attention(self, cfg: ModelConfig, index: int, decoder: bool) -> MultiScaleSelfAttention:
        attn = build_attention(cfg, "decoder_self" if decoder else "encoder_self")
        conv = None
        if self.conv:
            conv = DynamicConv(
                cfg.d_model, cfg.heads, self.kernels(index), causal=decoder,
                weight_dropout=self.conv_weight_dropout, kernel_mix=self.kernel_mix,
                mask_padding=self.conv_mask_padding, band_max_len=self.conv_band_max_len,
                kernel_init=self.conv_kernel_init,
            )
        return MultiScaleSelfAttention(attn, conv, separate_projection=self.conv_projection == "separate")

    def build_encoder_layer(self, model: ModelConfig, index: int) -> nn.Module:
        return MuseEncoderLayer(model, self, index)

    def build_decoder_layer(self, model: ModelConfig, index: int) -> nn.Module:
        return MuseDecoderLayer(model, self, index)


class MultiScaleSelfAttention(nn.Module):
    """Self-attention and dynamic convolutions over one value projection: [A ; C] W_out + b.

    Without `conv` this is exactly the wrapped ParallelAttention (MUSE-simple). The attention is the
    core's (DropHead, relative positions and the k/v cache layout come from it); only V is shared.
    """

    def __init__(self, attn: ParallelAttention, conv: DynamicConv | None, separate_projection: bool = False):
        super().__init__()
        if attn.branches != 1 and conv is not None:
            raise ValueError("the MUSE convolution shares V with a single-branch attention")
        self.attn = attn
        self.conv = conv
        d = attn.d_model
        self.conv_in = nn.Linear(d, d) if conv is not None and separate_projection else None
        self.conv_out = nn.Linear(conv.outputs * d, d, bias=False) if conv is not None else None
        self.reset_parameters()

    def reset_parameters(self, scheme: str = "xavier") -> None:
        """Attention as the core does it; W_out = [W_O ; conv_out] initialised as ONE matrix of fan-in
        (n+1)d, as the reference's widened out_proj (kaiming a=1 under "torch", Xavier otherwise)."""
        self.attn.reset_parameters(scheme)
        if self.conv is None:
            return
        self.conv.reset_parameters()
        with torch.no_grad():
            if self.conv_in is not None:  # like the attention's V projection
                init_weight(self.conv_in.weight, scheme)
                self.conv_in.bias.zero_()
            w_attn, w_conv = self.attn.out_proj.weight, self.conv_out.weight
            joint = torch.empty(w_attn.shape[0], w_attn.shape[1] + w_conv.shape[1])  # [d, (n+1)d]
            init_weight(joint, scheme, a=1.0)
            w_attn.copy_(joint[:, : w_attn.shape[1]])
            w_conv.copy_(joint[:, w_attn.shape[1] :])

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: StateView | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor | None]:
        """x [B, L, d] -> [B, L, d] (and attention weights if asked). `cache` (decoder steps) holds
        the attention's keys/values under "attn" and the conv's rolling window under "conv"."""
        attn_cache = cache.view("attn") if cache is not None else None
        if self.conv is None:
            return self.attn(x, key_padding_mask=key_padding_mask, causal=causal, cache=attn_cache,
                             need_weights=need_weights)
        attn = self.attn
        B, L, _ = x.shape
        q, k, v = attn.project_qkv(x)  # [B, H, L, d_k] each
        values = v.transpose(1, 2).reshape(B, L, attn.inner_dim)  # V with heads concatenated [B, L, d]
        conv_in = self.conv_in(x) if self.conv_in is not None else values
        conv_cache = cache.view("conv") if cache is not None else None
        conv = self.conv(conv_in, padding_mask=key_padding_mask, cache=conv_cache)  # [B, L, n*d]

        head_scale, branch_scale = attn.head_scales(B, x.device)  # DropHead on the attention heads
        heads, weights = attn.attend_heads(x, None, key_padding_mask, causal, attn_cache, need_weights, qkv=(q, k, v))
        heads = heads.transpose(1, 2).reshape(B, L, attn.inner_dim)  # A [B, L, d]
        out = attn.merge_heads(heads, head_scale, branch_scale) + self.conv_out(conv)  # [A ; C] W_out + b
        return (out, weights) if need_weights else out


class _MuseLayer(nn.Module):
    """The parallel block: branches over one input, summed into one residual with one LayerNorm."""

    def __init__(self, cfg: ModelConfig, layer: MuseLayerConfig, index: int, decoder: bool):
        super().__init__()
        self.self_attn = layer.self_attention(cfg, index, decoder)
        self.cross_attn = build_attention(cfg, "cross") if decoder else None
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation, cfg.activation_dropout)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.pre_norm = cfg.norm == "pre"
        self.dropout = cfg.dropout
        self.input_dropout = layer.input_dropout

    def _drop(self, branch: Tensor) -> Tensor:
        return dropout(branch, self.dropout, self.training)

    def _block(
        self,
        x: Tensor,
        padding_mask: Tensor | None,
        memory: Tensor | None = None,
        memory_padding_mask: Tensor | None = None,
        cache: StateView | None = None,
    ) -> Tensor:
        """x [B, L, d] -> [B, L, d]: norm(x + sum_i Drop(branch_i(h))), h = x (post) or LN(x) (pre)."""
        h = self.norm(x) if self.pre_norm else x
        attn_in = dropout(h, self.input_dropout, self.training) if self.input_dropout > 0 else h
        decoder = self.cross_attn is not None
        self_cache = cache.view("self_attn") if cache is not None else None
        out = x + self._drop(self.self_attn(attn_in, key_padding_mask=padding_mask, causal=decoder, cache=self_cache))
        if decoder:
            cross_cache = cache.view("cross_attn") if cache is not None else None
            cross = self.cross_attn(h, memory, key_padding_mask=memory_padding_mask, cache=cross_cache)
            out = out + self._drop(cross)
        out = out + self._drop(self.ffn(h))
        return out if self.pre_norm else self.norm(out)


class MuseEncoderLayer(_MuseLayer):
    def __init__(self, cfg: ModelConfig, layer: MuseLayerConfig, index: int):
        super().__init__(cfg, layer, index, decoder=False)

    def forward(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        """x [B, S, d], padding_mask [B, S] (True at padding) -> [B, S, d]."""
        return self._block(x, padding_mask)


class MuseDecoderLayer(_MuseLayer):
    def __init__(self, cfg: ModelConfig, layer: MuseLayerConfig, index: int):
        super().__init__(cfg, layer, index, decoder=True)

    def forward(
        self, y: Tensor, memory: Tensor, memory_padding_mask: Tensor | None, cache: StateView | None = None
    ) -> Tensor:
        """y [B, T, d] (the new positions when incremental), memory [B, S, d] -> [B, T, d]."""
        return self._block(y, None, memory, memory_padding_mask, cache)
