"""Attention-based alignments: the batched cross-attention of the chosen layer equals the analysis
extractor's map of each sentence alone (mean over heads), and the pairs are its argmax."""

from __future__ import annotations

import pytest
import torch

from multibranch.analysis.attention_maps import capture_maps
from multibranch.analysis.heads import attention_sites
from multibranch.config import from_dict
from multibranch.inference.alignment import cross_attention, hard_alignment, pharaoh
from multibranch.inference.ensemble import Ensemble
from multibranch.models import ModelConfig, build_model

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

PAD, EOS = 0, 3


def model_of(preset_layer: dict, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = from_dict(ModelConfig, {"d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 3,
                                  "src_vocab_size": 24, "tgt_vocab_size": 24, **preset_layer})
    m = build_model(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return m


MAT = {"decoder": {"kind": "transformer", "attention_branches": 3}}  # 3 branches x 2 heads: the mean of all 6
WEIGHTED = {"decoder": {"kind": "weighted"}}

SOURCES = [[5, 9, 11, 7], [8, 12], [6, 6, 10]]
TARGETS = [[4, 5, 6], [7, 8, 9, 10, 11], [12]]


def batch() -> torch.Tensor:
    return torch.tensor([s + [EOS] + [PAD] * (4 - len(s)) for s in SOURCES])


def reference_map(model, src: list[int], tgt: list[int], layer: int) -> torch.Tensor:
    """The analysis extractor's cross-attention of one sentence, mean over heads: [T + 1, S + 1]."""
    sites = [s for s in attention_sites(model) if s.role == "cross"]
    return capture_maps(model, src, tgt, sites)[sites[layer].name].mean(dim=0)


@pytest.mark.parametrize("layer", [-1, 0, 1])
@pytest.mark.parametrize("kind", [{}, MAT, WEIGHTED])
def test_batched_cross_attention_equals_each_sentence_alone(layer, kind):
    model = model_of(kind, 1)
    got = cross_attention(model, batch(), TARGETS, layer)
    for src, tgt, att in zip(SOURCES, TARGETS, got, strict=True):
        assert att.shape == (len(tgt) + 1, len(src) + 1)
        torch.testing.assert_close(att, reference_map(model, src, tgt, layer), atol=1e-5, rtol=0)


def test_default_layer_is_the_last_decoder_layer():
    model = model_of({}, 2)
    last = cross_attention(model, batch(), TARGETS)
    assert all(torch.equal(a, b) for a, b in zip(last, cross_attention(model, batch(), TARGETS, 2), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(last, cross_attention(model, batch(), TARGETS, 0), strict=True))


def test_hard_alignment_is_the_argmax_over_source_pieces_without_eos():
    att = torch.tensor([[0.1, 0.2, 0.7],   # target 0 -> the EOS column wins, but EOS is excluded: source 1
                        [0.6, 0.3, 0.1],   # target 1 -> source 0
                        [0.2, 0.5, 0.3],   # target 2 -> source 1
                        [0.0, 0.0, 1.0]])  # the EOS row: excluded
    assert hard_alignment(att, source_len=2, target_len=3) == [(1, 0), (0, 1), (1, 2)]
    assert pharaoh([(1, 0), (0, 1), (1, 2)]) == "1-0 0-1 1-2"
    assert hard_alignment(att, source_len=0, target_len=3) == []


def test_an_ensemble_aligns_with_the_mean_of_its_members_attention():
    members = [model_of({}, 1), model_of({}, 2)]
    got = cross_attention(Ensemble(members), batch(), TARGETS)
    singles = [cross_attention(m, batch(), TARGETS) for m in members]
    for b in range(len(TARGETS)):
        torch.testing.assert_close(got[b], (singles[0][b] + singles[1][b]) / 2)
