"""Both samplers (inference/sampling.py: fixed rows on static_decoding.py, and rows that leave the batch) against
independent references: top-k 1 is
greedy search; positional scores are the model's teacher-forced log-probabilities; the first token's empirical
distribution matches the model's; seeds reproduce; prefixes, min/max length and n-gram blocking hold for every
layer kind and ensembles; a step reads nothing back to the host, and the sampler one boolean a step."""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import pytest
import torch
from scipy.stats import chi2

from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference.beam import (
    Hypothesis,
    beam_search,
    forced_scores,
    length_penalty,
    normalized_log_probs,
)
from multibranch.inference.ensemble import Ensemble
from multibranch.inference.processors import StepState, apply_processors, sampling_processors
from multibranch.inference.sampling import FixedShapeSampler, StaticSampler, sample
from tests.helpers.host_reads import HostReads
from tests.helpers.layer_kinds import EOS, KINDS, PAD, kind_model, sources

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def sampling_distribution(lprobs: torch.Tensor, **options) -> torch.Tensor:
    """log-probabilities [N, V] -> the sampling distribution's log-probabilities [N, V] under `options`
    (temperature, top_k, top_p): `sampling_processors` on a copy."""
    N = lprobs.shape[0]
    state = StepState(0, torch.zeros(N, 1, dtype=torch.long), torch.zeros(N, dtype=torch.long))
    return apply_processors(sampling_processors(DecodeConfig(**options)), lprobs.clone(), state)


