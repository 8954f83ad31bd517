"""AutoShuffle (docs/papers.md#mute-autoshuffle-normalisation): normalisation, penalty, sequential fusion,
hooks, load, rounding."""

from __future__ import annotations

import itertools
import sys

import pytest
import torch

from multibranch.hooks import ModuleHooks
from multibranch.modules.autoshuffle import (
    AutoShuffle,
    fusion_coefficients,
    hard_permutation,
    normalise_shuffle,
    permutation_penalty,
    round_autoshuffles_,
    sequential_fusion,
)


def test_normalised_matrices_are_nonnegative_with_unit_column_sums():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        m = normalise_shuffle(torch.randn(4, 4, generator=g) * 3)
        assert (m >= 0).all()
        torch.testing.assert_close(m.sum(0), torch.ones(4))
    assert AutoShuffle(5).is_normalised()


def test_normalisation_order_is_rows_then_columns():
    m = torch.rand(4, 4) + 0.1
    rows = m / m.sum(1, keepdim=True)
    torch.testing.assert_close(normalise_shuffle(m), rows / rows.sum(0, keepdim=True))
    m[1] = -1.0  # a row with nothing left after clamping, and a zero column
    m[:, 2] = -1.0
    out = normalise_shuffle(m)
    assert torch.isfinite(out).all() and (out >= 0).all()
    torch.testing.assert_close(out.sum(0), torch.ones(4))


def test_penalty_is_zero_on_every_permutation_matrix():
    eye = torch.eye(4)
    for perm in itertools.permutations(range(4)):
        assert permutation_penalty(eye[list(perm)]).item() == pytest.approx(0.0, abs=1e-6)


def test_penalty_is_positive_on_non_permutation_doubly_stochastic_matrices():
    eye = torch.eye(4)
    perms = [eye[list(p)] for p in itertools.permutations(range(4))]
    g = torch.Generator().manual_seed(1)
    candidates = [torch.full((4, 4), 0.25), 0.5 * perms[0] + 0.5 * perms[5], 0.9 * perms[3] + 0.1 * perms[17]]
    for _ in range(20):  # random points of the Birkhoff polytope
        weights = torch.rand(len(perms), generator=g)
        candidates.append(sum(w * p for w, p in zip(weights / weights.sum(), perms)))
    for m in candidates:
        torch.testing.assert_close(m.sum(0), torch.ones(4))
        torch.testing.assert_close(m.sum(1), torch.ones(4))
        assert permutation_penalty(m).item() > 1e-3


def test_penalty_is_fp32_with_gradient():
    shuffle = AutoShuffle(3).to(torch.bfloat16)
    p = shuffle.penalty()
    assert p.dtype == torch.float32
    p.backward()
    assert shuffle.weight.grad is not None


def test_identity_order_fusion_is_weighted_cumulative_means():
    units = torch.randn(4, 2, 3, 5)
    w = torch.randn(4)
    expected = sum(w[j] * units[: j + 1].mean(0) for j in range(4))
    torch.testing.assert_close(sequential_fusion(units, torch.eye(4), w), expected)
    shuffle = AutoShuffle(4)
    with torch.no_grad():
        shuffle.weight.copy_(torch.eye(4))
    torch.testing.assert_close(shuffle(units, w), expected)


def test_fusion_coefficients_equal_the_explicit_permute_accumulate_fuse():
    units = torch.randn(4, 2, 3, 5, dtype=torch.float64)
    w = torch.randn(4, dtype=torch.float64)
    m = normalise_shuffle(torch.rand(4, 4, dtype=torch.float64))
    explicit = sequential_fusion(units, m, w)
    coefficient_form = torch.einsum("i,ibsd->bsd", fusion_coefficients(m, w), units)
    torch.testing.assert_close(coefficient_form, explicit)
    perm = torch.eye(4, dtype=torch.float64)[[2, 0, 3, 1]]  # G_j = F_{p(j)}
    order = perm.argmax(0)
    torch.testing.assert_close(sequential_fusion(units, perm, w), sequential_fusion(units[order], torch.eye(4, dtype=torch.float64), w))


