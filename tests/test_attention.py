"""The fused parallel attention against independent references with copied weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from multibranch.modules.attention import ParallelAttention
from multibranch.modules.positions import RelativePositions
from multibranch.modules.state import DecoderState
from multibranch.modules.structured_dropout import PathDropout


def _torch_mha_like(att: ParallelAttention) -> nn.MultiheadAttention:
    """nn.MultiheadAttention holding the weights of a single-branch ParallelAttention."""
    mha = nn.MultiheadAttention(att.d_model, att.heads, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(att.in_proj.weight)
        mha.in_proj_bias.copy_(att.in_proj.bias)
        mha.out_proj.weight.copy_(att.out_proj.weight)
        mha.out_proj.bias.copy_(att.out_bias[0])
    return mha.eval()


def _randomise(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)


def test_single_branch_equals_torch_multihead_attention_self_and_cross():
    att = ParallelAttention(32, 4).eval()
    _randomise(att)
    mha = _torch_mha_like(att)
    x, mem = torch.randn(3, 6, 32), torch.randn(3, 9, 32)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[0, 7:] = True
    pad[2, 4:] = True
    ours = att(x, mem, key_padding_mask=pad)
    ref, _ = mha(x, mem, mem, key_padding_mask=pad, need_weights=False)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    causal = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)
    torch.testing.assert_close(att(x, causal=True), mha(x, x, x, attn_mask=causal, need_weights=False)[0], atol=1e-5, rtol=1e-5)


def _reference_branch_mean(att: ParallelAttention, x, mem, pad, scales=None):
    """Per-branch loop: c * sum_i s_i * MHA_i(x), each branch its own nn.MultiheadAttention."""
    d, m, n, dk = att.d_model, att.heads, att.branches, att.head_dim
    inner = m * dk
    total = 0
    for i in range(n):
        mha = nn.MultiheadAttention(d, m, batch_first=True).eval()
        w = att.in_proj.weight.view(3, n, inner, d)[:, i].reshape(3 * inner, d)
        b = att.in_proj.bias.view(3, n, inner)[:, i].reshape(-1)
        with torch.no_grad():
            mha.in_proj_weight.copy_(w)
            mha.in_proj_bias.copy_(b)
            mha.out_proj.weight.copy_(att.out_proj.weight[:, i * inner : (i + 1) * inner])
            mha.out_proj.bias.copy_(att.out_bias[i])
        out = mha(x, mem, mem, key_padding_mask=pad, need_weights=False)[0]
        s = 1.0 if scales is None else scales[i]
        total = total + s * out
    return att.merge_scale * total


@pytest.mark.parametrize("merge", ["mean", "mean_sq"])
def test_multi_branch_equals_loop_over_independent_attentions(merge):
    att = ParallelAttention(32, 4, branches=3, merge=merge).eval()
    _randomise(att)
    x, mem = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    torch.testing.assert_close(att(x, mem, key_padding_mask=pad), _reference_branch_mean(att, x, mem, pad), atol=1e-5, rtol=1e-5)


def test_drop_branch_mask_zeroes_dropped_branches_including_bias_and_rescales_kept():
    rho = 0.4
    att = ParallelAttention(32, 4, branches=3, drop_branch=PathDropout(3, rho)).train()
    _randomise(att)
    x = torch.randn(2, 5, 32)
    fixed = torch.tensor([[1.0, 0.0, 1.0]]) / (1 - rho)
    att.drop_branch.forward = lambda batch, device: fixed  # a fixed mask instead of a random one
    ours = att(x)
    ref = _reference_branch_mean(att.eval(), x, x, None, scales=fixed[0].tolist())
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    att.drop_branch.forward = lambda batch, device: torch.zeros(1, 3)
    assert torch.equal(att.train()(x), torch.zeros(2, 5, 32))


def test_per_sample_drop_branch_matches_per_row_reference():
    att = ParallelAttention(16, 2, branches=2, drop_branch=PathDropout(2, 0.5, per_sample=True)).train()
    _randomise(att)
    x = torch.randn(3, 4, 16)
    masks = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 2.0]])
    att.drop_branch.forward = lambda batch, device: masks
    ours = att(x)
    att.eval()
    for b in range(3):
        ref = _reference_branch_mean(att, x[b : b + 1], x[b : b + 1], None, scales=masks[b].tolist())
        torch.testing.assert_close(ours[b : b + 1], ref, atol=1e-5, rtol=1e-5)


def test_incremental_self_attention_equals_full_causal():
    att = ParallelAttention(32, 4, branches=2).eval()
    _randomise(att)
    x = torch.randn(2, 6, 32)
    full = att(x, causal=True)
    state = DecoderState()
    steps = [att(x[:, t : t + 1], causal=True, cache=state.view("a")) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def _shaw_reference(att: ParallelAttention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """Shaw et al. eq. (3)-(5) written out with explicit loops over positions."""
    B, L, _ = x.shape
    q, k, v = att.project_qkv(x)
    rel = att.relative
    out = torch.zeros_like(q)
    for i in range(L):
        logits = torch.zeros(B, att.total_heads, L)
        for j in range(L):
            a_k = rel.key_table[min(max(j - i, -rel.max_distance), rel.max_distance) + rel.max_distance]
            logits[..., j] = ((q[:, :, i] * (k[:, :, j] + a_k)).sum(-1)) / att.head_dim**0.5
        if causal:
            logits[..., i + 1 :] = float("-inf")
        p = logits.softmax(-1)
        for j in range(L):
            a_v = rel.values[min(max(j - i, -rel.max_distance), rel.max_distance) + rel.max_distance]
            out[:, :, i] += p[..., j, None] * (v[:, :, j] + a_v)
    return att.merge_heads(out.transpose(1, 2).reshape(B, L, -1))


@pytest.mark.parametrize("causal", [False, True])
def test_relative_positions_match_shaw_reference(causal):
    att = ParallelAttention(16, 2, relative=RelativePositions(2, 8)).eval()
    _randomise(att)
    x = torch.randn(2, 6, 16)
    torch.testing.assert_close(att(x, causal=causal), _shaw_reference(att, x, causal), atol=1e-5, rtol=1e-5)
    if causal:
        state = DecoderState()
        steps = torch.cat([att(x[:, t : t + 1], causal=True, cache=state.view("a")) for t in range(6)], 1)
        torch.testing.assert_close(steps, att(x, causal=True), atol=1e-5, rtol=1e-5)


def test_sdpa_reference_for_need_weights_path():
    att = ParallelAttention(16, 2).eval()
    _randomise(att)
    x = torch.randn(2, 5, 16)
    out, weights = att(x, need_weights=True)
    torch.testing.assert_close(out, att(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 5))
    q, k, v = att.project_qkv(x)
    torch.testing.assert_close(weights, torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, -1), atol=1e-6, rtol=1e-5)
    _ = F  # noqa
