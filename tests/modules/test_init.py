"""modules/init.py against PyTorch's own layers: the "torch" scheme must draw exactly what
nn.Linear's reset_parameters draws, the "xavier" scheme what xavier_uniform_ + zeros draw."""

from __future__ import annotations

import torch
from torch import nn

from multibranch.modules.init import init_bias, init_blocks, init_weight
from multibranch.modules.merge import merge_constant


def test_torch_scheme_is_nn_linear_default():
    torch.manual_seed(3)
    reference = nn.Linear(7, 5)
    torch.manual_seed(3)
    weight, bias = torch.empty(5, 7), torch.empty(5)
    with torch.no_grad():
        init_weight(weight, "torch")
        init_bias(bias, "torch", fan_in=7)
    assert torch.equal(weight, reference.weight) and torch.equal(bias, reference.bias)


def test_xavier_blocks_are_separate_linears():
    """Two blocks of a stacked [2*4, 6] weight = two independent xavier_uniform_ [4, 6] draws."""
    torch.manual_seed(5)
    expected = [nn.init.xavier_uniform_(torch.empty(4, 6)) for _ in range(2)]
    torch.manual_seed(5)
    weight, bias = torch.empty(8, 6), torch.ones(8)
    with torch.no_grad():
        init_blocks(weight, 4, 0, "xavier")
        init_bias(bias, "xavier", fan_in=6)
    assert torch.equal(weight, torch.cat(expected)) and torch.equal(bias, torch.zeros(8))
    bound = (6 / (4 + 6)) ** 0.5  # Glorot bound of one block, not of the stacked [8, 6] matrix
    assert weight.abs().max() <= bound


def test_merge_constant():
    assert merge_constant(4, "mean") == 0.25
    assert merge_constant(4, "mean_sq") == 1 / 16
