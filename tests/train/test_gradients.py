"""The gradients' flat buffer: the same gradients as autograd's own, at fixed addresses, zeroed in place."""

from __future__ import annotations

import torch
from torch import nn

from multibranch.train.gradients import FlatGradients


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    model.unused = nn.Linear(2, 2)  # no forward reaches it
    return model


def _backward(model: nn.Module, seed: int) -> None:
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(seed))
    model[2](model[1](model[0](x))).pow(2).sum().backward()


def test_buffer_accumulates_exactly_what_autograd_accumulates():
    reference, flat_model = _model(), _model()
    _backward(reference, 1)
    _backward(flat_model, 1)
    flat = FlatGradients.adopt(flat_model.parameters())
    addresses = [p.grad.data_ptr() for p in flat_model.parameters() if p.grad is not None]
    for seed in (2, 3):  # two more batches: accumulation into the views, in place
        _backward(reference, seed)
        _backward(flat_model, seed)
    for p, q in zip(reference.parameters(), flat_model.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad)  # bit for bit: the same additions in the same order
    assert [p.grad.data_ptr() for p in flat_model.parameters() if p.grad is not None] == addresses
    assert flat.attached()


def test_unused_parameters_stay_out_and_zeroing_keeps_the_views():
    model = _model()
    _backward(model, 1)
    flat = FlatGradients.adopt(model.parameters())
    assert model.unused.weight.grad is None and model.unused.bias.grad is None
    assert sum(b.numel() for b in flat.buffers) == sum(p.numel() for p in model[0].parameters()) + sum(
        p.numel() for p in model[2].parameters())
    flat.zero_()
    assert flat.attached() and all(p.grad.abs().sum() == 0 for p in model.parameters() if p.grad is not None)
    model[0].weight.grad = None  # something dropped a gradient: attach() restores the view
    assert not flat.attached()
    flat.attach()
    assert flat.attached()
