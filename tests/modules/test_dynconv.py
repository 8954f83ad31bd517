"""Dynamic depthwise convolution (docs/papers.md#muse-kernel-prediction): the three contraction paths agree,
an explicit-loop reference agrees, causality, padding masking, kernel normalisation, the gate."""

from __future__ import annotations

import itertools

import pytest
import torch

from multibranch.modules.dynconv import DynamicConv, band_matrix, check_kernel_sizes
from multibranch.modules.state import DecoderState

D, H = 16, 4


def _conv(kernels=(3, 15), causal=False, **kw) -> DynamicConv:
    conv = DynamicConv(D, H, list(kernels), causal=causal, **kw)
    with torch.no_grad():  # sharper kernels and a non-uniform gate than the init, so errors would show
        conv.kernel_proj.weight.normal_(0.0, 1.0)
        if conv.gate is not None:
            conv.gate.normal_(0.0, 1.0)
    return conv


def _v(batch=3, length=11, seed=0) -> torch.Tensor:
    return torch.randn(batch, length, D, generator=torch.Generator().manual_seed(seed))


def _steps(conv: DynamicConv, v: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """Run the incremental path over v in consecutive chunks of the given lengths."""
    state, outs, start = DecoderState(), [], 0
    for n in chunks:
        outs.append(conv(v[:, start : start + n], cache=state.view("conv")))
        start += n
    assert start == v.shape[1]
    return torch.cat(outs, dim=1)


def _naive(conv: DynamicConv, v: torch.Tensor) -> torch.Tensor:
    """Explicit loops over samples, positions, heads and taps (eval mode: no weight dropout)."""
    B, L, d = v.shape
    R = d // conv.heads
    logits = v @ conv.kernel_proj.weight.t()  # [B, L, H*sum(K)]
    gate = torch.softmax(conv.gate, 0) if conv.gate is not None else torch.ones(len(conv.kernel_sizes))
    out = torch.zeros(B, L, conv.outputs * d, dtype=v.dtype)
    col = 0
    for i, K in enumerate(conv.kernel_sizes):
        w = torch.softmax(logits[..., col : col + conv.heads * K].reshape(B, L, conv.heads, K), dim=-1)
        col += conv.heads * K
        P = K - 1 if conv.causal else K // 2
        block = 0 if conv.kernel_mix == "gate" else i
        scale = gate[i] if conv.kernel_mix == "gate" else 1.0
        for b, t, h, j in itertools.product(range(B), range(L), range(conv.heads), range(K)):
            s = t + j - P
            if 0 <= s < L:
                ch = slice(block * d + h * R, block * d + (h + 1) * R)
                out[b, t, ch] += scale * w[b, t, h, j] * v[b, s, h * R : (h + 1) * R]
    return out


CASES = [((3, 15), "gate"), ((3, 15), "concat"), ((5,), "gate"), ((1, 3, 7), "gate"), ((1,), "gate")]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("kernels", "mix"), CASES)
def test_band_unfold_and_incremental_paths_agree(kernels, mix, causal, device):
    conv = _conv(kernels, causal, kernel_mix=mix).to(device).eval()
    for length in (1, 4, 19):  # shorter and longer than the widest kernel
        v = _v(length=length, seed=length).to(device)
        with torch.no_grad():
            band, unfold = conv(v, path="band"), conv(v, path="unfold")
            torch.testing.assert_close(band, unfold, atol=1e-6, rtol=0)
            assert band.shape == (3, length, conv.outputs * D)
            if causal:
                # step-by-step sums the taps in another order: fp32 rounding, relative 1e-5
                torch.testing.assert_close(_steps(conv, v, [1] * length), band, atol=1e-6, rtol=1e-5)
                chunks = [length] if length < 3 else [2, 1, length - 3]  # a prefix, then steps
                torch.testing.assert_close(_steps(conv, v, chunks), band, atol=1e-6, rtol=1e-5)


