"""Element-wise dropout that is cheaper on CPU than `torch.nn.functional.dropout`.

PyTorch's CPU dropout draws one Bernoulli sample per element through the Mersenne Twister and keeps a mask for
the backward. Here each call draws one 64-bit seed from torch's default generator (so runs stay seedable and
resume exactly), and element i is kept when lane i % 4 (16 bits) of the SplitMix64 output for word i // 4 of that
seed, read as a signed integer, is at least round(p * 65536) - 32768 (`keep_mask`): the drop rate is p rounded
to a multiple of 1/65536 (off by less than 1e-5), and kept elements are scaled by 1 / (1 - p) as usual. The mask
is a function of the seed and the position, so the backward recomputes it instead of storing it. The CPU kernel
`csrc/dropout.cpp` does either pass in one sweep; where it is not built, `keep_mask` computes the same stream
with PyTorch operations: the same numbers, at about PyTorch's own dropout's speed (docs/benchmarks.md). On
other devices, and inside torch.compile, it defers to `F.dropout`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from multibranch import cpu_kernels

_LANES = 65536
_KERNEL_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# SplitMix64's constants as signed 64-bit integers (PyTorch's int64 arithmetic wraps modulo 2^64)
_GAMMA, _MIX1, _MIX2 = (c - 2**64 if c >= 2**63 else c
                        for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def draw_seed() -> Tensor:
    """One 64-bit seed from torch's default CPU generator, a 0-d int64 tensor (never read on the host: a training
    update reads nothing back)."""
    return torch.empty((), dtype=torch.int64).random_(-(2**63), 2**63 - 1)


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 `z` (PyTorch's >> is arithmetic: the sign bits are masked off)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _stream_words(numel: int, seed: int | Tensor) -> Tensor:
    """SplitMix64's outputs [ceil(numel / 4)] (int64) for words 0, 1, ... of `seed`: four 16-bit lanes each."""
    z = seed + torch.arange(1, (numel + 3) // 4 + 1, dtype=torch.int64) * _GAMMA  # the generator's states
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def keep_mask(numel: int, seed: int | Tensor, threshold: int) -> Tensor:
    """The kept elements [numel] (bool) of `seed`'s stream at `threshold` (of 65536), as csrc/dropout.cpp keeps
    them (the path where it is not built): lane i % 4 of word i // 4, bits 16 (i % 4) to 16 (i % 4) + 15 (the
    words' memory order, little-endian), read as a signed 16-bit integer, at least threshold - 32768."""
    if threshold >= _LANES:  # threshold - 32768 does not fit the lanes' int16, which would wrap it
        return torch.zeros(numel, dtype=torch.bool)
    return _stream_words(numel, seed).view(torch.int16)[:numel] >= threshold - _LANES // 2


def apply_mask(x: Tensor, seed: Tensor, threshold: int, scale: float) -> Tensor:
    """x * scale where `seed`'s stream keeps an element, else 0 (x's shape, contiguous)."""
    x = x.contiguous()
    kernels = cpu_kernels.kernels() if x.dtype in _KERNEL_DTYPES else None
    if kernels is not None:
        return kernels.dropout_apply(x, seed, threshold, scale)
    return torch.where(keep_mask(x.numel(), seed, threshold).view(x.shape), x * scale, 0.0)


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:  # type: ignore[override]
        ctx.seed, ctx.threshold, ctx.scale = draw_seed(), round(p * _LANES), 1.0 / (1.0 - p)
        return apply_mask(x, ctx.seed, ctx.threshold, ctx.scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return apply_mask(grad, ctx.seed, ctx.threshold, ctx.scale), None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Same contract as F.dropout(x, p, training) (not in place)."""
    if not training or p <= 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, True)
    return _Dropout.apply(x, p)
