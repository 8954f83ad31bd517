"""MAT multi-branch FFN with drop-branch (docs/papers.md#mat-ffn-drop-branch) against a per-branch hand
computation."""

from __future__ import annotations

import pytest
import torch

from multibranch.config import from_dict
from multibranch.models import ModelConfig, build_model
from multibranch.modules.feedforward import FeedForward
from multibranch.modules.structured_dropout import PathDropout
from tests.helpers.configs import tiny_model_dict

RHO = 0.4


def _ffn(branches: int, per_sample: bool = False, merge: str = "mean") -> FeedForward:
    ffn = FeedForward(16, 8, branches=branches, merge=merge, drop_branch=PathDropout(branches, RHO, per_sample))
    with torch.no_grad():  # random weights and clearly non-zero, branch-distinct output biases
        for p in ffn.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        ffn.fc2_bias.add_(torch.arange(1.0, branches + 1)[:, None] * 3.0)
    return ffn.train()


def _fix_mask(ffn: FeedForward, mask: torch.Tensor) -> None:
    """Replace the random drop-branch draw by `mask` ([1 or B, N_f] of 0 / 1/(1-rho))."""
    ffn.drop_branch.forward = lambda batch, device: mask


def _hand_ffn(ffn: FeedForward, x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """c * sum_i s_i * (W_2^i relu(W_1^i x + b_1^i) + b_2^i), branch by branch; scales [B, N_f]."""
    n, dh = ffn.branches, ffn.hidden_dim
    c = ffn.merge_scale
    out = torch.zeros_like(x)
    for i in range(n):
        w1, b1 = ffn.fc1.weight[i * dh : (i + 1) * dh], ffn.fc1.bias[i * dh : (i + 1) * dh]
        w2, b2 = ffn.fc2.weight[:, i * dh : (i + 1) * dh], ffn.fc2_bias[i]
        branch = torch.relu(x @ w1.T + b1) @ w2.T + b2  # [B, L, d]
        out = out + c * scales[:, i, None, None] * branch
    return out


@pytest.mark.parametrize("merge", ["mean", "mean_sq"])
def test_per_batch_mask_drops_branches_with_their_bias_and_rescales_the_kept(merge):
    ffn = _ffn(3, merge=merge)
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[1.0, 0.0, 1.0]]) / (1 - RHO)
    _fix_mask(ffn, mask)
    with torch.no_grad():
        ours = ffn(x)
        torch.testing.assert_close(ours, _hand_ffn(ffn, x, mask.expand(2, 3)), atol=1e-5, rtol=1e-5)
        # the dropped branch leaves no trace: same output with that branch's parameters zeroed
        dh = ffn.hidden_dim
        ffn.fc1.weight[dh : 2 * dh] = 0
        ffn.fc1.bias[dh : 2 * dh] = 0
        ffn.fc2.weight[:, dh : 2 * dh] = 0
        ffn.fc2_bias[1] = 0
        torch.testing.assert_close(ffn(x), ours, atol=1e-5, rtol=1e-5)


def test_per_sample_masks_drop_branches_row_by_row():
    ffn = _ffn(2, per_sample=True)
    x = torch.randn(4, 3, 16)
    k = 1 / (1 - RHO)
    masks = torch.tensor([[k, 0.0], [0.0, k], [k, k], [0.0, 0.0]])  # the last sample loses both branches
    _fix_mask(ffn, masks)
    with torch.no_grad():
        ours = ffn(x)
        torch.testing.assert_close(ours, _hand_ffn(ffn, x, masks), atol=1e-5, rtol=1e-5)
    assert torch.equal(ours[3], torch.zeros(3, 16)), "a sample without branches outputs exactly zero"


def test_every_branch_dropped_gives_exactly_zero_and_the_residual_passes():
    ffn = _ffn(2)
    _fix_mask(ffn, torch.zeros(1, 2))
    x = torch.randn(2, 5, 16)
    assert torch.equal(ffn(x), torch.zeros(2, 5, 16))
    # in a pre-norm layer with every attention and FFN branch dropped, the layer is the identity
    layer_cfg = {"kind": "transformer", "attention_branches": 2, "ffn_branches": 2, "drop_branch": 0.5}
    cfg = from_dict(ModelConfig, tiny_model_dict(norm="pre", dropout=0.0, encoder=layer_cfg, decoder=layer_cfg))
    layer = build_model(cfg).encoder.layers[0].train()
    with torch.no_grad():
        layer.ffn.fc2_bias.fill_(1.0)
        layer.self_attn.out_bias.fill_(1.0)
    _fix_mask(layer.ffn, torch.zeros(1, 2))
    layer.self_attn.drop_branch.forward = lambda batch, device: torch.zeros(1, 2)
    h = torch.randn(2, 6, 32)
    assert torch.equal(layer(h, None), h)


def test_mat_config_builds_the_ffn_drop_branch_with_its_own_rate_and_granularity():
    layer_cfg = {"kind": "transformer", "attention_branches": 3, "ffn_branches": 2, "drop_branch": 0.3,
                 "ffn_drop_branch": 0.2, "drop_branch_granularity": "sample"}
    cfg = from_dict(ModelConfig, tiny_model_dict(encoder=layer_cfg, decoder={"kind": "transformer"}))
    ffn = build_model(cfg).encoder.layers[0].ffn
    assert (ffn.branches, ffn.drop_branch.paths, ffn.drop_branch.per_sample) == (2, 2, True)
    assert ffn.drop_branch.p == pytest.approx(0.2)
    del layer_cfg["ffn_drop_branch"]
    cfg = from_dict(ModelConfig, tiny_model_dict(encoder=layer_cfg, decoder={"kind": "transformer"}))
    assert build_model(cfg).encoder.layers[0].ffn.drop_branch.p == pytest.approx(0.3), "defaults to drop_branch"


def test_eval_is_the_plain_branch_mean():
    ffn = _ffn(3).eval()
    x = torch.randn(2, 4, 16)
    with torch.no_grad():
        torch.testing.assert_close(ffn(x), _hand_ffn(ffn, x, torch.ones(2, 3)), atol=1e-5, rtol=1e-5)
