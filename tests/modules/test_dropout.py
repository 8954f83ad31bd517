"""The CPU dropout: drop rate, exact rescale, gradient through the same mask, seeded like torch; its stream
against SplitMix64 computed independently (Python integers), and the C++ kernel against the PyTorch path."""

from __future__ import annotations

import pytest
import torch

from multibranch import cpu_kernels
from multibranch.modules.dropout import apply_mask, dropout, keep_mask

MASK64 = (1 << 64) - 1


def splitmix64(seed: int, word: int) -> int:
    """SplitMix64's output for step word + 1 after `seed` (Steele, Lea and Flood 2014), in Python integers."""
    z = (seed + (word + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def expected_mask(numel: int, seed: int, threshold: int) -> list[bool]:
    """Element i kept when lane i % 4 of word i // 4, as a signed 16-bit integer, is >= threshold - 32768."""
    kept = []
    for i in range(numel):
        lane = (splitmix64(seed, i // 4) >> (16 * (i % 4))) & 0xFFFF
        kept.append((lane - 65536 if lane >= 32768 else lane) >= threshold - 32768)
    return kept


def test_splitmix64_gives_its_published_first_output():
    assert splitmix64(0, 0) == 0xE220A8397B1DCDAF  # the reference generator seeded with 0 (Vigna's splitmix64.c)


@pytest.mark.parametrize("seed", [0, 1, -1, 2**63 - 1, -(2**63), 0x5DEECE66D])
@pytest.mark.parametrize("threshold", [0, 1, 6554, 32767, 32768, 65535, 65536])
def test_the_mask_is_splitmix64s_stream(seed, threshold):
    numel = 37  # not a multiple of 4: the last word's lanes are cut
    assert keep_mask(numel, seed, threshold).tolist() == expected_mask(numel, seed % 2**64, threshold)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1,), (3,), (5, 7), (4, 130, 1027)])  # the last one spans several threads' blocks
@pytest.mark.parametrize("threshold", [0, round(0.3 * 65536), 65536])
def test_the_kernel_gives_the_pytorch_paths_numbers(cpu_kernels_built, dtype, shape, threshold):
    kernels = cpu_kernels.kernels()
    x = torch.randn(shape).to(dtype)
    seed, scale = torch.tensor(-8_123_456_789), 1 / 0.7
    reference = torch.where(keep_mask(x.numel(), seed, threshold).view(shape), x * scale, 0.0)
    assert torch.equal(kernels.dropout_apply(x.contiguous(), seed, threshold, scale), reference)


def test_the_kernels_mask_does_not_depend_on_the_threads(cpu_kernels_built):
    kernels = cpu_kernels.kernels()
    x = torch.randn(8, 1000, 33)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernels.dropout_apply(x, torch.tensor(42), 6554, 1 / 0.9)
        torch.set_num_threads(2)
        two = kernels.dropout_apply(x, torch.tensor(42), 6554, 1 / 0.9)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_without_the_kernels_the_numbers_are_the_same(cpu_kernels_built, monkeypatch):
    x = torch.randn(6, 501)
    with_kernels = apply_mask(x, torch.tensor(7), 6554, 1 / 0.9)
    monkeypatch.setattr(cpu_kernels, "kernels", lambda: None)
    assert torch.equal(apply_mask(x, torch.tensor(7), 6554, 1 / 0.9), with_kernels)


def test_a_non_contiguous_input_is_masked_in_its_own_shape():
    x = torch.randn(40, 30).t()  # [30, 40], not contiguous
    out = apply_mask(x, torch.tensor(11), 32768, 2.0)
    assert out.shape == x.shape
    assert torch.equal(out, torch.where(keep_mask(x.numel(), 11, 32768).view(30, 40), x.contiguous() * 2.0, 0.0))


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
    x = torch.ones(2000, 100)
    torch.manual_seed(2)
    a = dropout(x, 0.25)
    torch.manual_seed(2)
    b = dropout(x, 0.25)
    assert torch.equal(a, b)
    c = dropout(x, 0.25)  # the next call draws another seed
    assert not torch.equal(a, c)
    per_column = (a == 0).float().mean(0)  # every lane position drops at the same rate
    assert per_column.min() > 0.2 and per_column.max() < 0.3