def test_paths_agree_in_training_mode_with_the_same_weight_dropout_draws(device):
    conv = _conv((3, 15), causal=True, weight_dropout=0.3).to(device).train()
    v = _v(length=9).to(device)
    torch.manual_seed(1)
    band = conv(v, path="band")
    torch.manual_seed(1)
    unfold = conv(v, path="unfold")
    torch.testing.assert_close(band, unfold, atol=1e-6, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("kernels", "mix"), [((3, 15), "gate"), ((3, 5), "concat"), ((7,), "gate")])
def test_module_equals_explicit_loop_reference(kernels, mix, causal, device):
    conv = _conv(kernels, causal, kernel_mix=mix).double().eval()
    v = _v(batch=2, length=9).double()
    with torch.no_grad():
        expected = _naive(conv, v)  # the loops on the CPU; the module on `device` (float64 either way)
        conv, v = conv.to(device), v.to(device)
        for path in ("band", "unfold"):
            torch.testing.assert_close(conv(v, path=path).cpu(), expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("path", ["band", "unfold"])
def test_causal_output_ignores_future_inputs(path):
    conv = _conv((3, 15), causal=True).eval()
    v = _v(length=12)
    t = 5
    perturbed = v.clone()
    perturbed[:, t + 1 :] += 10 * torch.randn_like(perturbed[:, t + 1 :])
    with torch.no_grad():
        a, b = conv(v, path=path), conv(perturbed, path=path)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


def test_centred_output_sees_both_sides():
    conv = _conv((5,), causal=False).eval()
    v = _v(length=10)
    for shift in (-2, 2):  # the taps at t-2 and t+2 are inside the kernel, t+3 is not
        perturbed = v.clone()
        perturbed[:, 5 + shift] += 1.0
        with torch.no_grad():
            assert not torch.allclose(conv(v)[:, 5], conv(perturbed)[:, 5])
    perturbed = v.clone()
    perturbed[:, 8] += 1.0
    with torch.no_grad():
        assert torch.equal(conv(v)[:, 5], conv(perturbed)[:, 5])


@pytest.mark.parametrize("path", ["band", "unfold"])
def test_masked_padding_does_not_reach_real_tokens(path):
    conv = _conv((3, 15)).eval()
    real = _v(batch=1, length=6)
    outputs = []
    for pad in (0, 3, 11):
        v = torch.cat([real, 100 * torch.randn(1, pad, D)], dim=1)  # garbage at padded positions
        mask = torch.arange(6 + pad)[None, :] >= 6
        with torch.no_grad():
            outputs.append(conv(v, padding_mask=mask, path=path)[:, :6])
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0], atol=1e-6, rtol=0)

    leaky = _conv((3, 15), mask_padding=False).eval()  # the reference's default: padding leaks
    leaky.load_state_dict(conv.state_dict())
    v = torch.cat([real, 100 * torch.randn(1, 3, D)], dim=1)
    mask = torch.arange(9)[None, :] >= 6
    with torch.no_grad():
        assert not torch.allclose(leaky(v, padding_mask=mask)[:, :6], outputs[0], atol=1e-3)


def test_kernels_are_normalised_per_position_and_head():
    conv = _conv((3, 15, 7))
    v = _v()
    for w, k in zip(conv.normalized_kernels(v), conv.kernel_sizes, strict=True):
        assert w.shape == (3, 11, H, k)
        assert bool((w >= 0).all())
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 11, H))
    with torch.no_grad():  # the gated mixture of normalised kernels is normalised too (eval: no dropout)
        mixed = conv.eval().mixed_kernels(v)
    torch.testing.assert_close(mixed.sum(-1), torch.ones(3, 11, 1, H))