def _seed(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@pytest.fixture(params=[True, False], ids=["fixed-rows", "shrinking"])
def fixed_shapes(request) -> bool:
    return request.param


def _draw(model, src, options: DecodeConfig, n: int, seed: int = 0, prefix=None, *,
          fixed_shapes: bool) -> list[list[Hypothesis]]:
    return sample(model, src, options, n, generator=_seed(seed, src.device), prefix=prefix, fixed_shapes=fixed_shapes)


def assert_scored_by_the_model(model, src: torch.Tensor, found: list[list[Hypothesis]], options: DecodeConfig,
                               n: int) -> None:
    """n samples per sentence, best first; positional scores = the teacher-forced log-probabilities of the sample
    (an independent forward pass) and the score their sum over the length penalty."""
    assert [len(hs) for hs in found] == [n] * src.shape[0]
    rows = [b for b, hs in enumerate(found) for _ in hs]
    flat = [h for hs in found for h in hs]
    forced = forced_scores(model, src[rows], [h.tokens + [EOS] for h in flat])
    for h, reference in zip(flat, forced, strict=True):
        assert h.positional_scores == pytest.approx(reference, rel=1e-4, abs=1e-4)
        divisor = length_penalty(len(h.positional_scores), options.length_penalty, options.length_penalty_kind)
        assert h.score == pytest.approx(sum(h.positional_scores) / divisor, rel=1e-5, abs=1e-5)
    for hs in found:
        assert [h.score for h in hs] == sorted((h.score for h in hs), reverse=True)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_layer_kind_samples_what_the_model_scores(kind, device, fixed_shapes):
    model, src = kind_model(kind), sources(4)
    options = DecodeConfig(temperature=0.8, top_p=0.9, max_len_a=1.0, max_len_b=4, no_repeat_ngram_size=2)
    found = _draw(copy.deepcopy(model).to(device), src.to(device), options, 3, fixed_shapes=fixed_shapes)
    assert_scored_by_the_model(model, src, found, options, 3)


def test_an_ensemble_samples_what_it_scores(fixed_shapes):
    ensemble = Ensemble([kind_model("mat"), kind_model("transformer", seed=4)])
    src = sources(3)
    options = DecodeConfig(top_k=5, length_penalty=0.6, length_penalty_kind="gnmt", max_len_a=1.0, max_len_b=3)
    assert_scored_by_the_model(ensemble, src, _draw(ensemble, src, options, 4, fixed_shapes=fixed_shapes), options, 4)


@pytest.mark.parametrize("settings", [dict(top_k=1), dict(temperature=1e-6)])
def test_top_k_1_or_a_tiny_temperature_is_greedy_search(settings, fixed_shapes):
    model, src = kind_model("muse"), sources()
    limits = dict(length_penalty=0.6, max_len_a=1.0, max_len_b=3, min_len=2)
    greedy = beam_search(model, src, DecodeConfig(beam=1, **limits))
    for hs, [g] in zip(_draw(model, src, DecodeConfig(**limits, **settings), 3, fixed_shapes=fixed_shapes), greedy, strict=True):
        assert [h.tokens for h in hs] == [g.tokens] * 3
        assert [h.score for h in hs] == pytest.approx([g.score] * 3, abs=1e-5)
        for h in hs:
            assert h.positional_scores == pytest.approx(g.positional_scores, abs=1e-5)


def test_the_same_seed_draws_the_same_samples_and_another_seed_others(fixed_shapes):
    model, src = kind_model("transformer"), sources(5)
    options = DecodeConfig(top_p=0.95, max_len_a=1.0, max_len_b=4)

    def outputs(seed: int) -> list[list[tuple[list[int], float]]]:
        return [[(h.tokens, h.score) for h in hs] for hs in _draw(model, src, options, 4, seed, fixed_shapes=fixed_shapes)]

    assert outputs(3) == outputs(3)
    assert outputs(3) != outputs(4)


@pytest.mark.parametrize("settings", [dict(), dict(temperature=0.7, top_k=12), dict(top_p=0.8)])
def test_the_first_token_follows_the_models_distribution(settings, fixed_shapes):
    """A chi-square test of 4000 first tokens (a fixed seed: deterministic) against the restricted softmax of an
    independent forward pass; bins expecting fewer than 5 draws are pooled."""
    model, draws = kind_model("transformer"), 4000
    src = sources(1, seed=5)
    options = DecodeConfig(min_len=0, max_len_a=0.0, max_len_b=1, **settings)
    [samples] = _draw(model, src, options, draws, seed=11, fixed_shapes=fixed_shapes)
    first = torch.tensor([h.tokens[0] if h.tokens else EOS for h in samples])
    bos = torch.full((1, 1), model.config.bos_id)
    with torch.no_grad():
        lprobs = normalized_log_probs(model(src, bos), model.config)[0]  # [1, V] the first step, teacher-forced
    expected = sampling_distribution(lprobs, **settings).exp()[0] * draws  # [V]
    counts = torch.bincount(first, minlength=expected.shape[0]).double()
    assert counts[expected.eq(0)].sum() == 0  # nothing outside the top-k / top-p set
    big = expected >= 5
    observed, wanted = counts[big], expected[big].double()
    if expected[~big].sum() > 0:
        observed = torch.cat([observed, counts[~big].sum()[None]])
        wanted = torch.cat([wanted, expected[~big].sum()[None].double()])
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    assert statistic < chi2.ppf(0.999, len(wanted) - 1), (statistic, observed.tolist(), wanted.tolist())


def test_prefixes_are_kept(fixed_shapes):
    model, src = kind_model("mat"), sources(4)
    prefix = torch.tensor([[5, 6, PAD], [7, PAD, PAD], [PAD, PAD, PAD], [9, 9, 9]])
    options = DecodeConfig(temperature=1.5, max_len_a=1.0, max_len_b=5, no_repeat_ngram_size=3)
    found = _draw(model, src, options, 4, prefix=prefix, fixed_shapes=fixed_shapes)
    for wanted, hs in zip([[5, 6], [7], [], [9, 9, 9]], found, strict=True):
        assert all(h.tokens[: len(wanted)] == wanted for h in hs)
    assert_scored_by_the_model(model, src, found, options, 4)


def test_min_len_holds_and_the_length_limit_ends_every_sample(fixed_shapes):
    model, src = kind_model("transformer"), sources(4)
    with torch.no_grad():
        model.output_bias[EOS] = 4.0  # EOS is likely from the first step on
    early = _draw(model, src, DecodeConfig(min_len=0, max_len_a=1.0, max_len_b=6), 8, fixed_shapes=fixed_shapes)
    assert min(len(h.tokens) for hs in early for h in hs) < 3
    options = DecodeConfig(min_len=3, max_len_a=1.0, max_len_b=6)
    held = _draw(model, src, options, 8, fixed_shapes=fixed_shapes)
    assert min(len(h.tokens) for hs in held for h in hs) == 3
    assert_scored_by_the_model(model, src, held, options, 8)
    with torch.no_grad():
        model.output_bias[EOS] = -30.0  # EOS only where it is forced
    options = DecodeConfig(max_len_a=0.0, max_len_b=4)
    forced = _draw(model, src, options, 5, fixed_shapes=fixed_shapes)
    assert all(len(h.tokens) == 4 for hs in forced for h in hs)
    assert_scored_by_the_model(model, src, forced, options, 5)


def _repeats(tokens: list[int], n: int) -> bool:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) < len(grams)


