"""The decoding rules (inference/processors.py), each against a hand-computed case on tiny tensors, with a host int
step (the shrinking engines) and a device counter (the fixed-shape engines, which must read nothing back); the
length penalty against its formulas; the lists a DecodeConfig builds; the CTranslate2 mapping covers every field."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from multibranch.config import ConfigError
from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference.processors import (
    LengthLimit,
    MinLength,
    NoRepeatNGram,
    StepState,
    TargetPrefix,
    Temperature,
    TopK,
    TopP,
    apply_processors,
    length_penalty,
    processors_for,
    sampling_processors,
)
from multibranch.tasks.translation.ct2 import CT2_MAPPING, translate_options
from tests.helpers.host_reads import HostReads

PAD, BOS, EOS = 0, 2, 3
A, B, C = 4, 5, 6
V = 7
INF = math.inf


def scores(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def log_probs(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).log()


def both_steps(step: int) -> list[int | torch.Tensor]:
    """The step as the shrinking engines pass it and as the fixed-shape ones do."""
    return [step, torch.tensor(step)]


def state(step: int | torch.Tensor, tokens: list[list[int]], limits: list[int],
          prefix: list[list[int]] | None = None) -> StepState:
    return StepState(step, torch.tensor(tokens), torch.tensor(limits),
                     None if prefix is None else torch.tensor(prefix))


ROW = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0]  # token t scores -(t + 1)


# ---- the rules ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", both_steps(1))
def test_min_length_masks_eos_except_at_the_length_limit(step):
    """min_len 2 at step 1: EOS masked on rows 0 and 2; row 1 is at its limit (1), where the limit wins."""
    got = MinLength(2, EOS)(scores(ROW, ROW, ROW), state(step, [[BOS, A]] * 3, [5, 1, 5]))
    expected = scores(ROW, ROW, ROW)
    expected[0, EOS] = expected[2, EOS] = -INF
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("step", both_steps(2))
def test_min_length_is_done_at_min_len(step):
    got = MinLength(2, EOS)(scores(ROW), state(step, [[BOS, A, B]], [5]))
    torch.testing.assert_close(got, scores(ROW))


@pytest.mark.parametrize("step", both_steps(2))
def test_the_length_limit_leaves_only_eos_with_its_own_score(step):
    got = LengthLimit(EOS)(scores(ROW, ROW), state(step, [[BOS, A, B]] * 2, [2, 5]))
    only_eos = [-INF] * V
    only_eos[EOS] = ROW[EOS]
    torch.testing.assert_close(got, scores(only_eos, ROW))


@pytest.mark.parametrize("step", both_steps(3))
def test_no_repeat_ngram_blocks_the_tokens_that_complete_a_held_ngram(step):
    """Output a b a: the bigram (a, b) is held, so after a, b is blocked; n = 3: (b, a) is followed by nothing
    yet; n = 1: a and b are both held."""
    tokens = [[BOS, A, B, A, PAD]]  # the fixed-shape buffer is longer than the output: its last column is unwritten
    blocked = {n: {t for t in range(V) if NoRepeatNGram(n)(scores(ROW), state(step, tokens, [9]))[0, t] == -INF}
               for n in (1, 2, 3)}
    assert blocked == {1: {A, B}, 2: {B}, 3: set()}


def test_no_repeat_ngram_blocks_nothing_before_n_tokens():
    for step in both_steps(1):
        torch.testing.assert_close(NoRepeatNGram(2)(scores(ROW), state(step, [[BOS, A, PAD]], [9])), scores(ROW))


@pytest.mark.parametrize("step", both_steps(3))
def test_a_target_prefix_overrides_the_rules_it_wraps(step):
    """Row 0's prefix forces b at step 3, which n-gram blocking would block (a b a -> b): b keeps the model's score
    and nothing else is left; row 1's prefix has ended (pad): the rules apply as without a prefix; row 2 is forced
    to EOS before min_len."""
    rules = [NoRepeatNGram(2), MinLength(5, EOS), LengthLimit(EOS)]
    tokens = [[BOS, A, B, A]] * 3
    got = TargetPrefix(rules, PAD)(scores(ROW, ROW, ROW),
                                   state(step, tokens, [9, 9, 9], [[A, B, A, B], [A, B, A, PAD], [A, B, A, EOS]]))
    forced_b, forced_eos, free = [-INF] * V, [-INF] * V, list(ROW)
    forced_b[B], forced_eos[EOS] = ROW[B], ROW[EOS]
    free[B] = free[EOS] = -INF
    torch.testing.assert_close(got, scores(forced_b, free, forced_eos))


def test_a_target_prefix_after_its_end_is_its_rules():
    rules = [MinLength(5, EOS)]
    got = TargetPrefix(rules, PAD)(scores(ROW), state(2, [[BOS, A, B]], [9], [[A, B]]))
    torch.testing.assert_close(got, apply_processors(rules, scores(ROW), state(2, [[BOS, A, B]], [9])))


def test_the_rules_read_nothing_back_with_a_device_step():
    rules = processors_for(DecodeConfig(min_len=4, no_repeat_ngram_size=2), EOS, PAD, prefixed=True)
    step_state = state(torch.tensor(3), [[BOS, A, B, A, PAD]] * 2, [3, 9], [[A, B, A, B, PAD], [PAD] * 5])
    counter = HostReads()
    with counter:
        apply_processors(rules + sampling_processors(DecodeConfig(top_k=3, top_p=0.9, temperature=0.5)),
                         scores(ROW, ROW), step_state)
    assert counter.found == []


# ---- sampling -----------------------------------------------------------------------------------------------


def test_temperature_divides_and_renormalises():
    got = Temperature(2.0)(log_probs([0.5, 0.25, 0.25]), state(0, [[BOS]], [9])).exp()
    root = [math.sqrt(0.5), 0.5, 0.5]  # p ** (1 / 2)
    torch.testing.assert_close(got, torch.tensor([[r / sum(root) for r in root]]))


def test_temperature_one_renormalises_what_the_rules_masked():
    got = Temperature(1.0)(log_probs([0.5, 0.3, 0.0]), state(0, [[BOS]], [9])).exp()  # 0.2 masked by a rule
    torch.testing.assert_close(got, torch.tensor([[0.625, 0.375, 0.0]]))


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.inf, math.nan])
def test_a_temperature_that_is_not_finite_and_positive_is_refused(temperature):
    with pytest.raises(ConfigError, match="temperature"):
        Temperature(temperature)


def test_top_k_keeps_the_k_best_renormalised():
    got = TopK(2)(log_probs([0.2, 0.5, 0.3]), state(0, [[BOS]], [9])).exp()
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.625, 0.375]]))
    everything = log_probs([0.2, 0.5, 0.3])
    torch.testing.assert_close(TopK(3)(everything.clone(), state(0, [[BOS]], [9])), everything)


@pytest.mark.parametrize(("p", "expected"), [(0.6, [0.0, 0.625, 0.375]), (0.45, [0.0, 1.0, 0.0]),
                                             (0.81, [0.2, 0.5, 0.3])])
def test_top_p_keeps_the_smallest_set_reaching_p_renormalised(p, expected):
    """Ranked 0.5, 0.3, 0.2: the mass before each is 0, 0.5, 0.8; a token stays while that is below p."""
    got = TopP(p)(log_probs([0.2, 0.5, 0.3]), state(0, [[BOS]], [9])).exp()
    torch.testing.assert_close(got, torch.tensor([expected]))


# ---- the lists a DecodeConfig builds ------------------------------------------------------------------------


def test_processors_for_builds_the_rules_in_order():
    kinds = lambda processors: [type(p).__name__ for p in processors]  # noqa: E731
    assert kinds(processors_for(DecodeConfig(), EOS, PAD)) == ["MinLength", "LengthLimit"]
    assert kinds(processors_for(DecodeConfig(min_len=0), EOS, PAD)) == ["LengthLimit"]
    assert kinds(processors_for(DecodeConfig(no_repeat_ngram_size=3), EOS, PAD)) == [
        "NoRepeatNGram", "MinLength", "LengthLimit"]
    [prefix] = processors_for(DecodeConfig(no_repeat_ngram_size=3), EOS, PAD, prefixed=True)
    assert isinstance(prefix, TargetPrefix) and kinds(prefix.rules) == ["NoRepeatNGram", "MinLength", "LengthLimit"]
    assert kinds(sampling_processors(DecodeConfig())) == ["Temperature"]
    assert kinds(sampling_processors(DecodeConfig(top_k=5, top_p=0.9))) == ["Temperature", "TopK", "TopP"]


# ---- the length penalty -------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
@pytest.mark.parametrize("length", [1, 2, 7, 40])
def test_length_penalty_is_its_formula_on_ints_and_tensors(length, alpha):
    formulas = {"fairseq": length**alpha, "gnmt": ((5 + length) / 6) ** alpha}
    for kind, expected in formulas.items():
        assert length_penalty(length, alpha, kind) == pytest.approx(expected, rel=1e-12)
        on_tensor = length_penalty(torch.tensor([length, 1]), alpha, kind)
        assert on_tensor.dtype == torch.float64
        assert on_tensor.tolist() == pytest.approx([expected, 1.0], rel=1e-12)


def test_an_unknown_length_penalty_kind_is_refused():
    with pytest.raises(ValueError, match="average"):
        length_penalty(3, 1.0, "average")  # type: ignore[arg-type]


# ---- CTranslate2 --------------------------------------------------------------------------------------------


def test_every_decode_field_says_what_it_becomes_in_ctranslate2():
    assert set(CT2_MAPPING) == {field.name for field in dataclasses.fields(DecodeConfig)}
    assert all(m.note for m in CT2_MAPPING.values())
    assert all(m.option is not None for m in CT2_MAPPING.values() if m.value is not None)


def test_translate_options_are_the_mapped_fields_and_the_fixed_ones():
    decode = DecodeConfig(beam=4, nbest=2, min_len=0, no_repeat_ngram_size=3, length_penalty=0.6)
    assert translate_options(decode) == {
        "beam_size": 4, "length_penalty": 0.6, "num_hypotheses": 2, "min_decoding_length": 0,
        "no_repeat_ngram_size": 3, "return_end_token": True, "return_scores": True, "max_input_length": 0}
    with pytest.raises(ConfigError, match="fairseq"):
        translate_options(DecodeConfig(length_penalty_kind="gnmt"))
