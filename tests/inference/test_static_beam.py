"""The fixed-shape search (inference/static_beam.py, run by graphed_search.py) against today's search
(`beam._beam_search`, the reference): the same hypotheses in the same order, scores to 1e-5, for every layer
kind, with n-best, prefixes, n-gram blocking, both length penalties, min/max length and ensembles, on random
and trained models; a step reads nothing back to the host; the search reads one boolean a step."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference.beam import Hypothesis, _beam_search, greedy_search
from multibranch.inference.ensemble import Ensemble
from multibranch.inference.graphed_search import FixedShapeSearcher, bucket_shape, run_fixed_shape_search
from multibranch.inference.search import search
from multibranch.inference.static_beam import StaticBeamSearch
from multibranch.loading.checkpoint import load_model
from tests.helpers.host_reads import HostReads
from tests.helpers.layer_kinds import EOS, KINDS, kind_model, sources

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

def assert_same(found: list[list[Hypothesis]], reference: list[list[Hypothesis]]) -> None:
    """The same hypotheses in the same order; scores and per-token log-probabilities to float rounding."""
    assert [[h.tokens for h in hs] for hs in found] == [[h.tokens for h in hs] for hs in reference]
    for hs, refs in zip(found, reference, strict=True):
        assert [h.score for h in hs] == pytest.approx([h.score for h in refs], abs=1e-5)
        for h, ref in zip(hs, refs, strict=True):
            assert h.positional_scores == pytest.approx(ref.positional_scores, rel=1e-5, abs=2e-5)


OPTIONS = {
    "plain": dict(max_len_a=1.0, max_len_b=4),
    "gnmt-min-len": dict(length_penalty=0.6, length_penalty_kind="gnmt", max_len_a=1.0, max_len_b=5, min_len=3),
    "ngram": dict(max_len_a=1.0, max_len_b=8, no_repeat_ngram_size=2),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_layer_kind_finds_what_todays_search_finds(kind, device):
    """On CUDA the fixed-shape search replays its captured step (graphs on by default there)."""
    model, src = kind_model(kind), sources()
    fixed_model, fixed_src = copy.deepcopy(model).to(device), src.to(device)
    for name, settings in OPTIONS.items():
        options = DecodeConfig(beam=4, **settings)
        reference = _beam_search(model, src, options)
        assert sum(len(hs) for hs in reference) > len(reference), name  # more than one finished per sentence
        assert_same(run_fixed_shape_search(fixed_model, fixed_src, options), reference)


def test_prefixes_including_empty_and_full_length_ones():
    model, src = kind_model("mat"), sources()
    prefix = torch.tensor([[5, 6, 0], [7, 0, 0], [0, 0, 0], [9, 9, 9], [4, 0, 0], [5, 0, 0], [6, 6, 0]])
    options = DecodeConfig(beam=3, max_len_a=1.0, max_len_b=5, no_repeat_ngram_size=2, min_len=2)
    found = run_fixed_shape_search(model, src, options, graphs=False, prefix=prefix)
    assert_same(found, _beam_search(model, src, options, prefix=prefix))
    assert all(h.tokens[:3] == [9, 9, 9] for h in found[3])


@pytest.mark.parametrize("mean", ["prob", "log-prob"])
def test_ensembles(mean, device):
    ensemble = Ensemble([kind_model("mat"), kind_model("transformer", seed=4)], mean=mean)
    src = sources()
    options = DecodeConfig(beam=4, max_len_a=1.0, max_len_b=5)
    reference = _beam_search(ensemble, src, options)
    on_device = copy.deepcopy(ensemble).to(device)
    assert_same(run_fixed_shape_search(on_device, src.to(device), options), reference)


def test_beam_one_is_greedy():
    model, src = kind_model("muse"), sources()
    options = DecodeConfig(beam=1, length_penalty=0.6, length_penalty_kind="gnmt", max_len_a=1.0, max_len_b=3)
    assert_same(run_fixed_shape_search(model, src, options, graphs=False), greedy_search(model, src, options))


def test_a_trained_model_through_search_with_nbest(tiny_checkpoint):
    loaded = load_model(tiny_checkpoint)
    model = loaded.model.eval()
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids + [EOS]) for ids in loaded.tokenizer.encode_src(
        ["sagun nivnikib rapzubfo", "rapzubfo sagun", "nivnikib", "sagun sagun nivnikib rapzubfo rapzubfo"])],
        batch_first=True, padding_value=model.config.pad_id)
    cfg = DecodeConfig(beam=5, nbest=3, length_penalty=1.0, max_len_a=1.2, max_len_b=10)
    fixed = search(model, src, cfg, fixed_shapes=True)
    assert_same(fixed, search(model, src, cfg, fixed_shapes=False))
    assert all(len(hs) == 3 for hs in fixed)


def test_a_step_reads_nothing_back_and_the_search_one_boolean_a_step():
    model, src = kind_model("mat"), sources()
    prefix = torch.tensor([[5, 6, 0]] * src.shape[0])
    options = DecodeConfig(beam=4, max_len_a=1.0, max_len_b=6, no_repeat_ngram_size=2, min_len=2)
    search_ = StaticBeamSearch(model, 8, 16, options, prefixed=True)
    search_.load(src, prefix)
    counter = HostReads()
    with counter:
        for _ in range(search_.steps):
            search_.step()  # past the end of some sentences and of every prefix
    assert counter.found == []
    whole = HostReads()
    with whole:
        run_fixed_shape_search(model, src, DecodeConfig(beam=4, max_len_a=1.0, max_len_b=6), graphs=False)
    places = [found.split(" at ")[1] for found in whole.found]
    per_step = [where for where in places if where.endswith(_reading_line(StaticBeamSearch.all_done))]
    assert 0 < len(per_step) <= search_.steps
    assert len(places) - len(per_step) <= 8, places  # before the search (its limits) and one copy back


def _reading_line(method) -> str:
    """'static_beam.py:N': the line of `method` that reads the device (its `bool(...)`)."""
    lines, first = inspect.getsourcelines(method)
    return f"static_beam.py:{first + next(i for i, line in enumerate(lines) if 'bool(' in line)}"


@pytest.mark.parametrize("kind", ["muse", "mat"])  # muse: a convolution window that must restart from zeros
def test_buffers_are_reused_batch_after_batch(kind, device):
    """Batches of different sizes and lengths through one searcher: each equals today's search alone, and
    batches of one bucket share one search (its buffers, and on CUDA its graph, replayed)."""
    model = kind_model(kind)
    searcher = FixedShapeSearcher(copy.deepcopy(model).to(device))
    options = DecodeConfig(beam=3, max_len_a=1.0, max_len_b=4, no_repeat_ngram_size=2)
    batches = [sources(7, seed=1), sources(5, seed=2), sources(8, seed=3), sources(3, seed=4), sources(7, seed=1)]
    for src in batches:
        assert_same(searcher.search(src.to(device), options), _beam_search(model, src, options))
    if device.type == "cuda":
        assert all(bucket.graph is not None for bucket in searcher.buckets.values())  # captured, no fallback
    assert len(searcher.buckets) == len({bucket_shape(*src.shape, model.config) for src in batches}) < len(batches)
