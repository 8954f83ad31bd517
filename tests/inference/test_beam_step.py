"""A search step's deferred normalisation (`beam._step_scores`, csrc/beam_step.cpp): the kernel's per-row
log-sum-exp against float64's, and searches scoring with it against the same searches normalising with
log_softmax (every mask the search applies: min length, forced EOS at the length limit, prefixes, n-grams)."""

from __future__ import annotations

import pytest
import torch

from multibranch import cpu_kernels
from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference import beam
from multibranch.inference.beam import beam_search
from tests.helpers.models import noisy_model

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.usefixtures("cpu_kernels_built"),
]
NEG_INF = float("-inf")
VOCAB, PAD, BOS, EOS = 40, 0, 2, 3


def test_row_logsumexp_is_float64s_within_fp32_rounding():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 8000, generator=g) * 6
    x[:, :2] = NEG_INF  # pad and bos, as the search masks them
    x[3, 100:] = NEG_INF  # a row with few live tokens
    x[4] = NEG_INF
    x[4, 17] = -3.5  # one live token: its own value
    got = cpu_kernels.kernels().row_logsumexp(x)
    expected = torch.logsumexp(x.double(), dim=1)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=2e-6)
    assert got[4].item() == -3.5
    everything_masked = torch.full((1, 5), NEG_INF)
    assert cpu_kernels.kernels().row_logsumexp(everything_masked).item() == NEG_INF
    with pytest.raises(RuntimeError, match="contiguous float32"):
        cpu_kernels.kernels().row_logsumexp(x.double())


def _model() -> torch.nn.Module:
    return noisy_model(VOCAB, 0.4, 11)


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("options", [
    {},
    {"min_len": 4, "max_len_a": 0.0, "max_len_b": 5},  # EOS masked early, forced at the limit
    {"no_repeat_ngram_size": 2},
    {"prefix": True},
])
def test_deferred_normalisation_searches_as_log_softmax_does(beam_size, options, monkeypatch):
    g = torch.Generator().manual_seed(12)
    src = torch.randint(4, VOCAB, (6, 8), generator=g)
    src[2, 5:] = PAD
    options = dict(options)
    prefix = None
    if options.pop("prefix", False):
        prefix = torch.full((6, 3), PAD)
        prefix[0, :3] = torch.tensor([7, 8, 9])
        prefix[3, :1] = 5
    decode = DecodeConfig(beam=beam_size, **options)
    model = _model()
    deferred = beam_search(model, src, decode, nbest=beam_size, prefix=prefix)
    calls = []
    original = beam._step_scores

    def normalising(*args, deferred=False, **kwargs):
        calls.append(deferred)
        return original(*args, deferred=False, **kwargs)

    monkeypatch.setattr(beam, "_step_scores", normalising)
    expected = beam_search(model, src, decode, nbest=beam_size, prefix=prefix)
    assert calls and all(calls)  # both searches ask for the deferred path
    for mine, theirs in zip(deferred, expected, strict=True):
        assert [h.tokens for h in mine] == [h.tokens for h in theirs]
        assert [h.score for h in mine] == pytest.approx([h.score for h in theirs], abs=1e-5)
        for a, b in zip(mine, theirs, strict=True):
            assert a.positional_scores == pytest.approx(b.positional_scores, abs=1e-5)
