"""Graph-ready training (CUDA graphs, torch.compile(fullgraph=True)) for every layer kind.

- A training update of the model (the modules' `on_update_start`, a training forward, a loss over every
  position plus the modules' extra losses, backward, `after_optimizer_step`) reads no device value on the
  host: no `.item()`, no data-dependent branch, no operation whose output shape depends on the data.
- The training forward + loss compiles as one graph (`fullgraph=True`: a graph break raises), gives
  eager's loss, and follows a change of every scheduled rate without recompiling.
- The scheduled numbers a forward (or `after_optimizer_step`) reads live in 0-d device buffers changed in
  place: the same tensor object before and after `on_update_start`, with the new value, and the forward
  follows the buffer (not the Python value).
- A scheduled rate that is 0 right now computes exactly what no drop-branch / DropHead does, in training.
"""

from __future__ import annotations

import pytest
import torch

from multibranch.config import from_dict
from multibranch.hooks import ModuleHooks
from multibranch.models import ModelConfig, build_model
from multibranch.modules.bias_noise import BiasNoise
from multibranch.modules.simplex import BranchWeights
from multibranch.modules.structured_dropout import DropHead, PathDropout
from tests.helpers.host_reads import HostReads
from tests.helpers.layer_kinds import both_sides

VOCAB, PAD = 40, 0
BIASED = ["identity", "swap", "mask", "disorder"]
WARMUP, TOTAL = 3, 6  # the schedules' warm-up and planned updates in these tests


def _mat(rate, **layer) -> dict:
    return both_sides({"kind": "transformer", "attention_branches": 2, "ffn_branches": 2, "drop_branch": rate, **layer})


def _mute(switch, **layer) -> dict:
    return {"norm": "pre", "relative_positions": 4, "decoder": {"kind": "transformer"},
            "encoder": {"kind": "mute", "units": 4, "bias_modules": BIASED, "bias_switch": switch,
                        "fusion": "sequential", **layer}}


# case -> model overrides as a function of (rate, switch): the scheduled rate of drop-branch / DropHead and
# the MUTE bias switch
CASES = {
    "transformer": lambda r, s: {},
    "mat": lambda r, s: _mat(r),
    "mat-per-sample": lambda r, s: _mat(r, drop_branch_granularity="sample", branch_merge="mean_sq"),
    "mat-head-drop": lambda r, s: _mat(r, head_drop=True),
    "weighted": lambda r, s: both_sides({"kind": "weighted", "freeze_last": 2}),
    "weighted-self": lambda r, s: both_sides({"kind": "weighted", "decoder_branched": "self", "freeze_last": 2}),
    "mute-bias-sequential": lambda r, s: _mute(s),
    "mute-bias-one-mask": lambda r, s: _mute(s, mask_mode="one", fusion="weighted"),
    "muse": lambda r, s: both_sides({"kind": "muse", "kernel_sizes": [3, 5]}),
    "muse-simple": lambda r, s: both_sides({"kind": "muse", "conv": False}),
    "drophead": lambda r, s: {"drophead": {"rate": r}},
    "drophead-mat": lambda r, s: {"drophead": {"rate": r}, **_mat(r)},
}

# scheduled rates that move within the test's few updates: DropHead's V (0.3 at the start, 0 at the end of the
# warm-up, 0.3 at the end) and a switch from 0.5 to 1
V_RATE = {"schedule": "v", "rate": 0.3}
SWITCH = {"schedule": "linear", "start": 0.5, "end": 1.0}
# schedules at 0 at update 0 and not at update TOTAL (for the compile tests, which compare with eager at 0)
RISING_RATE = {"schedule": "linear", "start": 0.0, "end": 0.3}
RISING_SWITCH = {"schedule": "linear", "start": 0.0, "end": 1.0}


def _config(case: str, rate, switch, dropout: float) -> ModelConfig:
    values = {"d_model": 16, "heads": 4, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 1,
              "max_positions": 32, "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB, "dropout": dropout,
              "attention_dropout": dropout, "activation_dropout": dropout}
    values.update(CASES[case](rate, switch))
    for side in ("encoder", "decoder"):
        if values.get(side, {}).get("kind") == "muse":
            values[side] = {**values[side], "conv_weight_dropout": dropout, "input_dropout": dropout}
    return from_dict(ModelConfig, values)


