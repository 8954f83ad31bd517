"""Head importance (|dNLL/d gate|, Michel et al.) and attention entropy, against independent computations."""

from __future__ import annotations

import math

import pytest
import torch

from multibranch.analysis.batches import teacher_forced_batches
from multibranch.analysis.entropy import attention_entropy
from multibranch.analysis.heads import attention_sites, gates_installed
from multibranch.config import from_dict
from multibranch.models import ModelConfig, build_model
from multibranch.pruning.importance import batch_nll, head_importance
from multibranch.tasks.translation.dataset import ParallelSplit
from tests.helpers.configs import tiny_model_dict

KINDS = {
    "standard": {},
    "mat": {"encoder": {"kind": "transformer", "attention_branches": 2},
            "decoder": {"kind": "transformer", "attention_branches": 2}},
    "weighted": {"encoder": {"kind": "weighted"}, "decoder": {"kind": "weighted"}},
    "mute": {"norm": "pre", "encoder": {"kind": "mute", "units": 2}},
    "mute-shared-attention": {"norm": "pre", "encoder": {"kind": "mute", "units": 2, "shared_attention": True}},
    "muse": {"encoder": {"kind": "muse"}, "decoder": {"kind": "muse"}},
}


def _model(kind: str = "standard", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Random weights; GELU so that the loss is smooth in the gates (ReLU kinks upset finite differences)."""
    model = build_model(from_dict(ModelConfig, tiny_model_dict(activation="gelu", **KINDS[kind])))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.to(dtype).eval()


def _split(n: int = 12, seed: int = 0) -> ParallelSplit:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (2, n), generator=gen)
    src = [torch.randint(4, 40, (int(k),), generator=gen).tolist() for k in lengths[0]]
    tgt = [torch.randint(4, 40, (int(k),), generator=gen).tolist() for k in lengths[1]]
    return ParallelSplit.from_sequences(src, tgt)


def _batches(model, n: int = 12, max_tokens: int = 40):
    return teacher_forced_batches(_split(n), model.config, max_tokens=max_tokens)


@pytest.mark.parametrize("kind", list(KINDS))
def test_importance_equals_finite_differences_of_the_nll(kind):
    """Unnormalised I_h = sum_batches |dNLL_b/dg_h| / tokens, with the derivative by central differences (fp64)."""
    model = _model(kind, torch.float64)
    batches = _batches(model)
    assert len(batches) >= 2
    tokens = sum(b.n_tgt_tokens for b in batches)
    sites = attention_sites(model)
    scores = head_importance(model, batches, normalize=False)
    eps = 1e-6
    for site in (sites[0], sites[-1]):
        for head in range(0, site.heads, 3):
            total = 0.0
            for batch in batches:
                losses = []
                for sign in (1.0, -1.0):
                    gate = torch.ones(site.heads, dtype=torch.float64)
                    gate[head] += sign * eps
                    with gates_installed(sites, {site.name: gate}), torch.no_grad():
                        losses.append(float(batch_nll(model, batch)))
                total += abs(losses[0] - losses[1]) / (2 * eps)
            assert float(scores[site.name][head]) == pytest.approx(total / tokens, rel=1e-4, abs=1e-7), (site.name, head)


@pytest.mark.parametrize("kind", list(KINDS))
def test_per_example_importance_equals_the_per_batch_one_over_batches_of_one_example(kind):
    """Per example, each row of the [B, H] gates carries one example's gradient: the same scores as the batch
    form computed one example at a time ([H] gates), and different from the batch form over the same batches."""
    model = _model(kind, torch.float64)
    split = _split(12)
    batches = teacher_forced_batches(split, model.config, max_tokens=60)
    assert min(len(b) for b in batches) >= 2
    singles = [batch for i in range(len(split))
               for batch in teacher_forced_batches(
                   ParallelSplit.from_sequences([split.src(i).tolist()], [split.tgt(i).tolist()]), model.config,
                   max_tokens=60)]
    assert len(singles) == 12 and sum(b.n_tgt_tokens for b in singles) == sum(b.n_tgt_tokens for b in batches)
    per_example = head_importance(model, batches, normalize=False, per_example=True)
    one_at_a_time = head_importance(model, singles, normalize=False)
    per_batch = head_importance(model, batches, normalize=False)
    for name, values in per_example.items():
        torch.testing.assert_close(values, one_at_a_time[name], rtol=1e-6, atol=1e-9)
        assert bool((values >= per_batch[name] * (1 - 1e-6)).all())  # |a| + |b| >= |a + b| (scores are fp32)
    assert any(not torch.allclose(per_example[n], per_batch[n]) for n in per_example)


def test_a_gate_per_example_must_match_the_head_count():
    site = attention_sites(_model())[0]
    with pytest.raises(ValueError, match="head gate of shape"):
        site.module.set_head_gate(torch.ones(3, site.heads + 1))
    with pytest.raises(ValueError, match="head gate of shape"):
        site.module.set_head_gate(torch.ones(2, 3, site.heads))


def test_normalised_importance_has_unit_norm_per_module():
    model = _model("mat")
    raw = head_importance(model, _batches(model), normalize=False)
    normalised = head_importance(model, _batches(model))
    for name, values in normalised.items():
        assert float(values.norm()) == pytest.approx(1.0, abs=1e-6)
        torch.testing.assert_close(values, raw[name] / raw[name].norm())


@pytest.mark.parametrize(("kind", "site_index", "head"), [("standard", -1, 2), ("mat", 0, 5), ("mute", 1, 6)])
def test_the_only_head_that_reaches_the_output_ranks_first(kind, site_index, head):
    """Zero the output-projection columns of every other head of one module: only `head` can matter."""
    model = _model(kind)
    site = attention_sites(model)[site_index]
    module = site.module
    with torch.no_grad():
        if hasattr(module, "out_proj"):
            weight = module.out_proj.weight.view(module.d_model, site.heads, -1)  # [d, H, d_k]
            keep = weight[:, head].clone()
            weight.zero_()
            weight[:, head] = keep
        else:  # MUTE units: out_weight [U, d, H*d_k], gate index = unit * H + h
            unit, h = divmod(head, module.heads)
            weight = module.out_weight.view(module.units, module.out_weight.shape[1], module.heads, -1)
            keep = weight[unit, :, h].clone()
            weight.zero_()
            weight[unit, :, h] = keep
    scores = head_importance(model, _batches(model))[site.name]
    expected = torch.zeros(site.heads)
    expected[head] = 1.0
    torch.testing.assert_close(scores, expected)


def test_uniform_attention_has_entropy_log_of_visible_keys():
    """Zero queries give uniform attention: entropy = log(#visible keys), averaged over real queries."""
    model = _model()
    sites = {s.key: s for s in attention_sites(model)}
    with torch.no_grad():
        for key in ("encoder_self.0", "decoder_self.0", "cross.1"):
            attn = sites[key].module
            attn.in_proj.weight[: attn.inner_dim].zero_()
            attn.in_proj.bias[: attn.inner_dim].zero_()
    split = _split()
    entropy = attention_entropy(model, _batches(model))
    src_len = [len(split.src(i)) + 1 for i in range(len(split))]  # + EOS
    tgt_len = [len(split.tgt(i)) + 1 for i in range(len(split))]
    enc = sum(n * math.log(n) for n in src_len) / sum(src_len)
    dec = sum(math.log(t + 1) for n in tgt_len for t in range(n)) / sum(tgt_len)
    cross = sum(m * math.log(n) for n, m in zip(src_len, tgt_len, strict=True)) / sum(tgt_len)
    for key, expected in (("encoder_self.0", enc), ("decoder_self.0", dec), ("cross.1", cross)):
        torch.testing.assert_close(entropy[sites[key].name], torch.full((4,), expected), rtol=1e-5, atol=1e-6)
    other = entropy[sites["encoder_self.1"].name]
    assert bool((other < enc - 1e-3).any()), "a trained-like (random) head is not uniform"
    assert all(s.module.attention_probe is None for s in sites.values())


def test_entropy_of_mute_units_is_per_unit_head():
    model = _model("mute")
    site = attention_sites(model)[0]
    entropy = attention_entropy(model, _batches(model))[site.name]
    assert entropy.shape == (8,) and bool((entropy > 0).all())
