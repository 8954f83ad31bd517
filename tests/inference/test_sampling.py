"""Sampling: the restricted distribution against hand-computed top-k / top-p / temperature
probabilities, and the drawn tokens against it with a chi-square test (a scripted first step)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from multibranch.config import ConfigError
from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference.processors import StepState, apply_processors, sampling_processors
from multibranch.inference.sampling import sample
from multibranch.models.seq2seq import EncoderOut
from multibranch.modules.state import DecoderState

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

PAD, UNK, BOS, EOS = 0, 1, 2, 3
A, B, C, D = 4, 5, 6, 7
V = 8
FIRST = {A: 0.4, B: 0.3, C: 0.15, D: 0.1, EOS: 0.05}  # the scripted first-step distribution
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47}  # chi-square quantile 0.999 by degrees of freedom


@dataclass
class FakeConfig:
    pad_id: int = PAD
    bos_id: int = BOS
    eos_id: int = EOS
    positions: str = "sinusoidal"
    max_positions: int = 1024


class FirstStepModel:
    """Step 0: the FIRST distribution; every later step: EOS (probability 1)."""

    config = FakeConfig()

    def encode(self, src: torch.Tensor) -> EncoderOut:
        return EncoderOut(src.float()[:, :, None], src.eq(PAD))

    def decode_step(self, tokens: torch.Tensor, enc: EncoderOut, state: DecoderState) -> torch.Tensor:
        logits = torch.full((tokens.shape[0], V), float("-inf"))
        if state.step == 0:
            for token, prob in FIRST.items():
                logits[:, token] = math.log(prob)
        else:
            logits[:, EOS] = 0.0
        state.step += 1
        return logits


def hand(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> dict[int, float]:
    """The sampling distribution of FIRST, by the textbook definitions in plain Python."""
    probs = {t: p ** (1 / temperature) for t, p in FIRST.items()}
    total = sum(probs.values())
    probs = {t: p / total for t, p in probs.items()}
    ranked = sorted(probs, key=lambda t: -probs[t])
    if top_k:
        ranked = ranked[:top_k]
    mass = sum(probs[t] for t in ranked)
    probs = {t: probs[t] / mass for t in ranked}
    kept, cumulative = [], 0.0
    for t in ranked:
        if cumulative >= top_p:
            break
        kept.append(t)
        cumulative += probs[t]
    mass = sum(probs[t] for t in kept)
    return {t: probs[t] / mass for t in kept}


def sampling_distribution(lprobs: torch.Tensor, **options) -> torch.Tensor:
    """log-probabilities [N, V] -> the sampling distribution's log-probabilities [N, V] under `options`
    (temperature, top_k, top_p): `sampling_processors` on a copy."""
    N = lprobs.shape[0]
    state = StepState(0, torch.zeros(N, 1, dtype=torch.long), torch.zeros(N, dtype=torch.long))
    return apply_processors(sampling_processors(DecodeConfig(**options)), lprobs.clone(), state)


CASES = [dict(), dict(top_k=2), dict(top_p=0.8), dict(temperature=2.0), dict(temperature=0.5, top_p=0.9),
         dict(top_k=3, top_p=0.7), dict(top_p=0.3)]


def first_lprobs() -> torch.Tensor:
    lp = torch.full((1, V), float("-inf"))
    for token, prob in FIRST.items():
        lp[0, token] = math.log(prob)
    return lp


@pytest.mark.parametrize("options", CASES)
def test_the_sampling_processors_give_the_hand_computed_distribution(options):
    expected = hand(**options)
    got = sampling_distribution(first_lprobs(), **options).exp()[0]
    assert {t for t in range(V) if got[t] > 0} == set(expected)
    for token, prob in expected.items():
        assert got[token].item() == pytest.approx(prob, abs=1e-6)


@pytest.mark.parametrize("options", CASES)
def test_drawn_first_tokens_follow_the_distribution(options):
    draws = 4000
    src = torch.tensor([[A, EOS]])
    hyps = sample(FirstStepModel(), src, DecodeConfig(min_len=0, **options), draws,
                  generator=torch.Generator().manual_seed(1))[0]
    assert len(hyps) == draws
    counts: dict[int, int] = {}
    for h in hyps:
        first = h.tokens[0] if h.tokens else EOS
        counts[first] = counts.get(first, 0) + 1
    expected = hand(**options)
    assert set(counts) <= set(expected)  # nothing outside the top-k / top-p set
    chi2 = sum((counts.get(t, 0) - draws * p) ** 2 / (draws * p) for t, p in expected.items())
    if len(expected) > 1:
        assert chi2 < CHI2_999[len(expected) - 1], (counts, expected)


def test_scores_are_the_models_log_probabilities_and_samples_come_best_first():
    hyps = sample(FirstStepModel(), torch.tensor([[A, EOS]]), DecodeConfig(temperature=3.0, min_len=0,
                                                                           length_penalty=0.0), 50, generator=torch.Generator().manual_seed(0))[0]
    for h in hyps:
        if h.tokens:
            assert h.positional_scores == pytest.approx([math.log(FIRST[h.tokens[0]]), 0.0])
        else:
            assert h.positional_scores == pytest.approx([math.log(FIRST[EOS])])
        assert h.score == pytest.approx(sum(h.positional_scores))
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_min_len_and_max_len_hold_while_sampling():
    hyps = sample(FirstStepModel(), torch.tensor([[A, EOS]]), DecodeConfig(min_len=1), 200,
                  generator=torch.Generator().manual_seed(0))[0]
    assert all(len(h.tokens) == 1 for h in hyps)  # EOS masked at step 0, forced after
    hyps = sample(FirstStepModel(), torch.tensor([[A, EOS]]), DecodeConfig(min_len=0, max_len_a=0,
                                                                           max_len_b=0), 20, generator=torch.Generator().manual_seed(0))[0]
    assert all(h.tokens == [] for h in hyps)


def test_real_model_same_seed_same_samples_other_seed_other_samples(tiny_sampling_model):
    src = torch.tensor([[5, 9, 11, 3], [7, 3, 0, 0]])

    def draw(seed: int) -> list[list[list[int]]]:
        out = sample(tiny_sampling_model, src, DecodeConfig(top_p=0.95), 8,
                     generator=torch.Generator().manual_seed(seed))
        return [sorted(h.tokens for h in hyps) for hyps in out]

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)


def test_real_model_top_k_1_sampling_is_greedy_search(tiny_sampling_model):
    from multibranch.inference.beam import greedy_search

    src = torch.tensor([[5, 9, 11, 3], [7, 3, 0, 0], [4, 4, 4, 3]])
    greedy = greedy_search(tiny_sampling_model, src, DecodeConfig(max_len_b=6))
    drawn = sample(tiny_sampling_model, src, DecodeConfig(top_k=1, max_len_b=6), 3,
                   generator=torch.Generator().manual_seed(0))
    for g, hyps in zip(greedy, drawn, strict=True):
        assert [h.tokens for h in hyps] == [g[0].tokens] * 3
        assert [h.score for h in hyps] == pytest.approx([g[0].score] * 3, abs=1e-5)


def test_a_sample_with_every_token_blocked_ends_with_score_minus_infinity():
    class Looping(FirstStepModel):
        def decode_step(self, tokens, enc, state):  # always A (only A and EOS exist; EOS masked by min_len)
            logits = torch.full((tokens.shape[0], V), float("-inf"))
            logits[:, A] = 0.0
            logits[:, EOS] = -1.0
            state.step += 1
            return logits

    [hyps] = sample(Looping(), torch.tensor([[A, EOS]]), DecodeConfig(min_len=5, no_repeat_ngram_size=2), 2,
                    generator=torch.Generator().manual_seed(0))
    assert [h.tokens for h in hyps] == [[A, A], [A, A]]  # A A, then A is blocked and EOS is masked
    assert all(h.score == float("-inf") for h in hyps)


@pytest.fixture(scope="module")
def tiny_sampling_model():
    from multibranch.config import from_dict
    from multibranch.models import ModelConfig, build_model

    torch.manual_seed(3)
    cfg = from_dict(ModelConfig, {"d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 1,
                                  "src_vocab_size": 20, "tgt_vocab_size": 20})
    return build_model(cfg).eval()


@pytest.mark.parametrize("field,value", [("temperature", -1.0), ("temperature", 0.0), ("top_p", 0.0),
                                         ("top_p", 1.5), ("top_k", -1)])
def test_bad_sampling_settings_are_config_errors(field, value):
    with pytest.raises(ConfigError, match=field):
        DecodeConfig(sampling=True, **{field: value}).validate()


def test_sampling_allows_more_samples_than_the_beam():
    DecodeConfig(sampling=True, beam=1, nbest=5).validate()
    with pytest.raises(ConfigError, match="nbest"):
        DecodeConfig(beam=1, nbest=5).validate()