def _model(case: str, rate=V_RATE, switch=SWITCH, dropout: float = 0.1) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(_config(case, rate, switch, dropout)).train()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Sources [3, 8] and decoder inputs [3, 6], rows of different lengths (right padding)."""
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, VOCAB, (3, 8), generator=g)
    src[1, 5:] = PAD
    src[2, 2:] = PAD
    prev = torch.randint(4, VOCAB, (3, 6), generator=g)
    prev[2, 3:] = PAD
    return src, prev


def _loss(model: torch.nn.Module, hooks: ModuleHooks, src: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """A loss over every position (cross-entropy of the logits of every decoder position, pads included, against
    fixed targets) plus the modules' extra losses. (The squared features would not do: the final LayerNorm makes
    their mean square ~1 whatever the input.)"""
    features = model(src, prev, features_only=True)  # [B, T, d]
    logits = model.logits(features).float()  # [B, T, V]
    targets = (prev * 7 + 1) % VOCAB  # [B, T]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    for value in hooks.extra_losses().values():
        loss = loss + value
    return loss


# ---- no host reads -------------------------------------------------------------------------------------------

def test_the_counter_sees_host_reads():
    x = torch.tensor([0.0, 1.0, 2.0])
    counter = HostReads()
    with counter:
        bool(x.any())
        float(x.sum())
        x[x > 0]  # noqa: B018
        x.nonzero_static(size=3)
        x.repeat_interleave(2)
        x[torch.tensor([2, 0])]  # noqa: B018
        x.repeat_interleave(torch.tensor([1, 2, 1]))
        torch.equal(x, x)
        x.nonzero()
    assert [found.split(" at ")[0] for found in counter.found] == [
        "_local_scalar_dense", "_local_scalar_dense", "index", "repeat_interleave", "equal", "nonzero"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_updates_read_nothing_back(case):
    """Three updates across the schedules' turns (DropHead's V at 0.3, 0, 0.3; the MUTE switch from 0.5 to 1;
    kappa/alpha frozen for the last one), on a padded batch: no host read anywhere."""
    model = _model(case)
    hooks = ModuleHooks(model)
    src, prev = _batch()
    params = [p for p in model.parameters() if p.requires_grad]
    counter = HostReads()
    with counter:
        for step in (0, WARMUP, TOTAL - 1):
            hooks.update_start(step, WARMUP, TOTAL)
            _loss(model, hooks, src, prev).backward()
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-0.01)
                        p.grad = None
            hooks.after_optimizer_step()
    assert counter.found == []
    frozen = [m.frozen for m in model.modules() if isinstance(m, BranchWeights)]
    assert frozen == [] or all(frozen), "the last update froze kappa/alpha"


# ---- torch.compile(fullgraph=True) ---------------------------------------------------------------------------

# every layer kind compiles in the default suite; these variants of a kind compile too (-m slow: ~2.5 s each)
VARIANTS = {"mat-per-sample", "weighted-self", "mute-bias-one-mask", "drophead-mat"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in VARIANTS else c
                                  for c in sorted(CASES)])
def test_the_training_forward_compiles_as_one_graph_and_follows_the_schedules(case):
    """With dropout off and the scheduled rates at 0 (update 0 of rising schedules): compiled = eager loss and
    gradients. Then the rates rise (update TOTAL): the same compiled graph runs them, without recompiling."""
    model = _model(case, RISING_RATE, RISING_SWITCH, dropout=0.0)
    hooks = ModuleHooks(model)
    src, prev = _batch()
    hooks.update_start(0, WARMUP, TOTAL)
    torch._dynamo.reset()
    compiled = torch.compile(lambda s, p: _loss(model, hooks, s, p), fullgraph=True, backend="aot_eager")

    eager = _loss(model, hooks, src, prev)
    eager.backward()
    eager_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    loss = compiled(src, prev)
    loss.backward()
    torch.testing.assert_close(loss, eager, atol=1e-5, rtol=1e-5)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == eager_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], atol=1e-5, rtol=1e-4, msg=name)

    hooks.update_start(TOTAL, WARMUP, TOTAL)  # rates 0.3, switch 1: new values in the same buffers
    model.zero_grad(set_to_none=True)
    with torch.compiler.set_stance("fail_on_recompile"):
        torch.manual_seed(1)
        raised = compiled(src, prev)
    raised.backward()
    assert torch.isfinite(raised)
    scheduled = any(isinstance(m, (PathDropout, DropHead, BiasNoise)) for m in model.modules())
    if scheduled:  # the new rates took effect inside the compiled graph
        assert not torch.equal(raised.detach(), eager.detach())
    torch._dynamo.reset()


# ---- scheduled numbers on the device -------------------------------------------------------------------------

def _buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The scheduled buffers of the model's modules, by module name and buffer."""
    names = {DropHead: "rate_value", PathDropout: "rate_value", BiasNoise: "switch_value", BranchWeights: "frozen_value"}
    return {f"{name}.{names[type(m)]}": getattr(m, names[type(m)]) for name, m in model.named_modules()
            if type(m) in names}


