"""Head gates on every attention of every layer kind (docs/papers.md#drophead-head-gates): a gate of ones
changes nothing, masking equals removing the head's contribution computed independently."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from multibranch.analysis.heads import attention_sites, gates_installed, mask_gates
from multibranch.config import from_dict
from multibranch.models import ModelConfig, build_model
from multibranch.models.layers.mute import UnitSelfAttention
from multibranch.modules.attention import ParallelAttention
from tests.helpers.configs import tiny_model_dict

VOCAB = 40
PAD, BOS, EOS = 0, 2, 3

KINDS = {
    "standard": {},
    "mat": {"encoder": {"kind": "transformer", "attention_branches": 2, "ffn_branches": 2},
            "decoder": {"kind": "transformer", "attention_branches": 3}},
    "drophead": {"drophead": {"rate": {"rate": 0.3}}},
    "weighted": {"encoder": {"kind": "weighted"}, "decoder": {"kind": "weighted"}},
    "weighted-self": {"encoder": {"kind": "weighted"}, "decoder": {"kind": "weighted", "decoder_branched": "self"}},
    "mute": {"norm": "pre", "encoder": {"kind": "mute", "units": 3, "bias_modules": ["identity", "swap", "mask"]}},
    "mute-shared": {"norm": "pre", "encoder": {"kind": "mute", "units": 2, "shared_attention": True,
                                               "bias_modules": ["identity", "disorder"]}},
    "muse": {"encoder": {"kind": "muse", "kernel_sizes": [3, 5]}, "decoder": {"kind": "muse", "kernel_sizes": [3]}},
    "muse-simple": {"encoder": {"kind": "muse", "conv": False}, "decoder": {"kind": "muse", "conv": False}},
}
# kinds whose value projection feeds nothing but the attention (MUSE's conv shares V)
V_ONLY_KINDS = [k for k in KINDS if k != "muse"]


def _model(kind: str) -> torch.nn.Module:
    cfg = from_dict(ModelConfig, tiny_model_dict(**KINDS[kind]))
    model = build_model(cfg)
    with torch.no_grad():  # larger random weights (and nonzero biases) than the init
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(4, VOCAB, (3, 9))
    src[0, 6:] = PAD
    src[torch.arange(3), torch.tensor([5, 8, 8])] = EOS
    prev = torch.randint(4, VOCAB, (3, 7))
    prev[:, 0] = BOS
    return src, prev


def _value_rows(site_module, head: int) -> list[tuple[torch.Tensor, slice]]:
    """(tensor, row slice along its V block) pairs that make `head`'s value vectors zero."""
    if isinstance(site_module, ParallelAttention):
        dk, inner = site_module.head_dim, site_module.inner_dim
        rows = slice(2 * inner + head * dk, 2 * inner + (head + 1) * dk)
        return [(site_module.in_proj.weight, rows), (site_module.in_proj.bias, rows)]
    assert isinstance(site_module, UnitSelfAttention)
    unit, h = divmod(head, site_module.heads)
    d, dk = site_module.in_weight.shape[-1], site_module.head_dim
    rows = slice(2 * d + h * dk, 2 * d + (h + 1) * dk)
    return [(site_module.in_weight[unit], rows), (site_module.in_bias[unit], rows)]


def test_every_kind_exposes_a_gate_on_every_attention():
    expected_roles = {
        "standard": ["encoder_self"] * 2 + ["decoder_self", "cross"] * 2,
        "mute": ["encoder_self"] * 2 + ["decoder_self", "cross"] * 2,
        "weighted": ["encoder_self"] * 2 + ["decoder_self", "cross"] * 2,
    }
    for kind in KINDS:
        model = _model(kind)
        sites = attention_sites(model)
        assert [s.role for s in sites] == expected_roles.get(kind, expected_roles["standard"]), kind
        assert [s.layer for s in sites] == [0, 1, 0, 0, 1, 1]
        gated = [m for m in model.modules() if hasattr(m, "head_gate")]
        assert len(gated) == len(sites)
    mat = attention_sites(_model("mat"))
    assert [s.heads for s in mat] == [8, 8, 12, 12, 12, 12]  # N_a * M
    mute = attention_sites(_model("mute"))
    assert mute[0].heads == 12 and attention_sites(_model("mute-shared"))[0].heads == 4


@pytest.mark.parametrize("kind", list(KINDS))
def test_gates_of_one_change_nothing_bit_for_bit(kind):
    model = _model(kind)
    src, prev = _batch()
    sites = attention_sites(model)
    with torch.no_grad():
        plain = model(src, prev)
        with gates_installed(sites, {s.name: torch.ones(s.heads) for s in sites}):
            gated = model(src, prev)
        after = model(src, prev)
    assert torch.equal(plain, gated)
    assert torch.equal(plain, after)


