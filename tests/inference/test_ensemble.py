"""Ensembles: one member equals the model, two copies equal the model, and two different models
decode as a plain reference search over the mean of their full-forward distributions says."""

from __future__ import annotations

import copy

import pytest
import torch

from multibranch.config import from_dict
from multibranch.errors import CheckpointError
from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference.beam import beam_search, forced_scores, greedy_search
from multibranch.inference.ensemble import Ensemble
from multibranch.inference.precision import for_decoding
from multibranch.models import ModelConfig, build_model
from multibranch.modules.packed_linear import int8_supported

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

PAD, BOS, EOS = 0, 2, 3
CONFIG = {"d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 2, "src_vocab_size": 24,
          "tgt_vocab_size": 24, "output_bias": True, "positions": "learned", "max_positions": 16}


def random_model(seed: int, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_model(from_dict(ModelConfig, {**CONFIG, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
        model.output_bias[EOS] = 1.5
    return model


SRC = torch.tensor([[5, 9, 11, 7, EOS], [8, 12, EOS, PAD, PAD], [6, 6, 10, EOS, PAD]])


def hyps_of(result):
    return [[(h.tokens, h.score) for h in hyps] for hyps in result]


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("mean", ["prob", "log-prob"])
def test_one_member_and_two_copies_equal_the_model(beam, mean):
    model = random_model(1)
    alone = beam_search(model, SRC, DecodeConfig(beam=beam, max_len_b=6), nbest=beam)
    for members in ([model], [model, copy.deepcopy(model)]):
        ensemble = Ensemble(members, mean=mean)
        result = beam_search(ensemble, SRC, DecodeConfig(beam=beam, max_len_b=6), nbest=beam)
        assert [[h.tokens for h in s] for s in result] == [[h.tokens for h in s] for s in alone]
        for got, want in zip(result, alone, strict=True):
            assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)


def reference_greedy(models, src_row: list[int], steps: int, mean: str) -> list[int]:
    """Greedy decoding by full forwards (no caches): argmax of the members' combined distribution."""
    out: list[int] = []
    src = torch.tensor([src_row])
    for _ in range(steps):
        prev = torch.tensor([[BOS, *out]])
        dists = []
        for m in models:
            logits = m(src, prev)[0, -1].clone()
            logits[PAD] = logits[BOS] = float("-inf")
            dists.append(torch.log_softmax(logits, dim=-1))
        if mean == "prob":
            combined = torch.stack([d.exp() for d in dists]).mean(dim=0).log()
        else:
            combined = torch.stack(dists).mean(dim=0)
        token = int(combined.argmax())
        if token == EOS:
            return out
        out.append(token)
    return out


MAT = {"decoder": {"kind": "transformer", "attention_branches": 2}, "encoder": {"kind": "transformer",
                                                                             "attention_branches": 2}}


@pytest.mark.parametrize("mean", ["prob", "log-prob"])
@pytest.mark.parametrize("second", [{}, MAT])
def test_two_models_decode_as_the_reference_over_their_mean(mean, second):
    models = [random_model(1), random_model(2, **second)]
    ensemble = Ensemble(models, mean=mean)
    result = greedy_search(ensemble, SRC, DecodeConfig(max_len_a=0, max_len_b=8, min_len=0))
    for row, hyps in zip(SRC.tolist(), result, strict=True):
        ids = [t for t in row if t != PAD]
        assert hyps[0].tokens == reference_greedy(models, ids, 8, mean)
    singles = [greedy_search(m, SRC, DecodeConfig(max_len_a=0, max_len_b=8, min_len=0)) for m in models]
    assert hyps_of(result) not in [hyps_of(s) for s in singles]  # the ensemble is not just one member


def test_forced_scores_of_an_ensemble_are_the_log_of_the_mean_probability():
    models = [random_model(1), random_model(2)]
    targets = [[5, 6, EOS], [7, EOS], [9, 9, 9, EOS]]
    got = forced_scores(Ensemble(models), SRC, targets)
    singles = [forced_scores(m, SRC, targets) for m in models]
    for b, target in enumerate(targets):
        for t in range(len(target)):
            expected = torch.tensor([singles[0][b][t], singles[1][b][t]]).exp().mean().log().item()
            assert got[b][t] == pytest.approx(expected, abs=1e-5)


@pytest.mark.skipif(not int8_supported(), reason="no fbgemm int8 kernels")
def test_int8_ensemble_of_one_equals_the_int8_model():
    model = random_model(1)
    alone = beam_search(for_decoding(model, "int8"), SRC, DecodeConfig(beam=3, max_len_b=6), nbest=3)
    ensemble = for_decoding(Ensemble([model]), "int8")
    result = beam_search(ensemble, SRC, DecodeConfig(beam=3, max_len_b=6), nbest=3)
    assert [[h.tokens for h in s] for s in result] == [[h.tokens for h in s] for s in alone]


def test_members_of_another_vocabulary_are_refused_with_the_reason():
    with pytest.raises(CheckpointError, match="b.pt has src_vocab_size=30"):
        Ensemble([random_model(1), random_model(2, src_vocab_size=30, tgt_vocab_size=30)], names=["a.pt", "b.pt"])


def test_the_tightest_learned_position_limit_caps_the_output():
    ensemble = Ensemble([random_model(1), random_model(2, max_positions=8)])
    assert ensemble.config.max_positions == 8


def test_the_tightest_position_limit_of_sinusoidal_members_caps_the_ensemble_too():
    ensemble = Ensemble([random_model(1, positions="sinusoidal", max_positions=12),
                         random_model(2, positions="sinusoidal", max_positions=9)])
    assert ensemble.config.max_positions == 9 and ensemble.config.positions == "sinusoidal"
    mixed = Ensemble([random_model(1, positions="sinusoidal", max_positions=7), random_model(2)])
    assert mixed.config.max_positions == 7 and mixed.config.positions == "learned"
