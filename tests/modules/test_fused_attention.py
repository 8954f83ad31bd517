"""The fused decoder-step attention (modules/fused_attention.py) against PyTorch's SDPA on the same values
gathered by hand, the ancestor table a DecoderState keeps for it, and a decoding copy with the kernels against
the same copy composing its attention of PyTorch operations (every layer kind, beam search with reorders and
dropped sentences)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from multibranch import cpu_kernels
from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference.beam import beam_search
from multibranch.inference.precision import for_decoding
from multibranch.modules import fused_attention
from multibranch.modules.packed_linear import onednn_supported
from multibranch.modules.state import DecoderState
from tests.helpers.layer_kinds import both_sides
from tests.helpers.models import noisy_model

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.usefixtures("cpu_kernels_built"),
]
H, D = 3, 8  # heads, head width


def _sdpa_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Reference: q [R, H*D], k/v [R, S, H*D] (each row's own keys), mask [R, S] True = attend -> [R, H*D]."""
    R, S = k.shape[:2]
    heads = lambda t, n: t.reshape(R, n, H, D).transpose(1, 2)  # noqa: E731  [R, H, n, D]
    attn_mask = None if mask is None else mask[:, None, None, :]
    out = F.scaled_dot_product_attention(heads(q, 1).double(), heads(k, S).double(), heads(v, S).double(),
                                         attn_mask=attn_mask)
    return out.transpose(1, 2).reshape(R, H * D).float()


def _strided_rows(rows: int, g: torch.Generator) -> torch.Tensor:
    """[rows, H*D] as a view into a wider tensor (the way the kernels get slices of a fused projection)."""
    return torch.randn(rows, 3 * H * D, generator=g)[:, H * D : 2 * H * D]


def test_history_attention_reads_every_step_at_the_rows_of_the_ancestor_table():
    g = torch.Generator().manual_seed(0)
    step_rows = [2, 10, 10, 7, 7]  # step 0: one row per sentence; then hypotheses; then some sentences done
    keys = [_strided_rows(n, g) for n in step_rows]
    values = [_strided_rows(n, g) for n in step_rows]
    R = step_rows[-1]
    ancestors = torch.stack([torch.randint(0, n, (R,), generator=g) for n in step_rows], dim=1)  # [R, L]
    ancestors[:, -1] = torch.arange(R)
    q = _strided_rows(R, g)
    got = fused_attention.history_attention(q, keys, values, ancestors, H)
    own_k = torch.stack([keys[s][ancestors[:, s]] for s in range(len(keys))], dim=1)  # [R, L, H*D]
    own_v = torch.stack([values[s][ancestors[:, s]] for s in range(len(values))], dim=1)
    torch.testing.assert_close(got, _sdpa_rows(q, own_k, own_v), rtol=1e-5, atol=1e-5)
    assert got.shape == (R, H * D) and got.is_contiguous()


def test_history_attention_of_one_step_is_the_value_itself():
    """A single key: softmax weight 1, so the output is the value row exactly (hand-computed case)."""
    g = torch.Generator().manual_seed(1)
    k, v, q = (torch.randn(4, H * D, generator=g) for _ in range(3))
    got = fused_attention.history_attention(q, [k], [v], torch.arange(4)[:, None], H)
    torch.testing.assert_close(got, v, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("groups", [1, 4])
def test_memory_attention_shares_a_memory_row_between_groups_and_skips_padding(groups):
    g = torch.Generator().manual_seed(2)
    b, S = 3, 6
    kv = torch.randn(b, S, 2, H * D, generator=g)
    k, v = kv[:, :, 0], kv[:, :, 1]  # [b, S, H*D] views, as the decoder caches them
    padding = torch.zeros(b, S, dtype=torch.bool)
    padding[1, 4:] = True
    padding[2, 1:] = True  # a single real position
    kv[1, 4:, 0] = 1e3  # padded keys whose scores would dwarf the real ones (and overflow exp if not skipped)
    q = _strided_rows(b * groups, g)
    got = fused_attention.memory_attention(q, k, v, padding, H)
    expand = lambda t: t.repeat_interleave(groups, dim=0)  # noqa: E731  each row's own memory
    expected = _sdpa_rows(q, expand(k), expand(v), expand(~padding))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2 * groups :], expand(v[2:, 0]))  # one position: its value exactly
    torch.testing.assert_close(fused_attention.memory_attention(q, k, v, None, H),
                               _sdpa_rows(q, expand(k), expand(v)), rtol=1e-5, atol=1e-5)