def test_no_repeated_ngrams_and_a_sample_with_every_token_blocked_scores_minus_infinity(fixed_shapes):
    model, src = kind_model("weighted"), sources(3)
    with torch.no_grad():
        model.output_bias[6:] = float("-inf")  # tokens 4 and 5 (and EOS, masked below min_len) only: repeats
        model.output_bias[1] = float("-inf")  # (unk)
    limits = dict(min_len=8, max_len_a=1.0, max_len_b=8)
    free = _draw(model, src, DecodeConfig(**limits), 6, fixed_shapes=fixed_shapes)
    assert all(_repeats(h.tokens, 2) for hs in free for h in hs)
    blocked = [h for hs in _draw(model, src, DecodeConfig(no_repeat_ngram_size=2, **limits), 6, fixed_shapes=fixed_shapes) for h in hs]
    assert not any(_repeats(h.tokens, 2) for h in blocked)
    assert all(h.score == float("-inf") and h.positional_scores[-1] == float("-inf") for h in blocked)
    assert all(len(h.tokens) < 8 for h in blocked)  # {4, 5} x {4, 5} holds 4 bigrams: at most 5 tokens


def test_a_sampler_reuses_its_buffers_batch_after_batch(device):
    model = kind_model("muse")  # a convolution window that must restart from zeros
    on_device = copy.deepcopy(model).to(device)
    sampler = FixedShapeSampler(on_device, generator=_seed(0, device))
    options = DecodeConfig(top_k=8, max_len_a=1.0, max_len_b=3)
    batches = [sources(7, seed=1), sources(5, seed=2), sources(8, seed=3), sources(3, seed=4)]
    for src in batches:
        assert_scored_by_the_model(model, src, sample(on_device, src.to(device), options, 2, sampler=sampler), options, 2)
    assert len(sampler.buckets) < len(batches)
    if device.type == "cuda":
        assert all(bucket.graph is not None for bucket in sampler.buckets.values())  # captured, no fallback
    with pytest.raises(ValueError, match="own generator"):
        sample(on_device, batches[0].to(device), options, sampler=sampler, generator=_seed(0, device))


def test_a_step_reads_nothing_back_and_the_sampler_one_boolean_a_step():
    model, src = kind_model("mat"), sources()
    prefix = torch.tensor([[5, 6, 0]] * src.shape[0])
    options = DecodeConfig(temperature=0.9, top_k=10, top_p=0.9, max_len_a=1.0, max_len_b=6,
                           no_repeat_ngram_size=2, min_len=2)
    sampler = StaticSampler(model, 8, 16, options, 3, generator=_seed(0), prefixed=True)
    sampler.load(src, prefix)
    counter = HostReads()
    with counter:
        for _ in range(sampler.steps):
            sampler.step()  # past the end of every row and prefix
    assert counter.found == []
    whole = HostReads()
    with whole:
        found = sample(model, src, options, 3, generator=_seed(0), prefix=prefix, fixed_shapes=True)
    steps = max(len(h.positional_scores) for hs in found for h in hs)
    places = [where.split(" at ")[1] for where in whole.found]
    per_step = [where for where in places if where.endswith(_reading_line(StaticSampler.all_done))]
    assert 0 < len(per_step) <= steps
    assert len(places) - len(per_step) <= 8, places  # before the search (its limits) and one copy back


def _reading_line(method) -> str:
    """'/file.py:N': the line of `method` that reads the device (its `bool(...)`)."""
    lines, first = inspect.getsourcelines(method)
    line = first + next(i for i, text in enumerate(lines) if "bool(" in text)
    return f"/{Path(inspect.getsourcefile(method)).name}:{line}"
