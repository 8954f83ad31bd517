"""Parallel (multi-branch) multi-head attention, fused into one N_a*M-head attention.

MAT (eq. 4 and 6; docs/papers.md#mat-folding) averages N_a independent multi-head attentions. Each branch i has its own
W_Q^i, W_K^i, W_V^i, W_O^i, b_O^i. Stacking the branches' projections gives one projection with
N_a*M heads; the branch average becomes part of the output projection:

    out = c * sum_i s_i * (concat_j head_ij) W_O^i  +  c * sum_i s_i * b_O^i

with merge constant c = 1/N_a ("mean", the paper) or 1/N_a^2 ("mean_sq", the released code) and
s_i the drop-branch scale (1 in eval). Standard multi-head attention is N_a = 1 (c = 1, s = 1).

Parameter layout (branch-major heads):
    in_proj.weight  [3 * N_a*M*d_k, d]   rows: Q heads | K heads | V heads, head h = branch h // M
    in_proj.bias    [3 * N_a*M*d_k]
    out_proj.weight [d, N_a*M*d_k]       = [W_O^1 ... W_O^{N_a}] (F.linear layout)
    out_bias        [N_a, d]             one output bias per branch

Structured dropout (drop-branch, the MAT head-drop variant, DropHead) arrives as multiplicative
scales on the head axis; per-batch scales are folded into the output weight (cheap), per-sample
scales multiply the head outputs.

Decoding on a CPU is faster with two things this module does not need to know about, which
`attention_decoding.DecodingAcceleration` adds to it: projections prepacked for oneDNN (int8, bf16 or fp32), and
the C++ kernels of one decoding step (the query over its history, the query over the cached memory).

Head gate (analysis, docs/papers.md#drophead-head-gates): every attention module of every layer kind is a `HeadGated`
module. Its `head_gate` is None by default (the forward is untouched); set to a tensor [H] it scales
head h's output before W_O (so before the output bias): 0/1 masks heads, a leaf tensor with
requires_grad gives the importance |dL/d gate_h|. A gate [B, H] scales each example's heads by its own
row (per-example importance: row b's gradient is example b's). It is a non-persistent buffer: never in the
state dict, moved with the module. Likewise `attention_probe` (None by default) is called with the
attention probabilities [B, H, L, S] of every forward (attention entropy, attention maps).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multibranch.modules.attention_decoding import DecodingAcceleration
from multibranch.modules.dropout import dropout
from multibranch.modules.init import init_blocks, init_weight
from multibranch.modules.merge import branch_bias, merge_constant
from multibranch.modules.positions import RelativePositions
from multibranch.modules.state import StateView
from multibranch.modules.structured_dropout import DropHead, PathDropout


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    query_offset: int | Tensor = 0,
    dropout_p: float = 0.0,
    relative: RelativePositions | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention over heads.

    q: [B, H, L, d_k]; k, v: [B, H, S, d_k]; key_padding_mask: [B, S] bool, True at padding.
    `causal` lets query i (absolute position query_offset + i) see keys 0 .. query_offset + i.
    Returns ([B, H, L, d_k], attention probabilities [B, H, L, S] if need_weights else None).
    """
    L, S = q.shape[-2], k.shape[-2]
    causal = causal and not (L == 1 and query_offset == S - 1)  # a single newest query sees every key
    if relative is None and not need_weights:
        mask = None
        if key_padding_mask is not None:
            mask = ~key_padding_mask[:, None, None, :]  # [B, 1, 1, S], True = attend
        if causal and (mask is not None or query_offset != 0 or L != S):
            mask = _causal_mask(L, S, query_offset, q.device) if mask is None else mask & _causal_mask(
                L, S, query_offset, q.device
            )
            causal = False
        if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
            # CPU flash attention's backward was an order of magnitude slower in bf16 than in fp32 at
            # these sizes (torch 2.13, measured while tuning the -tiny presets): attend in fp32.
            with torch.autocast("cpu", enabled=False):
                out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                     dropout_p=dropout_p, is_causal=causal)
            return out.to(q.dtype), None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
        return out, None

    # Explicit path: relative positions (Shaw et al.) and/or returned attention weights.
    scale = q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2))  # [B, H, L, S]
    if relative is not None:
        bucket = relative.bucket_index(L, S, query_offset, q.device)  # [L, S]
        rel_logits = torch.matmul(q, relative.key_table.t())  # [B, H, L, 2k+1]
        scores = scores + rel_logits.gather(-1, bucket.expand(*rel_logits.shape[:2], L, S))
    scores = scores * scale
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if causal:
        scores = scores.masked_fill(~_causal_mask(L, S, query_offset, q.device), float("-inf"))
    probs = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(q.dtype)  # [B, H, L, S]
    dropped = dropout(probs, dropout_p) if dropout_p > 0 else probs
    out = torch.matmul(dropped, v)  # [B, H, L, d_k]
    if relative is not None:
        buckets = torch.zeros(*dropped.shape[:-1], relative.key_table.shape[0], dtype=dropped.dtype, device=q.device)
        buckets.scatter_add_(-1, bucket.expand_as(dropped), dropped)  # [B, H, L, 2k+1]
        out = out + torch.matmul(buckets, relative.values)
    return out, (probs if need_weights else None)


