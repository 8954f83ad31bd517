"""The two initialisation schemes every module offers (`ModelConfig.init`):

    "xavier"  Glorot-uniform weights (per block: each block gets its own fans, as separate Linears
              would, fairseq-style), zero biases
    "torch"   PyTorch's nn.Linear defaults: kaiming_uniform_(a=sqrt(5)) weights (a=1 for the output
              projections of attention, as fairseq/MUSE do), biases Unif(+-fan_in^-1/2)

One helper per tensor kind, so every module draws the same random numbers in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

LINEAR_A = math.sqrt(5)  # nn.Linear's kaiming_uniform_ slope


def init_weight(weight: Tensor, scheme: str, a: float = LINEAR_A) -> None:
    """Glorot-uniform ("xavier") or kaiming_uniform_(a) ("torch"), in place."""
    if scheme == "xavier":
        nn.init.xavier_uniform_(weight)
    else:
        nn.init.kaiming_uniform_(weight, a=a)


def init_blocks(weight: Tensor, split: int | Sequence[int], dim: int, scheme: str, a: float = LINEAR_A) -> None:
    """`init_weight` on each block of `weight.split(split, dim)`, in order (each with its own fans)."""
    for block in weight.split(split, dim=dim):
        init_weight(block, scheme, a)


def uniform_fan_in(tensor: Tensor, fan_in: int) -> None:
    """Unif(-fan_in^-1/2, fan_in^-1/2) in place: nn.Linear's default bias (and weight) bound."""
    bound = fan_in**-0.5
    nn.init.uniform_(tensor, -bound, bound)


def init_bias(bias: Tensor, scheme: str, fan_in: int) -> None:
    """Zero ("xavier") or nn.Linear's default Unif(+-fan_in^-1/2) ("torch"), in place."""
    if scheme == "xavier":
        nn.init.zeros_(bias)
    else:
        uniform_fan_in(bias, fan_in)