def test_gate_is_softmax_of_g_and_mixes_single_kernel_outputs():
    conv = _conv((3, 15)).eval()
    gate = torch.softmax(conv.gate.detach(), 0)
    torch.testing.assert_close(conv.gate_weights().detach(), gate)
    metrics = conv.training_metrics()
    assert list(metrics) == ["gate.k3", "gate.k15"]
    torch.testing.assert_close(torch.tensor(list(metrics.values())), gate)

    singles = []
    blocks = conv.kernel_proj.weight.detach().split([H * 3, H * 15])
    for k, block in zip((3, 15), blocks, strict=True):
        single = DynamicConv(D, H, [k], causal=False).eval()
        with torch.no_grad():
            single.kernel_proj.weight.copy_(block)
        singles.append(single)
    v = _v()
    with torch.no_grad():
        expected = gate[0] * singles[0](v) + gate[1] * singles[1](v)
        torch.testing.assert_close(conv(v), expected, atol=1e-6, rtol=0)
        concat = _conv((3, 15), kernel_mix="concat").eval()
        concat.kernel_proj.weight.copy_(conv.kernel_proj.weight)
        torch.testing.assert_close(concat(v), torch.cat([s(v) for s in singles], -1), atol=1e-6, rtol=0)


def test_weight_dropout_is_dropconnect_on_normalised_kernels_and_identity_in_eval():
    p = 0.4
    conv = _conv((5,), weight_dropout=p)
    v = _v()
    (w,) = conv.normalized_kernels(v)
    torch.manual_seed(3)
    dropped = conv.train().mixed_kernels(v)[:, :, 0]  # [B, L, H, K]
    ratio = dropped / w
    kept = ratio != 0
    assert 0.3 < kept.float().mean() < 0.9
    torch.testing.assert_close(ratio[kept], torch.full_like(ratio[kept], 1 / (1 - p)))
    torch.testing.assert_close(conv.eval().mixed_kernels(v)[:, :, 0], w)
    assert torch.equal(conv(v), conv(v))


def test_init_xavier_blocks_gate_uniform_and_gate_without_weight_decay():
    conv = DynamicConv(32, 4, [3, 15], causal=False)
    torch.testing.assert_close(conv.gate.detach(), torch.full((2,), 0.5))
    for block, k in zip(conv.kernel_proj.weight.detach().split([4 * 3, 4 * 15]), (3, 15), strict=True):
        bound = (6 / (32 + 4 * k)) ** 0.5
        assert block.abs().max() <= bound and block.abs().max() > 0.8 * bound
    torch_init = DynamicConv(32, 4, [3, 15], causal=False, kernel_init="torch")
    assert torch_init.kernel_proj.weight.abs().max() <= 32**-0.5
    (group,) = conv.parameter_groups()
    assert group.weight_decay == 0.0 and group.params == [conv.gate]
    single = DynamicConv(32, 4, [3], causal=False)
    assert single.gate is None and single.parameter_groups() == [] and single.training_metrics() == {}


def test_band_matrix_places_kernels_on_diagonals():
    w = torch.randn(2, 6, 3)
    for left in (0, 1, 2):
        band = band_matrix(w, left)
        expected = torch.zeros(2, 6, 6)
        for t, j in itertools.product(range(6), range(3)):
            if 0 <= t + j - left < 6:
                expected[:, t, t + j - left] = w[:, t, j]
        assert torch.equal(band, expected)


def test_rolling_window_is_reordered_with_the_state():
    conv = _conv((3, 5), causal=True).eval()
    v = _v(length=6)
    order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        state = DecoderState()
        first = [conv(v[:, t : t + 1], cache=state.view("c")) for t in range(3)]
        assert state.tensors["c.window"].shape == (3, 4, D)
        state.reorder(order)
        rest = [conv(v[:, t : t + 1], cache=state.view("c")) for t in range(3, 6)]
        expected = conv(torch.cat([v[order, :3], v[:, 3:]], dim=1))
    assert len(first) == 3
    torch.testing.assert_close(torch.cat(rest, 1), expected[:, 3:], atol=1e-6, rtol=0)


@pytest.mark.parametrize("sizes", [[], [4], [3, 0], [3, 3], [-1]])
def test_bad_kernel_sizes_are_rejected(sizes):
    with pytest.raises(ValueError):
        check_kernel_sizes(sizes)
    with pytest.raises(ValueError):
        DynamicConv(D, H, sizes, causal=False)


def test_incremental_needs_a_causal_conv():
    with pytest.raises(ValueError, match="causal"):
        _conv((3,), causal=False)(_v(length=1), cache=DecoderState().view("c"))