def test_kernels_refuse_inputs_they_cannot_read():
    k = torch.randn(2, H * D)
    with pytest.raises(RuntimeError, match="not a row of step 0"):
        fused_attention.history_attention(k, [k], [k], torch.tensor([[0], [2]]), H)
    with pytest.raises(RuntimeError, match="float32"):
        fused_attention.history_attention(k.double(), [k], [k], torch.tensor([[0], [1]]), H)
    with pytest.raises(RuntimeError, match="cannot share"):
        fused_attention.memory_attention(torch.randn(3, H * D), torch.randn(2, 4, H * D), torch.randn(2, 4, H * D),
                                         None, H)


def test_ancestor_table_follows_reorders_and_sentence_drops():
    state = DecoderState()
    rows = lambda n: torch.zeros(n, 1)  # noqa: E731
    _, _, table = state.extend_history("a", rows(2), rows(2))  # step 0: 2 sentences, one row each
    state.extend_history("b", rows(2), rows(2))
    assert table.tolist() == [[0], [1]]
    state.step = 1
    state.reorder_within_sentences(torch.tensor([0, 0, 1, 1]))  # fan out to 2 hypotheses a sentence
    _, _, table = state.extend_history("a", rows(4), rows(4))
    assert table.tolist() == [[0, 0], [0, 1], [1, 2], [1, 3]]
    keys, _, again = state.extend_history("b", rows(4), rows(4))  # another layer, same step: the same table
    assert again is table and len(keys) == 2
    state.step = 2
    state.reorder(torch.tensor([3, 2]), sources=torch.tensor([1]))  # sentence 0 done; sentence 1's rows swap
    _, _, table = state.extend_history("a", rows(2), rows(2))
    assert table.tolist() == [[1, 3, 0], [1, 2, 1]]
    state.step = 3
    with pytest.raises(RuntimeError, match="extended at every step"):
        state.extend_history("b", rows(2), rows(2))  # "b" skipped step 2
    with pytest.raises(RuntimeError, match="extended at every step"):
        state.extend_history("c", rows(2), rows(2))  # a history cannot start late


# ---- a decoding copy with the kernels against the same copy composing its attention -------------------------

VOCAB, BOS, EOS = 40, 2, 3


KINDS = {
    "standard": {},
    "mat": both_sides({"kind": "transformer", "attention_branches": 2, "ffn_branches": 2}),
    "weighted": both_sides({"kind": "weighted"}),
    "muse": both_sides({"kind": "muse"}),
    "mute-relative": {"norm": "pre", "relative_positions": 4, "encoder": {"kind": "mute"},
                      "decoder": {"kind": "transformer"}},
}


def _model(**overrides) -> torch.nn.Module:
    return noisy_model(VOCAB, 0.3, 5, **overrides)


def _composed(model: torch.nn.Module) -> torch.nn.Module:
    """A decoding copy of `model` that composes its attention of PyTorch operations (no fused kernels)."""
    composed = for_decoding(model, "fp32")
    for module in composed.modules():
        if getattr(module, "fused", False):
            module.fused = False
    return composed