def _query_groups(queries: int, memories: int) -> int:
    """Query rows per memory row (1, or g when g consecutive queries share one memory row)."""
    if queries == memories:
        return 1
    if memories == 0 or queries % memories:
        raise ValueError(f"{queries} query rows cannot share {memories} memory rows (need a whole multiple)")
    return queries // memories


def _ungroup(x: Tensor, groups: int) -> Tensor:
    """[B/g, H, g*L, n] -> [B, H, L, n] (the inverse of grouping g consecutive rows' queries)."""
    b, H, gL, n = x.shape
    return x.transpose(1, 2).reshape(b * groups, gL // groups, H, n).transpose(1, 2)


def _causal_mask(query_len: int, key_len: int, query_offset: int, device: torch.device) -> Tensor:
    """[L, S] bool, True where key position <= query position."""
    q_pos = torch.arange(query_offset, query_offset + query_len, device=device)[:, None]
    return torch.arange(key_len, device=device)[None, :] <= q_pos


class HeadGated(nn.Module):
    """Base of attention modules with a per-head output gate (see the module docstring).

    Subclasses call `init_head_gate(H)` and apply `self.head_gate` [H] or [B, H] (when not None) to their head
    outputs before the output projection.
    """

    gate_heads: int
    role: str | None = None  # "encoder_self", "decoder_self" or "cross", set by the layer builders
    attention_probe: Callable[[Tensor], None] | None = None  # receives probabilities [B, H, L, S]

    def init_head_gate(self, heads: int) -> None:
        self.gate_heads = heads
        self.register_buffer("head_gate", None, persistent=False)

    def set_head_gate(self, gate: Tensor | None) -> None:
        """Install a gate [H] or [B, H] (float) or remove it (None: the ungated forward)."""
        if gate is not None and (gate.dim() not in (1, 2) or gate.shape[-1] != self.gate_heads):
            raise ValueError(f"head gate of shape {tuple(gate.shape)} for {self.gate_heads} heads")
        self.head_gate = gate


class ParallelAttention(HeadGated, DecodingAcceleration):
    """N_a branches x M heads of attention computed as one attention with N_a*M heads.

    Args:
        d_model: model width d (input and output).
        heads: heads per branch, M.
        branches: number of branches N_a (1 = standard multi-head attention).
        head_dim: width of one head (default d / M).
        dropout: attention-probability dropout.
        merge: "mean" (c = 1/N_a) or "mean_sq" (c = 1/N_a^2, the MAT release).
        drop_branch: MAT drop-branch (or, with `head_drop`, the per-head variant of MAT §7.2).
        drophead: Scheduled DropHead over all N_a*M heads.
        relative: Shaw-style relative positions.
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        branches: int = 1,
        head_dim: int | None = None,
        dropout: float = 0.0,
        merge: Literal["mean", "mean_sq"] = "mean",
        drop_branch: PathDropout | None = None,
        head_drop: bool = False,
        drophead: DropHead | None = None,
        relative: RelativePositions | None = None,
    ):
        super().__init__()
        if head_dim is None:
            if d_model % heads:
                raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
            head_dim = d_model // heads
        self.d_model, self.heads, self.branches, self.head_dim = d_model, heads, branches, head_dim
        self.total_heads = branches * heads
        self.inner_dim = self.total_heads * head_dim
        self.dropout = dropout
        self.merge = merge
        self.merge_scale = merge_constant(branches, merge)
        self.in_proj = nn.Linear(d_model, 3 * self.inner_dim)
        self.out_proj = nn.Linear(self.inner_dim, d_model, bias=False)
        self.out_bias = nn.Parameter(torch.zeros(branches, d_model))
        self.drop_branch = drop_branch  # paths: branches, or all heads when head_drop
        self.head_drop = head_drop
        self.drophead = drophead
        self.relative = relative
        self.init_head_gate(self.total_heads)
        self.reset_parameters()

    def reset_parameters(self, scheme: str = "xavier") -> None:
        """xavier: each of the Q/K/V/O blocks gets Xavier-uniform with its own fans (fairseq);
        torch: PyTorch's Linear default (MUSE's recipe). Biases start at zero."""
        inner = self.inner_dim
        with torch.no_grad():
            init_blocks(self.in_proj.weight, inner, 0, scheme)
            init_weight(self.out_proj.weight, scheme, a=1.0)
            self.in_proj.bias.zero_()
            self.out_bias.zero_()

    # ---- pieces reusable by other layers (MUSE shares V with its convolution) -------------------

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention projections: x [B, L, d] -> q, k, v each [B, H, L, d_k] (H = N_a*M)."""
        B, L, _ = x.shape
        packed = self._packed("qkv")
        qkv = packed(x) if packed is not None else F.linear(x, self.in_proj.weight, self.in_proj.bias)  # [B, L, 3*H*d_k]
        qkv = qkv.view(B, L, 3, self.total_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # [3, B, H, L, d_k]
        return qkv[0], qkv[1], qkv[2]

    def project_q(self, x: Tensor) -> Tensor:
        """x [B, L, d] -> q [B, H, L, d_k]."""
        B, L, _ = x.shape
        packed = self._packed("q")
        if packed is not None:
            q = packed(x)
        else:
            q = F.linear(x, self.in_proj.weight[: self.inner_dim], self.in_proj.bias[: self.inner_dim])
        return q.view(B, L, self.total_heads, self.head_dim).transpose(1, 2)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """memory [B, S, d] -> k, v each [B, H, S, d_k]."""
        B, S, _ = memory.shape
        kv = self._kv_rows(memory).view(B, S, 2, self.total_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return kv[0], kv[1]

    def _kv_rows(self, memory: Tensor) -> Tensor:
        """memory [B, S, d] -> the fused K|V projection [B, S, 2*H*d_k] (packed on a decoding copy)."""
        packed = self._packed("kv")
        if packed is not None:
            return packed(memory)
        return F.linear(memory, self.in_proj.weight[self.inner_dim :], self.in_proj.bias[self.inner_dim :])

    def head_scales(self, batch_size: int, device: torch.device) -> tuple[Tensor | None, Tensor | None]:
        """Structured-dropout scales times the head gate: (per head [1 or B, H], per branch bias
        scale [1 or B, N_a]). Both None when there is neither dropout (eval) nor a gate."""
        head_scale, branch_scale = None, None
        if self.drop_branch is not None:
            path_scale = self.drop_branch(batch_size, device)
            if path_scale is not None:
                if self.head_drop:  # MAT eq. 9-10: one bit per head, bias untouched
                    head_scale = path_scale
                else:
                    branch_scale = path_scale  # [1 or B, N_a]
                    head_scale = path_scale.repeat_interleave(self.heads, dim=1)  # [1 or B, H]
        if self.drophead is not None:
            dh = self.drophead(batch_size, device)  # [B, H]
            if dh is not None:
                head_scale = dh if head_scale is None else head_scale * dh
        if self.head_gate is not None:
            gate = self.head_gate if self.head_gate.dim() == 2 else self.head_gate[None, :]  # [B or 1, H]
            head_scale = gate if head_scale is None else head_scale * gate
        return head_scale, branch_scale

    def merge_heads(self, heads: Tensor, head_scale: Tensor | None = None, branch_scale: Tensor | None = None) -> Tensor:
        """heads [B, L, H*d_k] -> [B, L, d]: scaled, branch-averaged output projection."""
        packed = self._packed("out")
        if packed is not None and head_scale is None and branch_scale is None:
            return packed(heads)
        weight = self.out_proj.weight  # [d, H*d_k]
        c = self.merge_scale
        if head_scale is not None and head_scale.shape[0] == 1:  # per-batch: fold into the weight
            weight = weight * head_scale.repeat_interleave(self.head_dim, dim=1)  # [d, H*d_k]
        elif head_scale is not None:  # per-sample: scale the head outputs
            B, L, _ = heads.shape
            heads = (heads.view(B, L, self.total_heads, self.head_dim) * head_scale[:, None, :, None]).view(B, L, -1)
        # scales of 1 (a scheduled rate at 0) compute exactly what no scale does, and a row of 0 scales gives
        # exactly 0 (see branch_bias); nothing here branches on the scales' values
        correction = None
        if branch_scale is None:
            bias = branch_bias(self.out_bias)  # [d]
        elif branch_scale.shape[0] == 1:  # per-batch
            bias = branch_bias(self.out_bias, branch_scale)[0]  # [d]
        else:  # per-sample: the plain sum plus sum_i (s_i - 1) b_i per row, exactly 0 at scale 1
            bias = branch_bias(self.out_bias)
            correction = branch_bias(self.out_bias, branch_scale - 1.0)[:, None, :]  # [B, 1, d]
        if c != 1.0:
            weight, bias = weight * c, bias * c
            correction = correction * c if correction is not None else None
        out = F.linear(heads, weight, bias)
        return out if correction is None else out + correction

    # ---- the module ------------------------------------------------------------------------------

    def attend_heads(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: StateView | None = None,
        need_weights: bool = False,
        qkv: tuple[Tensor, Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Per-head outputs before the output projection: ([B, H, L, d_k], weights [B, H, L, S] or None).

        Self-attention over x [B, L, d] (memory None) or cross-attention over memory [B, S, d];
        key_padding_mask [B, S] is True at padding. With a `cache` (incremental decoding) the keys and
        values of earlier steps are appended to (self), or the projected memory is computed once (cross).
        Cross-attention memory may also be shared: memory [B / g, S, d] with its mask [B / g, S] serves
        g consecutive query rows each (beam search: the hypotheses of one sentence), so its keys and
        values are projected, cached and read once per sentence instead of g times.
        `qkv`: the self-attention projections of x if the caller already made them (MUSE shares V).
        Structured dropout is not applied here (see `head_scales`).
        """
        fused = self.fused_step(x, memory, key_padding_mask, cache, need_weights, qkv)  # a CPU decoding step
        if fused is not None:
            return fused, None
        query_offset = 0
        groups = 1
        if memory is None:
            q, k, v = qkv if qkv is not None else self.project_qkv(x)  # [B, H, L, d_k] each
            if cache is not None:  # the keys and values of every step so far
                k = cache.append("k", k, dim=2)
                v = cache.append("v", v, dim=2)
                if cache.fixed:  # buffers of every position: mask those not decoded yet (the query is the newest)
                    key_padding_mask, causal, query_offset = cache.future_keys(), False, cache.offset()
                else:
                    query_offset = k.shape[2] - q.shape[2]
        else:
            q = self.project_q(x)
            k = cache.get("k") if cache is not None else None
            if k is None:
                k, v = self.project_kv(memory)
                if cache is not None:
                    cache.set("k", k, static=True)
                    cache.set("v", v, static=True)
            else:
                v = cache.get("v")
            groups = _query_groups(q.shape[0], k.shape[0])
            if groups > 1:  # [B, H, L, d_k] -> [B/g, H, g*L, d_k]: a sentence's queries side by side
                B, H, L, d_k = q.shape
                q = q.transpose(1, 2).reshape(B // groups, groups * L, H, d_k).transpose(1, 2)
        probe = self.attention_probe
        heads, weights = attend(
            q,
            k,
            v,
            key_padding_mask=key_padding_mask,
            causal=causal,
            query_offset=query_offset,
            dropout_p=self.dropout if self.training else 0.0,
            relative=self.relative,
            need_weights=need_weights or probe is not None,
        )
        if groups > 1:  # back to one row per query: [B/g, H, g*L, .] -> [B, H, L, .]
            heads = _ungroup(heads, groups)
            weights = _ungroup(weights, groups) if weights is not None else None
        if probe is not None:
            probe(weights)
        return heads, (weights if need_weights else None)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: StateView | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor | None]:
        """Attention of queries x [B, L, d] over x (self) or `memory` [B, S, d] (cross) -> [B, L, d]
        (and the attention weights if asked); arguments as in `attend_heads`."""
        B, L, _ = x.shape
        head_scale, branch_scale = self.head_scales(B, x.device)  # every branch dropped: computed, gives 0
        heads, weights = self.attend_heads(x, memory, key_padding_mask, causal, cache, need_weights)
        heads = heads.transpose(1, 2).reshape(B, L, self.inner_dim)  # [B, L, H*d_k]
        out = self.merge_heads(heads, head_scale, branch_scale)
        return (out, weights) if need_weights else out

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, branches={self.branches}, heads={self.heads}, head_dim={self.head_dim}, "
            f"merge={self.merge}, dropout={self.dropout}"
        )
