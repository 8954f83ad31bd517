"""What makes `ParallelAttention` fast at decoding on a CPU, kept apart from the paper's attention.

A decoding copy of a model (`inference/precision.py`) packs each attention's projections for oneDNN
(`pack_linears`: the Q|K|V, Q and K|V projections its role uses, and the output projection with the branch merge
folded in) and switches on the fused kernels (`fused = True`): a decoding step with one new query per row then
attends over the self-attention's history of keys and values kept per step in the decoder state, never copied, or
over the cross-attention memory's keys and values projected once, in C++ (`modules/fused_attention.py`). In
training, and wherever a step cannot use them, the attention computes as written in `attention.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from multibranch import cpu_kernels
from multibranch.modules import fused_attention
from multibranch.modules.packed_linear import PackedLinear, PackKind, pack_linear
from multibranch.modules.state import StateView

if TYPE_CHECKING:
    from torch import nn


class DecodingAcceleration:
    """Packed projections and fused decoding steps for `ParallelAttention` (a mixin: it reads the attention's
    projections, sizes and role, and calls its `project_*` methods)."""

    if TYPE_CHECKING:  # what the attention provides
        in_proj: nn.Linear
        out_proj: nn.Linear
        out_bias: nn.Parameter
        inner_dim: int
        total_heads: int
        head_dim: int
        branches: int
        merge_scale: float
        role: str | None
        relative: Any
        attention_probe: Any
        training: bool

        def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...
        def project_q(self, x: Tensor) -> Tensor: ...
        def _kv_rows(self, memory: Tensor) -> Tensor: ...

    # ---- packed decoding projections (modules/packed_linear.py) ----------------------------------

    packed: dict[str, PackedLinear] | None = None  # set by pack_linears on a decoding copy

    def pack_linears(self, kind: PackKind) -> None:
        """Packed versions of the eval projections this attention's role uses (self-attention: Q|K|V; cross:
        Q and K|V; without a role: all three) and of the output projection with the branch merge folded in,
        used in eval mode instead of the weights. A projection left unpacked falls back to F.linear."""
        w, b, inner, c = self.in_proj.weight, self.in_proj.bias, self.inner_dim, self.merge_scale
        if self.role == "cross":
            inputs: tuple[str, ...] = ("q", "kv")
        elif self.role is not None:
            inputs = ("qkv",)
        else:
            inputs = ("qkv", "q", "kv")
        with torch.no_grad():
            out_bias = self.out_bias.sum(0) if self.branches > 1 else self.out_bias[0]  # [d]
            weights = {"qkv": (w, b), "q": (w[:inner], b[:inner]), "kv": (w[inner:], b[inner:])}
            self.packed = {name: pack_linear(*weights[name], kind) for name in inputs}
            self.packed["out"] = pack_linear(self.out_proj.weight * c, out_bias * c, kind)

    # ---- fused decoding steps (modules/fused_attention.py) ---------------------------------------------

    fused = False  # set on decoding copies (inference/precision.py): attend with the fused kernels where it can

    def _fuses_step(self, x: Tensor, cache: StateView | None, self_padding_mask: Tensor | None,
                    need_weights: bool) -> bool:
        """Whether this call is a decoding step the fused kernels can take: one new query per row in eval mode
        on a decoding copy, no relative positions, no attention weights wanted, no padding among a
        self-attention's keys, fp32 on the CPU."""
        return (self.fused and not self.training and cache is not None and not cache.fixed and x.shape[1] == 1
                and self.relative is None
                and self_padding_mask is None and not need_weights and self.attention_probe is None
                and cpu_kernels.usable(x))

    def _fused_self_attention(self, q: Tensor, k: Tensor, v: Tensor, cache: StateView) -> Tensor:
        """q, k, v [B, H, 1, d_k] of this step -> heads [B, H, 1, d_k]: the query over its own history of
        keys/values, kept per step in the state (`DecoderState.extend_history`), never copied."""
        B = q.shape[0]
        keys, values, ancestors = cache.extend_history("kv", k.reshape(B, -1), v.reshape(B, -1))  # rows [B, H*d_k]
        heads = fused_attention.history_attention(q.reshape(B, -1), keys, values, ancestors, self.total_heads)
        return heads.view(B, 1, self.total_heads, self.head_dim).transpose(1, 2)

    def _fused_cross_attention(self, x: Tensor, memory: Tensor, key_padding_mask: Tensor | None,
                               cache: StateView) -> Tensor:
        """x [B, 1, d] over memory [B / g, S, d] -> heads [B, H, 1, d_k]; the memory's keys/values are projected
        once and cached as rows [B / g, S, H*d_k] (views of the fused K|V projection)."""
        B = x.shape[0]
        k, v = cache.get("k_rows"), cache.get("v_rows")
        if k is None:
            b, S, _ = memory.shape
            kv = self._kv_rows(memory).view(b, S, 2, self.inner_dim)  # [b, S, 2, H*d_k]
            k, v = kv[:, :, 0], kv[:, :, 1]
            cache.set("k_rows", k, static=True)
            cache.set("v_rows", v, static=True)
        q = self.project_q(x).transpose(1, 2).reshape(B, -1)  # [B, H*d_k]
        heads = fused_attention.memory_attention(q, k, v, key_padding_mask, self.total_heads)
        return heads.view(B, 1, self.total_heads, self.head_dim).transpose(1, 2)

    def _packed(self, name: str) -> PackedLinear | None:
        return self.packed.get(name) if self.packed is not None and not self.training else None

    def fused_step(self, x: Tensor, memory: Tensor | None, key_padding_mask: Tensor | None,
                   cache: StateView | None, need_weights: bool,
                   qkv: tuple[Tensor, Tensor, Tensor] | None) -> Tensor | None:
        """The heads [B, H, 1, d_k] of a decoding step the fused kernels take (`attend_heads`' arguments), or None
        when this call is not one; RuntimeError for a state whose history was kept for them but a call that
        cannot use them."""
        fuses = self._fuses_step(x, cache, key_padding_mask if memory is None else None, need_weights)
        if memory is None and cache is not None and cache.has_history("kv") and not fuses:
            raise RuntimeError("this decoder state's self-attention history is kept for the fused kernels, but this "
                               "call cannot use them (several queries, attention weights or a probe asked for)")
        if not fuses:
            return None
        assert cache is not None
        if memory is None:
            q, k, v = qkv if qkv is not None else self.project_qkv(x)  # [B, H, 1, d_k] each
            return self._fused_self_attention(q, k, v, cache)
        return self._fused_cross_attention(x, memory, key_padding_mask, cache)