@pytest.mark.skipif(not onednn_supported(), reason="decoding copies are packed for oneDNN")
@pytest.mark.parametrize("name", list(KINDS))
def test_fused_decoding_copy_searches_as_the_composed_one(name):
    """Beam search (reorders within sentences, sentences leaving the batch at different steps): the same
    hypotheses and scores with and without the kernels; MUTE's relative positions keep the composed path."""
    model = _model(**KINDS[name])
    packed, composed = for_decoding(model, "fp32"), _composed(model)
    fused_modules = [m for m in packed.modules() if getattr(m, "fused", False)]
    assert fused_modules and not any(getattr(m, "fused", False) for m in composed.modules())
    kinds = {type(m).__name__ for m in fused_modules}
    assert "ParallelAttention" in kinds and ("Residual" in kinds or name == "muse")  # MUSE sums its own branches
    g = torch.Generator().manual_seed(6)
    src = torch.randint(4, VOCAB, (5, 9), generator=g)
    src[1, 4:] = 0
    src[3, 2:] = 0
    src[:, -1:] = torch.where(src[:, -1:] == 0, 0, EOS)
    calls = []
    original = fused_attention.history_attention

    def counting(*args):
        calls.append(1)
        return original(*args)

    fused_attention.history_attention = counting
    try:
        got = beam_search(packed, src, DecodeConfig(beam=4, max_len_a=1.0, max_len_b=6), nbest=4)
    finally:
        fused_attention.history_attention = original
    expected = beam_search(composed, src, DecodeConfig(beam=4, max_len_a=1.0, max_len_b=6), nbest=4)
    assert bool(calls) == (name != "mute-relative")  # relative positions: the composed path
    for mine, theirs in zip(got, expected, strict=True):
        assert [h.tokens for h in mine] == [h.tokens for h in theirs]
        torch.testing.assert_close(torch.tensor([h.score for h in mine]), torch.tensor([h.score for h in theirs]),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not onednn_supported(), reason="decoding copies are packed for oneDNN")
def test_without_the_kernels_a_decoding_copy_composes_its_attention(monkeypatch):
    """Where the extension cannot be built (`kernels()` None), decoding runs as before, same result."""
    packed = for_decoding(_model(), "fp32")
    src = torch.randint(4, VOCAB, (2, 7), generator=torch.Generator().manual_seed(7))
    with_kernels = beam_search(packed, src, DecodeConfig(beam=3))
    monkeypatch.setattr(cpu_kernels, "kernels", lambda: None)
    monkeypatch.setattr(fused_attention, "history_attention", None)  # would fail if called
    without = beam_search(packed, src, DecodeConfig(beam=3))
    assert [[h.tokens for h in hyps] for hyps in without] == [[h.tokens for h in hyps] for hyps in with_kernels]


@pytest.mark.skipif(not onednn_supported(), reason="decoding copies are packed for oneDNN")
def test_a_history_state_refuses_a_step_the_kernels_cannot_take():
    packed = for_decoding(_model(), "fp32")
    src = torch.randint(4, VOCAB, (2, 7), generator=torch.Generator().manual_seed(8))
    enc, state = packed.encode(src), DecoderState()
    packed.decode_step(torch.full((2, 1), BOS), enc, state)
    layer = packed.decoder.layers[0]
    with pytest.raises(RuntimeError, match="kept for the fused kernels"):
        layer.self_attn(torch.randn(2, 1, 24), cache=state.view("decoder.0").view("self_attn"), need_weights=True)


def test_add_layer_norm_is_torchs_layer_norm_of_the_sum():
    """The post-norm residual kernel (csrc/layer_norm.cpp) against torch.layer_norm in float64."""
    g = torch.Generator().manual_seed(9)
    x, y = torch.randn(5, 3, 40, generator=g) * 3, torch.randn(5, 3, 40, generator=g)
    weight, bias = torch.randn(40, generator=g), torch.randn(40, generator=g)
    got = cpu_kernels.kernels().add_layer_norm(x, y, weight, bias, 1e-5)
    expected = F.layer_norm((x + y).double(), (40,), weight.double(), bias.double(), 1e-5)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="of x's shape"):
        cpu_kernels.kernels().add_layer_norm(x, y[:, :2], weight, bias, 1e-5)