@pytest.mark.parametrize(("case", "kinds"), [
    ("drophead-mat", {DropHead, PathDropout}), ("mute-bias-sequential", {BiasNoise, DropHead}),
    ("weighted", {BranchWeights}),
])
def test_schedules_change_the_same_device_tensors_in_place(case, kinds):
    cfg = _config(case, V_RATE, SWITCH, 0.1)
    if case.startswith("mute"):
        cfg.drophead.rate = from_dict(type(cfg.drophead.rate), V_RATE)
    model = build_model(cfg)
    assert {type(m) for m in model.modules()} >= kinds
    hooks = ModuleHooks(model)
    hooks.update_start(0, WARMUP, TOTAL)
    before = _buffers(model)
    values = {k: v.clone() for k, v in before.items()}
    hooks.update_start(TOTAL - 1, WARMUP, TOTAL)  # DropHead 0.2, switch 11/12, kappa/alpha frozen
    after = _buffers(model)
    assert after.keys() == before.keys() and after
    for key, tensor in after.items():
        assert tensor is before[key], f"{key}: a new tensor (a captured graph would read the old one)"
        assert tensor.dim() == 0
        assert not torch.equal(tensor, values[key]), f"{key}: unchanged"
    for m in model.modules():  # the Python values (repr, metrics) agree with the buffers
        if isinstance(m, (DropHead, PathDropout)):
            assert m.rate_value.item() == pytest.approx(m.p)
        elif isinstance(m, BiasNoise):
            assert m.switch_value.item() == pytest.approx(m.switch.value)
        elif isinstance(m, BranchWeights):
            assert m.frozen_value.item() is m.frozen is True
    # not in the state dict (checkpoints unchanged), moved with the module
    assert not any(key.endswith(("rate_value", "switch_value", "frozen_value")) for key in model.state_dict())
    assert all(t.dtype == torch.float64 for t in _buffers(model.double()).values() if t.is_floating_point())
    assert all(t.device.type == "meta" for t in _buffers(model.to("meta")).values())


def test_forwards_read_the_device_rate_not_the_python_one():
    drop, heads = PathDropout(3, 0.5).train(), DropHead(4, 0.5).train()
    for module, rows in ((drop, 1), (heads, 64)):
        module.rate.value = 0.9  # a stale Python value: the forward must not read it
        module.rate_value.fill_(0.0)
        assert torch.equal(module(64, torch.device("cpu")), torch.ones(rows, module.paths))
    drop.per_sample = True
    drop.rate_value.fill_(0.5)
    assert 0.45 < (drop(4096, torch.device("cpu")) == 0).float().mean().item() < 0.55
    noise = BiasNoise(["identity", "mask"], 4, switch=0.5, mask_prob=1.0).train()
    n, pad = torch.randn(2, 5, 4), torch.zeros(2, 5, dtype=torch.bool)
    noise.switch_value.fill_(0.0)
    assert all(torch.equal(u, n) for u in noise(n, pad)), "switch 0: every unit reads n"
    noise.switch_value.fill_(1.0)
    assert not torch.equal(noise(n, pad)[1], n), "switch 1: the mask unit is masked"
    weights = BranchWeights(3, freeze_last=5)
    with torch.no_grad():
        weights.kappa.add_(1.0)  # off the simplex
    raw = weights.kappa.detach().clone()
    weights.frozen_value.fill_(True)
    weights.after_optimizer_step()
    assert torch.equal(weights.kappa.detach(), raw), "frozen: not projected"
    weights.frozen_value.fill_(False)
    weights.after_optimizer_step()
    assert weights.kappa.sum().item() == pytest.approx(1.0), "not frozen: projected"


@pytest.mark.parametrize("case", ["mat", "mat-per-sample", "mat-head-drop", "drophead", "drophead-mat"])
def test_a_scheduled_rate_at_zero_trains_exactly_like_no_structured_dropout(case):
    """The scales are computed (no branch on the rate) and are exactly 1: the same features bit for bit as a
    model built without drop-branch / DropHead, in training mode (dropout off, so nothing else is random)."""
    model = _model(case, RISING_RATE, RISING_SWITCH, dropout=0.0)
    ModuleHooks(model).update_start(0, WARMUP, TOTAL)
    assert any(isinstance(m, (PathDropout, DropHead)) for m in model.modules())
    plain = _model(case, 0.0, RISING_SWITCH, dropout=0.0)
    assert not any(isinstance(m, (PathDropout, DropHead)) for m in plain.modules())
    plain.load_state_dict(model.state_dict())
    src, prev = _batch()
    assert torch.equal(model(src, prev, features_only=True), plain(src, prev, features_only=True))


def test_a_switch_at_zero_trains_like_no_bias_noise():
    """MUTE's switch at 0 right now: every unit reads n (the unit axis is kept, so equal up to rounding)."""
    model = _model("mute-bias-sequential", RISING_RATE, RISING_SWITCH, dropout=0.0)
    ModuleHooks(model).update_start(0, WARMUP, TOTAL)
    plain = _model("mute-bias-sequential", RISING_RATE, 0.0, dropout=0.0)
    plain.load_state_dict(model.state_dict())
    src, prev = _batch()
    torch.testing.assert_close(model(src, prev, features_only=True), plain(src, prev, features_only=True),
                               atol=1e-6, rtol=1e-5)
