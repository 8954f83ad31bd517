"""Layer kind 'mute': the Multi-Unit Transformer encoder layer (Yan et al., 2020; docs/papers.md#mute).

Pre-norm, I units, each with its own self-attention SA_i and FFN_i (with its own inner LN_f^i):

    n    = LN_a(x)                                   one shared LayerNorm
    n_i  = Bias_i(n) with probability p_beta, else n (training only; §3.2, eq. 11)
    s_i  = x + Drop(SA_i(n_i))                       eq. 8 - the residual uses the clean x
    F_i  = s_i + Drop(FFN_i(s_i))                    eq. 9, FFN_i = W_2 Drop(ReLU(W_1 LN_f^i(s_i)))
    out  = sum_i w_i F_i                             fusion "weighted" (eq. 10/12), w init 1/I, free
         = sum_j w_j Ĝ_j / j                         fusion "sequential" (eq. 13-16, AutoShuffle)

Units are batched on a leading unit axis: weights are stacked [U, ...] and every projection is one
GEMM (a shared input meets all units' weights at once, noised inputs one bmm over units). For the
core `attend` the unit axis is folded into the head axis ([B, U*H, S, d_k]), so Shaw relative
positions and DropHead (one draw per sample and unit, rescaled within the unit) work as everywhere.
MUTE is encoder-only; the decoder is the standard pre-norm transformer layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multibranch.config import ConfigError
from multibranch.models.config import LayerConfig, ModelConfig
from multibranch.modules.attention import HeadGated, attend
from multibranch.modules.autoshuffle import AutoShuffle, PenaltyReduction
from multibranch.modules.bias_noise import BiasKind, BiasNoise, SwitchRateConfig
from multibranch.modules.dropout import dropout
from multibranch.modules.feedforward import ACTIVATIONS
from multibranch.modules.init import init_bias, init_weight
from multibranch.modules.positions import RelativePositions
from multibranch.modules.structured_dropout import DropHead


@LayerConfig.register("mute")
@dataclass
class MuteLayerConfig(LayerConfig):
    """MUTE encoder layer (docs/papers.md#mute); pair it with a `transformer` decoder and model.norm=pre.

    units: I. bias_modules: each unit's bias module in unit order (None: all identity = plain MUTE;
      the paper's biased model: [identity, swap, mask, disorder]).
    bias_switch: p_beta, the probability of enabling the bias modules (one coin per layer and
      forward); a rate schedule, 1.0 = always noise.
    swap_range / disorder_window / mask_mode / mask_prob: §3.2, docs/papers.md#mute-mask ("bernoulli" 0.1 = reference,
      "one" = one token per sentence, the paper's text).
    fusion: "weighted" (sum_i w_i F_i) or "sequential" (AutoShuffle + cumulative mean, §3.3).
    autoshuffle_penalty: lambda; penalty_reduction: "mean" (lambda relative to the mean token loss)
      or "per_token_sum" (the reference's formula, lambda = 1.0 there).
    shared_attention / shared_ffn: the §5.6 (Table 6) ablations "1 Self + I FFN" / "I Self + 1 FFN".
    """

    kind: str = "mute"
    units: int = 4
    bias_modules: list[BiasKind] | None = None
    bias_switch: SwitchRateConfig = field(default_factory=lambda: SwitchRateConfig(rate=0.85))
    swap_range: int = 3
    disorder_window: int = 3
    mask_mode: Literal["bernoulli", "one"] = "bernoulli"
    mask_prob: float = 0.1
    fusion: Literal["weighted", "sequential"] = "weighted"
    autoshuffle_penalty: float = 2.5e-4
    penalty_reduction: PenaltyReduction = "mean"
    shared_attention: bool = False
    shared_ffn: bool = False

    def validate(self) -> None:
        if self.units < 1:
            raise ConfigError(f"units={self.units} must be >= 1")
        if self.bias_modules is not None and len(self.bias_modules) != self.units:
            raise ConfigError(f"bias_modules has {len(self.bias_modules)} entries for units={self.units}")
        if self.swap_range < 1 or self.disorder_window < 2:
            raise ConfigError("swap_range must be >= 1 and disorder_window >= 2")
        if not 0.0 <= self.mask_prob <= 1.0 or self.autoshuffle_penalty < 0:
            raise ConfigError("mask_prob must be in [0, 1] and autoshuffle_penalty >= 0")

    def check(self, model: ModelConfig) -> None:
        if model.decoder is self:
            self.build_decoder_layer(model, 0)
        if model.norm != "pre":
            raise ConfigError("the mute layer is pre-norm, as in MUTE (Yan et al., 2020): set model.norm=pre")

    def build_encoder_layer(self, model: ModelConfig, index: int) -> nn.Module:
        return MuteEncoderLayer(model, self)

    def build_decoder_layer(self, model: ModelConfig, index: int) -> nn.Module:
        raise ConfigError(
            "layer kind 'mute' is encoder-only, as in MUTE (Yan et al., 2020): use decoder: {kind: transformer} "
            "with model.norm=pre"
        )


def unit_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Per-unit affine map: x [Ux, B, S, i], weight [Uw, o, i], bias [Uw, o] -> [U, B, S, o], U = max(Ux, Uw).

    A shared input (Ux = 1) meets every unit's weight in one GEMM; otherwise one bmm over the units.
    """
    Ux, B, S, i = x.shape
    Uw, o, _ = weight.shape
    if Ux == 1:
        y = F.linear(x[0], weight.reshape(Uw * o, i), bias.reshape(Uw * o))  # [B, S, Uw*o]
        return y.view(B, S, Uw, o).permute(2, 0, 1, 3)  # [Uw, B, S, o]
    w, b = weight.expand(Ux, o, i), bias.expand(Ux, o)
    y = torch.baddbmm(b[:, None, :], x.reshape(Ux, B * S, i), w.transpose(1, 2))  # [U, B*S, o]
    return y.view(Ux, B, S, o)


def _init_blocks(weight: Tensor, blocks: int, scheme: str, a: float = math.sqrt(5)) -> None:
    """Glorot (or PyTorch's default) on each unit's each [rows/blocks, cols] block, as separate Linears."""
    for unit in weight:
        for block in unit.chunk(blocks, dim=0):
            init_weight(block, scheme, a)


class UnitSelfAttention(HeadGated):
    """U independent multi-head self-attentions with stacked weights (F.linear layout per unit):
    in_weight [U, 3d, d] = [W_Q; W_K; W_V] (head h = rows h*d_k..), out_weight [U, d, d].
    Head gate: [U*H], unit-major (gate index u*H + h); a shared attention (U = 1) has H gates."""

    def __init__(self, units: int, d_model: int, heads: int, dropout: float = 0.0,
                 drophead: DropHead | None = None, relative: RelativePositions | None = None):
        super().__init__()
        self.units, self.heads, self.head_dim = units, heads, d_model // heads
        self.in_weight = nn.Parameter(torch.empty(units, 3 * d_model, d_model))
        self.in_bias = nn.Parameter(torch.zeros(units, 3 * d_model))
        self.out_weight = nn.Parameter(torch.empty(units, d_model, d_model))
        self.out_bias = nn.Parameter(torch.zeros(units, d_model))
        self.dropout, self.drophead, self.relative = dropout, drophead, relative
        self.init_head_gate(units * heads)
        self.role = "encoder_self"  # MUTE is encoder-only
        self.reset_parameters()

    def reset_parameters(self, scheme: str = "xavier") -> None:
        with torch.no_grad():
            _init_blocks(self.in_weight, 3, scheme)
            _init_blocks(self.out_weight, 1, scheme, a=1.0)
            self.in_bias.zero_()
            self.out_bias.zero_()
        if self.relative is not None:
            self.relative.reset_parameters()

    def forward(self, u: Tensor, padding_mask: Tensor | None, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """u [Ui, B, S, d] -> (SA_i(u_i) [U, B, S, d], probabilities [B, U, H, S, S] if need_weights)."""
        _, B, S, d = u.shape
        H, dk = self.heads, self.head_dim
        qkv = unit_linear(u, self.in_weight, self.in_bias)  # [U, B, S, 3d]
        U = qkv.shape[0]
        qkv = qkv.view(U, B, S, 3, H, dk).permute(3, 1, 0, 4, 2, 5).reshape(3, B, U * H, S, dk)  # [3, B, U*H, S, d_k]
        scale = self.drophead(B * U, u.device) if self.drophead is not None else None  # [B*U, H]
        probe = self.attention_probe
        heads, probs = attend(
            qkv[0], qkv[1], qkv[2], key_padding_mask=padding_mask, dropout_p=self.dropout if self.training else 0.0,
            relative=self.relative, need_weights=need_weights or probe is not None,
        )  # [B, U*H, S, d_k]
        if probe is not None:
            probe(probs)  # [B, U*H, S, S], heads unit-major like the gate
        if scale is not None:  # DropHead per sample and unit, rescaled H/#kept within the unit
            heads = heads * scale.view(B, U * H, 1, 1).to(heads.dtype)
        if self.head_gate is not None:  # [Uw*H] or [B, Uw*H]; a shared attention's gate covers every noised input
            gate = self.head_gate.view(-1, self.gate_heads)  # [1 or B, Uw*H]
            rows = gate.shape[0]
            gate = gate.view(rows, -1, H).expand(rows, U, H).reshape(rows, U * H)  # [1 or B, U*H]
            heads = heads * gate[:, :, None, None].to(heads.dtype)
        heads = heads.view(B, U, H, S, dk).permute(1, 0, 3, 2, 4).reshape(U, B, S, d)  # [U, B, S, H*d_k]
        out = unit_linear(heads, self.out_weight, self.out_bias)  # [U, B, S, d]
        return out, (probs.view(B, U, H, S, S) if need_weights else None)

    def extra_repr(self) -> str:
        return f"units={self.units}, heads={self.heads}, head_dim={self.head_dim}, dropout={self.dropout}"


class UnitFeedForward(nn.Module):
    """U position-wise FFNs, each with its own inner LayerNorm (OpenNMT layout):
    FFN_i(s) = W_2^i Drop(act(W_1^i LN_f^i(s) + b_1^i)) + b_2^i."""

    def __init__(self, units: int, d_model: int, hidden_dim: int, activation: str = "relu",
                 activation_dropout: float = 0.0):
        super().__init__()
        self.units, self.d_model, self.hidden_dim = units, d_model, hidden_dim
        self.activation, self.activation_dropout = ACTIVATIONS[activation], activation_dropout
        self.norm_weight = nn.Parameter(torch.ones(units, d_model))
        self.norm_bias = nn.Parameter(torch.zeros(units, d_model))
        self.fc1_weight = nn.Parameter(torch.empty(units, hidden_dim, d_model))
        self.fc1_bias = nn.Parameter(torch.zeros(units, hidden_dim))
        self.fc2_weight = nn.Parameter(torch.empty(units, d_model, hidden_dim))
        self.fc2_bias = nn.Parameter(torch.zeros(units, d_model))
        self.reset_parameters()

    def reset_parameters(self, scheme: str = "xavier") -> None:
        with torch.no_grad():
            self.norm_weight.fill_(1.0)
            self.norm_bias.zero_()
            for weight, bias in ((self.fc1_weight, self.fc1_bias), (self.fc2_weight, self.fc2_bias)):
                _init_blocks(weight, 1, scheme)
                init_bias(bias, scheme, weight.shape[-1])

    def forward(self, s: Tensor) -> Tensor:
        """s [Us, B, S, d] -> FFN_i(s_i) [U, B, S, d]."""
        h = F.layer_norm(s, (self.d_model,))  # [Us, B, S, d]
        h = h * self.norm_weight[:, None, None] + self.norm_bias[:, None, None]  # LN_f^i affine
        h = self.activation(unit_linear(h, self.fc1_weight, self.fc1_bias))  # [U, B, S, d_h]
        h = dropout(h, self.activation_dropout, self.training)
        return unit_linear(h, self.fc2_weight, self.fc2_bias)  # [U, B, S, d]

    def extra_repr(self) -> str:
        return f"units={self.units}, d_model={self.d_model}, hidden_dim={self.hidden_dim}"


class UnitOutputs(NamedTuple):
    """attention: SA_i(n_i) before the residual [Ua, B, S, d]; units: F_i [I, B, S, d];
    probs: attention probabilities [B, Ua, H, S, S] (only when asked)."""

    attention: Tensor
    units: Tensor
    probs: Tensor | None


class MuteEncoderLayer(nn.Module):
    """One MUTE encoder layer (module docstring): LN_a, optional bias modules, I batched units, fusion."""

    def __init__(self, cfg: ModelConfig, layer: MuteLayerConfig):
        super().__init__()
        units, d = layer.units, cfg.d_model
        self.units = units
        self.dropout = cfg.dropout
        self.norm = nn.LayerNorm(d, eps=cfg.norm_eps)  # LN_a, shared by the units
        kinds = layer.bias_modules or ["identity"] * units
        self.bias = None
        if any(k != "identity" for k in kinds):
            self.bias = BiasNoise(kinds, d, layer.bias_switch, layer.swap_range, layer.disorder_window,
                                  layer.mask_mode, layer.mask_prob)
        drophead = None
        if cfg.drophead.encoder_self and not cfg.drophead.rate.is_zero:
            drophead = DropHead(cfg.heads, cfg.drophead.rate, cfg.drophead.max_redraws)
        relative = None
        if cfg.relative_positions > 0:  # one table per layer, shared by the units [D] (core `attend` takes one)
            relative = RelativePositions(cfg.relative_positions, cfg.head_dim, cfg.share_relative_kv)
        self.self_attn = UnitSelfAttention(1 if layer.shared_attention else units, d, cfg.heads, cfg.attention_dropout,
                                           drophead, relative)
        self.ffn = UnitFeedForward(1 if layer.shared_ffn else units, d, cfg.ffn_dim, cfg.activation,
                                   cfg.activation_dropout)
        self.unit_weights = nn.Parameter(torch.full((units,), 1.0 / units))  # w, unconstrained
        self.autoshuffle = None
        if layer.fusion == "sequential":
            self.autoshuffle = AutoShuffle(units, layer.autoshuffle_penalty, layer.penalty_reduction)

    def reset_parameters(self, scheme: str = "xavier") -> None:
        """Units follow `scheme`; w = 1/I, M^p = |N(0,1)| normalised and e_mask ~ N(0, d^-1/2) always."""
        self.norm.reset_parameters()
        self.self_attn.reset_parameters(scheme)
        self.ffn.reset_parameters(scheme)
        with torch.no_grad():
            self.unit_weights.fill_(1.0 / self.units)
        for module in (self.bias, self.autoshuffle):
            if module is not None:
                module.reset_parameters(scheme)

    def unit_outputs(self, x: Tensor, padding_mask: Tensor | None, need_weights: bool = False) -> UnitOutputs:
        """x [B, S, d] -> every unit's attention output and F_i (before fusion)."""
        n = self.norm(x)  # [B, S, d]
        if self.bias is not None:
            padding = padding_mask if padding_mask is not None else x.new_zeros(x.shape[:2], dtype=torch.bool)
            u = self.bias(n, padding)  # [I or 1, B, S, d]
        else:
            u = n[None]  # [1, B, S, d]: every unit reads n
        a, probs = self.self_attn(u, padding_mask, need_weights)  # [Ua, B, S, d]
        s = x + dropout(a, self.dropout, self.training)  # s_i, residual on the clean x
        f = s + dropout(self.ffn(s), self.dropout, self.training)  # [I or 1, B, S, d]
        return UnitOutputs(a, f.expand(self.units, *f.shape[1:]), probs)

    def fuse(self, units: Tensor) -> Tensor:
        """F_i [I, B, S, d] -> layer output [B, S, d]."""
        if self.autoshuffle is not None:
            return self.autoshuffle(units, self.unit_weights)
        return torch.einsum("i,ibsd->bsd", self.unit_weights.to(units.dtype), units)

    def forward(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        """x [B, S, d], padding_mask [B, S] (True at padding) -> [B, S, d]."""
        return self.fuse(self.unit_outputs(x, padding_mask).units)

    def training_metrics(self) -> dict[str, float]:
        """Unit weights w_i (paper Fig. 3) and, with AutoShuffle, the unweighted penalty P(M^p)."""
        metrics = {f"w{i}": float(v) for i, v in enumerate(self.unit_weights.detach().float().cpu())}
        if self.autoshuffle is not None:
            metrics["perm_penalty"] = float(self.autoshuffle.penalty().detach())
        return metrics

    @torch.no_grad()
    def diversity(self, x: Tensor, padding_mask: Tensor) -> dict[str, float]:
        """Eq. 21 diversity of this layer for input x: att_pos (head-averaged attention distributions),
        att_sub (attention outputs before the residual) and ffn_sub (unit outputs F_i)."""
        out = self.unit_outputs(x, padding_mask, need_weights=True)
        att_pos = out.probs.mean(dim=2).transpose(0, 1)  # [U, B, S, S]
        att = out.attention
        return {
            "att_pos": float(diversity_score(att_pos.expand(self.units, *att_pos.shape[1:]), padding_mask)),
            "att_sub": float(diversity_score(att.expand(self.units, *att.shape[1:]), padding_mask)),
            "ffn_sub": float(diversity_score(out.units, padding_mask)),
        }


def diversity_score(unit_outputs: Tensor, padding_mask: Tensor) -> Tensor:
    """Eq. 21 as in Table 6: exp(-mean cosine similarity) over all I^2 ordered unit pairs (diagonal
    included) and all non-pad positions. unit_outputs [I, B, S, k], padding_mask [B, S] -> scalar.
    Identical units give exp(-1), mutually orthogonal ones exp(-1/I)."""
    o = F.normalize(unit_outputs.float(), dim=-1)  # [I, B, S, k]
    cosine = torch.einsum("ibsk,jbsk->bsij", o, o)  # [B, S, I, I]
    per_position = cosine.mean(dim=(-1, -2))  # [B, S]
    return torch.exp(-per_position[~padding_mask].mean())


@torch.no_grad()
def encoder_diversity(model: nn.Module, src: Tensor) -> list[dict[str, float]]:
    """Per MUTE encoder layer of a Seq2SeqModel in eval mode: its diversity scores for the batch src [B, S]."""
    if model.training:
        raise RuntimeError("encoder_diversity runs in eval mode: call model.eval() first")
    encoder = model.encoder
    padding_mask = src.eq(encoder.pad_id)  # [B, S]
    x, scores = encoder.embed(src), []
    for layer in encoder.layers:
        if isinstance(layer, MuteEncoderLayer):
            scores.append(layer.diversity(x, padding_mask))
        x = layer(x, padding_mask)
    return scores
