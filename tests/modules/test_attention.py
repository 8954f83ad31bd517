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


def _hand_head_drop_attention(att: ParallelAttention, x: torch.Tensor, head_scale: torch.Tensor) -> torch.Tensor:
    """MAT head-drop (docs/papers.md#mat-head-drop-variant) written out head by head: every head output times
    its own scale before W_O^i, the branch biases untouched: c * sum_i (sum_j s_ij head_ij W_O^ij + b_O^i).
    head_scale [B, N_a*M] (branch-major heads)."""
    dk, inner, d = att.head_dim, att.inner_dim, att.d_model
    w, b = att.in_proj.weight, att.in_proj.bias
    out = torch.zeros(*x.shape[:2], d)
    for h in range(att.total_heads):
        rows = slice(h * dk, (h + 1) * dk)
        q = x @ w[rows].T + b[rows]  # [B, L, d_k]
        k = x @ w[inner:][rows].T + b[inner:][rows]
        v = x @ w[2 * inner :][rows].T + b[2 * inner :][rows]
        head = torch.softmax(q @ k.transpose(1, 2) / dk**0.5, dim=-1) @ v  # [B, L, d_k]
        out = out + head_scale[:, h, None, None] * (head @ att.out_proj.weight[:, rows].T)
    return att.merge_scale * (out + att.out_bias.sum(0))


@pytest.mark.parametrize("per_sample", [False, True])
def test_head_drop_masks_single_heads_before_w_o_and_keeps_the_output_bias(per_sample):
    rho, branches, heads = 0.3, 2, 2
    att = ParallelAttention(16, heads, branches=branches, drop_branch=PathDropout(4, rho, per_sample),
                            head_drop=True).train()
    _randomise(att)
    x = torch.randn(3, 5, 16)
    k = 1 / (1 - rho)
    if per_sample:  # sample 2 loses every head: only the biases remain
        mask = torch.tensor([[k, 0.0, k, k], [0.0, k, k, 0.0], [0.0, 0.0, 0.0, 0.0]])
    else:  # branch 0 keeps head 1 only, branch 1 keeps both
        mask = torch.tensor([[0.0, k, k, k]])
    att.drop_branch.forward = lambda batch, device: mask
    with torch.no_grad():
        head_scale, branch_scale = att.head_scales(3, x.device)
        assert branch_scale is None, "branch-level dropping is off in head-drop mode"
        torch.testing.assert_close(att(x), _hand_head_drop_attention(att, x, mask.expand(3, 4)), atol=1e-5, rtol=1e-5)
        del att.drop_branch.forward  # the real PathDropout again: identity in eval
        torch.testing.assert_close(att.eval()(x), _hand_head_drop_attention(att, x, torch.ones(3, 4)), atol=1e-5, rtol=1e-5)


def test_head_drop_layer_config_draws_one_bit_per_head_of_every_branch():
    from multibranch.config import from_dict
    from multibranch.models import ModelConfig, build_model
    from tests.helpers.configs import tiny_model_dict

    layer = {"kind": "transformer", "attention_branches": 3, "drop_branch": 0.3, "head_drop": True}
    model = build_model(from_dict(ModelConfig, tiny_model_dict(encoder=layer, decoder=layer)))
    for att in (model.encoder.layers[0].self_attn, model.decoder.layers[1].cross_attn):
        assert att.head_drop and att.drop_branch.paths == 3 * 4 and not att.drop_branch.per_sample
    draws = torch.cat([model.encoder.layers[0].self_attn.train().head_scales(2, torch.device("cpu"))[0]
                       for _ in range(500)])  # [500, 12]
    assert torch.allclose(draws.unique(), torch.tensor([0.0, 1 / 0.7]))
    assert abs((draws == 0).float().mean().item() - 0.3) < 0.03
