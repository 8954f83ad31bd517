"""Simplex projection and the kappa/alpha weight module
(docs/papers.md#weighted-kappa-and-alpha-on-the-simplex)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from multibranch.modules.simplex import (
    BranchWeights,
    on_simplex,
    project_simplex,
    random_simplex,
    replace_branch_weights,
)
from multibranch.schedules import LRConfig


def _bisection_reference(v: list[float]) -> torch.Tensor:
    """Projection by bisection on theta (sum_i max(v_i - theta, 0) = 1 is decreasing in theta), float64."""
    x = torch.tensor(v, dtype=torch.float64)
    lo, hi = float(x.min()) - 1.0, float(x.max())
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if float((x - mid).clamp_min(0).sum()) > 1.0:
            lo = mid
        else:
            hi = mid
    return (x - 0.5 * (lo + hi)).clamp_min(0)


vectors = st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=1, max_size=16)


@settings(max_examples=200, deadline=None)
@given(vectors)
def test_projection_equals_bisection_reference_and_is_feasible(v):
    got = project_simplex(torch.tensor(v, dtype=torch.float64))
    torch.testing.assert_close(got, _bisection_reference(v), atol=1e-9, rtol=0)
    assert on_simplex(got, tol=1e-9)


@settings(max_examples=100, deadline=None)
@given(vectors, st.integers(0, 2**31 - 1))
def test_projection_is_the_closest_simplex_point(v, seed):
    x = torch.tensor(v, dtype=torch.float64)
    p = project_simplex(x)
    g = torch.Generator().manual_seed(seed)
    others = torch.stack([random_simplex(len(v), g).double() for _ in range(20)])  # [20, M]
    assert float((x - p).norm()) <= float((x[None] - others).norm(dim=-1).min()) + 1e-9


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_points_on_the_simplex_are_fixed(m):
    g = torch.Generator().manual_seed(m)
    points = [random_simplex(m, g) for _ in range(50)]
    corner = torch.zeros(m)
    corner[m // 2] = 1.0
    points.append(corner)
    if m > 2:  # a face: some exact zeros
        face = random_simplex(m, g)
        face[:2] = 0
        points.append(face / face.sum())
    for p in points:
        torch.testing.assert_close(project_simplex(p), p, atol=1e-7, rtol=0)


def test_projection_is_vectorised_over_leading_dims_and_keeps_dtype():
    v = torch.randn(3, 5, 7) * 3
    got = project_simplex(v)
    assert got.dtype == torch.float32 and got.shape == v.shape
    for i in range(3):
        for j in range(5):
            torch.testing.assert_close(got[i, j], project_simplex(v[i, j]))
    assert on_simplex(got)


def test_init_is_on_the_simplex_and_random():
    torch.manual_seed(1)
    w = BranchWeights(8)
    assert on_simplex(w.kappa.detach()) and on_simplex(w.alpha.detach())
    assert not torch.allclose(w.kappa, w.alpha)
    assert float(w.kappa.detach().min()) > 0


def test_optimizer_steps_then_projection_stay_on_the_simplex():
    torch.manual_seed(0)
    w = BranchWeights(6)
    opt = torch.optim.Adam(w.parameters(), lr=0.3)  # large steps leave the simplex every time
    target = torch.randn(6)
    left_simplex = 0
    for _ in range(25):
        kappa, alpha = w()
        loss = ((kappa * target).sum() - 2.0) ** 2 + (alpha * target.flip(0)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        left_simplex += not on_simplex(torch.stack([w.kappa, w.alpha]).detach())
        w.after_optimizer_step()
        for p in (w.kappa, w.alpha):
            assert float(p.detach().min()) >= 0.0
            assert abs(float(p.detach().sum()) - 1.0) <= 1e-6
    assert left_simplex > 0  # the projection had work to do
    assert int((w.alpha == 0).sum()) > 0  # linear pull on alpha: some branches die exactly


def test_projection_is_a_no_op_while_frozen():
    w = BranchWeights(4, freeze_last=10)
    with torch.no_grad():
        w.kappa.copy_(torch.tensor([0.5, 0.5, 0.5, -0.1]))
    w.on_update_start(step=89, warmup=None, total=100)  # update 90: not yet frozen
    assert not w.frozen
    w.on_update_start(step=90, warmup=None, total=100)  # update 91 = first of the last 10
    assert w.frozen
    before = w.kappa.detach().clone()
    w.after_optimizer_step()
    assert torch.equal(w.kappa.detach(), before)
    with pytest.warns(UserWarning, match="never train"):
        w.on_update_start(step=0, warmup=None, total=10)  # frozen from the first update
    assert w.frozen
    w.on_update_start(step=0, warmup=None, total=None)  # unknown total: never frozen
    w.after_optimizer_step()
    assert on_simplex(w.kappa.detach())


def test_parameter_group_declares_schedule_no_decay_and_freeze():
    lr = LRConfig(schedule="noam", warmup=400)
    w = BranchWeights(4, lr=lr, lr_d_model=512 / 6, freeze_last=10000, group="kappa_alpha.encoder")
    (spec,) = w.parameter_groups()
    assert spec.name == "kappa_alpha.encoder" and spec.lr is lr and spec.lr_d_model == pytest.approx(512 / 6)
    assert spec.weight_decay == 0.0 and spec.freeze_last == 10000
    assert [id(p) for p in spec.params] == [id(w.kappa), id(w.alpha)]


def test_training_metrics_report_effective_weights():
    w = BranchWeights(3)
    metrics = w.training_metrics()
    assert sorted(metrics) == sorted([f"{n}.{i}" for n in ("kappa", "alpha") for i in range(3)])
    assert [metrics[f"alpha.{i}"] for i in range(3)] == pytest.approx(w.alpha.tolist())
    assert all(isinstance(v, float) for v in metrics.values())


def test_softmax_ablation_normalises_without_projection():
    w = BranchWeights(5, normalization="softmax")
    kappa, alpha = w()
    assert on_simplex(kappa.detach()) and on_simplex(alpha.detach())
    with torch.no_grad():
        w.alpha.add_(3.0)  # free logits: shifting them changes nothing, and nothing projects them
    w.after_optimizer_step()
    assert float(w.alpha.detach().min()) > 1.0
    torch.testing.assert_close(w()[1], alpha)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_gating_keeps_the_k_largest_alpha_renormalised(k):
    w = BranchWeights(5, top_k=k)
    with torch.no_grad():
        w.alpha.copy_(torch.tensor([0.1, 0.3, 0.05, 0.35, 0.2]))
    _, alpha = w()
    kept = set(torch.tensor([0.1, 0.3, 0.05, 0.35, 0.2]).topk(k).indices.tolist())
    assert {i for i in range(5) if alpha[i] > 0} == kept
    assert abs(float(alpha.detach().sum()) - 1.0) < 1e-6


def test_test_time_replacement_uniform_and_seeded_random():
    model = torch.nn.ModuleList([BranchWeights(4), BranchWeights(4, normalization="softmax")])
    assert replace_branch_weights(model, "uniform") == 2
    for module in model:
        for value in module():
            torch.testing.assert_close(value, torch.full((4,), 0.25))
    replace_branch_weights(model, "random", seed=3)
    first = [torch.stack(module()).detach().clone() for module in model]
    for values in first:
        assert on_simplex(values)
    assert not torch.allclose(first[0], first[1]) and not torch.allclose(first[0][0], first[0][1])
    replace_branch_weights(model, "random", seed=3)
    assert all(torch.equal(a, torch.stack(m()).detach()) for a, m in zip(first, model, strict=True))
    replace_branch_weights(model, "random", seed=4)
    assert not torch.allclose(first[0], torch.stack(model[0]()).detach())
    with pytest.raises(ValueError, match="unknown replacement"):
        replace_branch_weights(model, "learned")  # type: ignore[arg-type]
