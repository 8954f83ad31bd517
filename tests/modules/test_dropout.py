"""The CPU dropout: drop rate, exact rescale, gradient through the same mask, seeded like torch."""

from __future__ import annotations

import torch

from multibranch.modules.dropout import dropout, keep_mask


def test_rate_and_rescale():
    torch.manual_seed(0)
    x = torch.ones(400, 1000)
    y = dropout(x, 0.1)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.003
    kept = y[y != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / 0.9))
    assert abs(y.mean().item() - 1.0) < 0.005  # unbiased


def test_identity_in_eval_and_at_zero_rate():
    x = torch.randn(5, 7)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0) is x


def test_gradient_uses_the_forward_mask():
    torch.manual_seed(1)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.5)
    y.sum().backward()
    keep = y.detach() != 0
    scale = 2.0
    assert torch.equal(x.grad, keep.float() * scale)


def test_masks_are_uniform_and_reproducible_from_the_torch_seed():
    torch.manual_seed(2)
    a, _ = keep_mask((10, 1001), 0.25)
    torch.manual_seed(2)
    b, _ = keep_mask((10, 1001), 0.25)
    assert torch.equal(a, b)
    torch.manual_seed(3)
    m, _ = keep_mask((2000, 100), 0.25)
    per_column = (~m).float().mean(0)  # every lane position drops at the same rate
    assert per_column.min() > 0.2 and per_column.max() < 0.3