@pytest.mark.parametrize("kind", list(KINDS))
def test_masking_every_head_of_a_module_equals_zeroing_its_output_weight(kind):
    """All heads masked: the module outputs only its W_O bias (MUSE: plus the conv part)."""
    model = _model(kind)
    src, prev = _batch()
    for site in attention_sites(model):
        reference = copy.deepcopy(model)
        ref_module = reference.get_submodule(site.name)
        with torch.no_grad():
            weight = ref_module.out_proj.weight if isinstance(ref_module, ParallelAttention) else ref_module.out_weight
            weight.zero_()
            expected = reference(src, prev)
            with gates_installed(attention_sites(model), mask_gates([site], [(site.name, h) for h in range(site.heads)])):
                masked = model(src, prev)
        torch.testing.assert_close(masked, expected, rtol=0, atol=1e-6, msg=f"{kind} {site.name}")


@pytest.mark.parametrize("kind", V_ONLY_KINDS)
def test_masking_one_head_equals_zeroing_its_values(kind):
    """Attention over zero value vectors is zero: the head's output slice is zero, nothing else changes."""
    model = _model(kind)
    src, prev = _batch()
    sites = attention_sites(model)
    gen = torch.Generator().manual_seed(1)
    for site in sites:
        head = int(torch.randint(site.heads, (1,), generator=gen))
        reference = copy.deepcopy(model)
        with torch.no_grad():
            for tensor, rows in _value_rows(reference.get_submodule(site.name), head):
                tensor[rows] = 0.0
            expected = reference(src, prev)
            with gates_installed(sites, mask_gates(sites, [(site.name, head)])):
                masked = model(src, prev)
            unmasked = model(src, prev)
        torch.testing.assert_close(masked, expected, rtol=1e-5, atol=1e-6, msg=f"{kind} {site.name} head {head}")
        assert not torch.allclose(masked, unmasked, atol=1e-4), "the head mattered"


def test_mat_module_masking_by_hand():
    """MAT attention (N_a=2, M=2): out = c * (heads with head h zeroed) W_O + c * sum_i b_O^i."""
    attn = ParallelAttention(8, heads=2, branches=2).eval()
    with torch.no_grad():
        attn.out_bias.normal_()
    x = torch.randn(2, 5, 8)
    heads, _ = attn.attend_heads(x)  # [B, H, L, d_k]
    zeroed = heads.clone()
    zeroed[:, 3] = 0.0
    by_hand = F.linear(zeroed.transpose(1, 2).reshape(2, 5, -1), attn.out_proj.weight) / 2 + attn.out_bias.sum(0) / 2
    attn.set_head_gate(torch.tensor([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(attn(x), by_hand)
    attn.set_head_gate(torch.zeros(4))
    torch.testing.assert_close(attn(x), (attn.out_bias.sum(0) / 2).expand(2, 5, 8))


def test_muse_conv_layer_masking_by_hand():
    """MUSE with conv: masking a head zeroes its slice of A in [A ; C] W_out; the conv part is untouched."""
    model = _model("muse")
    layer = model.encoder.layers[0].self_attn
    attn = layer.attn
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        q, k, v = attn.project_qkv(x)
        heads, _ = attn.attend_heads(x, qkv=(q, k, v))
        heads[:, 1] = 0.0
        values = v.transpose(1, 2).reshape(2, 6, -1)
        by_hand = F.linear(heads.transpose(1, 2).reshape(2, 6, -1), attn.out_proj.weight, attn.out_bias[0])
        by_hand = by_hand + layer.conv_out(layer.conv(values))
        attn.set_head_gate(torch.tensor([1.0, 0.0, 1.0, 1.0]))
        torch.testing.assert_close(layer(x), by_hand)


def test_gate_is_not_in_the_state_dict_and_is_differentiable():
    model = _model("mat")
    keys = set(model.state_dict())
    sites = attention_sites(model)
    gates = {s.name: torch.ones(s.heads, requires_grad=True) for s in sites}
    src, prev = _batch()
    with gates_installed(sites, gates):
        assert set(model.state_dict()) == keys
        model(src, prev).sum().backward()
    assert all(g.grad is not None and g.grad.abs().sum() > 0 for g in gates.values())
    assert all(s.module.head_gate is None for s in sites)
    with pytest.raises(ValueError, match="head gate of shape"):
        sites[0].module.set_head_gate(torch.ones(3))