def test_normalised_after_every_optimizer_step_through_the_module_hooks():
    shuffle = AutoShuffle(4)
    hooks = ModuleHooks(shuffle)
    opt = torch.optim.SGD(shuffle.parameters(), lr=0.5)
    for _ in range(3):
        units = torch.randn(4, 2, 3, 5)
        (shuffle(units, torch.randn(4)).pow(2).sum() + 10 * shuffle.penalty()).backward()
        opt.step()
        opt.zero_grad()
        assert not shuffle.is_normalised(), "the raw step leaves the feasible set"
        hooks.after_optimizer_step()
        assert shuffle.is_normalised()


def test_normalised_after_loading_an_unnormalised_state_and_exact_otherwise():
    shuffle = AutoShuffle(4)
    raw = torch.randn(4, 4)
    shuffle.load_state_dict({"weight": raw})
    assert shuffle.is_normalised()
    torch.testing.assert_close(shuffle.weight.detach(), normalise_shuffle(raw))
    wrapper = torch.nn.Sequential(AutoShuffle(4))  # also when loaded as a submodule
    wrapper.load_state_dict({"0.weight": raw})
    assert wrapper[0].is_normalised()
    saved = AutoShuffle(4).state_dict()
    fresh = AutoShuffle(4)
    fresh.load_state_dict(saved)
    assert torch.equal(fresh.weight, saved["weight"]), "a normalised state loads bit-for-bit"


def test_penalty_enters_the_loss_with_the_configured_weight():
    model = torch.nn.ModuleList([AutoShuffle(4, penalty_weight=0.5), AutoShuffle(4, penalty_weight=0.5)])
    losses = ModuleHooks(model).extra_losses()
    assert set(losses) == {"autoshuffle"}
    expected = 0.5 * (model[0].penalty() + model[1].penalty())
    torch.testing.assert_close(losses["autoshuffle"], expected)
    losses["autoshuffle"].backward()
    probe = AutoShuffle(4)
    with torch.no_grad():
        probe.weight.copy_(model[0].weight)
    probe.penalty().backward()
    torch.testing.assert_close(model[0].weight.grad, 0.5 * probe.weight.grad)
    assert AutoShuffle(4, penalty_weight=0.0).extra_losses() == {}


def test_per_token_sum_reduction_reproduces_the_reference_scale():
    shuffle = AutoShuffle(4, penalty_weight=1.0, penalty_reduction="per_token_sum")
    value = shuffle.extra_losses(update_tokens=16384.0, world_size=4)["autoshuffle"]
    torch.testing.assert_close(value, shuffle.penalty() * 4 / 16384.0)
    with pytest.raises(RuntimeError, match="update_tokens"):
        shuffle.extra_losses()


def test_excluded_from_weight_decay():
    shuffle = AutoShuffle(4)
    (group,) = shuffle.parameter_groups()
    assert group.weight_decay == 0.0 and group.params == [shuffle.weight]


def test_hard_permutation_rounding():
    # scipy is in the `test` extra, so this runs in CI (no importorskip: a missing scipy fails here)
    m = normalise_shuffle(torch.eye(4)[[1, 3, 0, 2]] + 0.1 * torch.rand(4, 4))
    assert torch.equal(hard_permutation(m), torch.eye(4)[[1, 3, 0, 2]])
    # row-wise argmax would pick column 0 twice; the best assignment is the off-diagonal one (0.8 + 0.85)
    conflict = torch.tensor([[0.9, 0.8], [0.85, 0.1]])
    assert torch.equal(hard_permutation(conflict), torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    model = torch.nn.ModuleList([AutoShuffle(4), torch.nn.Linear(2, 2), AutoShuffle(3)])
    assert round_autoshuffles_(model) == 2
    for shuffle in (model[0], model[2]):
        assert shuffle.is_normalised() and permutation_penalty(shuffle.weight).item() == pytest.approx(0.0, abs=1e-6)


def test_hard_permutation_without_scipy_raises_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy", None)
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)
    with pytest.raises(ImportError, match="needs scipy"):
        hard_permutation(torch.eye(3))
