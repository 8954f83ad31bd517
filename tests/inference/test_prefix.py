"""Target prefixes: the output starts with the prefix, then the search goes on as a plain reference
continuation says; an empty prefix equals none; a prefix over the length limit is refused."""

from __future__ import annotations

import pytest
import torch

from multibranch.config import from_dict
from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference.beam import beam_search, forced_scores, greedy_search
from multibranch.inference.sampling import sample
from multibranch.models import ModelConfig, build_model

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

PAD, BOS, EOS = 0, 2, 3
SRC = torch.tensor([[5, 9, 11, 7, EOS], [8, 12, EOS, PAD, PAD], [6, 6, 10, EOS, PAD]])


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(5)
    cfg = from_dict(ModelConfig, {"d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 2,
                                  "src_vocab_size": 24, "tgt_vocab_size": 24, "output_bias": True})
    m = build_model(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
        m.output_bias[EOS] = 1.0
    return m


def prefix_batch(*rows: list[int]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


def reference_continuation(model, src_row: list[int], prefix: list[int], max_tokens: int) -> list[int]:
    """The prefix, then argmax steps by full forwards (pad/bos never chosen), EOS forced at max_tokens."""
    out = list(prefix)
    src = torch.tensor([src_row])
    while len(out) < max_tokens:
        logits = model(src, torch.tensor([[BOS, *out]]))[0, -1].clone()
        logits[PAD] = logits[BOS] = float("-inf")
        token = int(logits.argmax())
        if token == EOS:
            break
        out.append(token)
    return out


def test_greedy_with_prefixes_equals_the_reference_continuation(model):
    prefixes = [[17, 4], [], [9, 9, 9]]
    result = greedy_search(model, SRC, DecodeConfig(max_len_a=0, max_len_b=7, min_len=0),
                           prefix=prefix_batch(*prefixes))
    for row, prefix, hyps in zip(SRC.tolist(), prefixes, result, strict=True):
        ids = [t for t in row if t != PAD]
        assert hyps[0].tokens == reference_continuation(model, ids, prefix, 7)


@pytest.mark.parametrize("beam", [1, 3])
def test_beam_outputs_start_with_the_prefix_and_score_as_forced_decoding(model, beam):
    prefixes = [[17, 4], [20], [9, 9, 9]]
    result = beam_search(model, SRC, DecodeConfig(beam=beam, max_len_b=6), nbest=beam,
                         prefix=prefix_batch(*prefixes))
    for b, (prefix, hyps) in enumerate(zip(prefixes, result, strict=True)):
        assert len(hyps) == beam
        for h in hyps:
            assert h.tokens[: len(prefix)] == prefix
            forced = forced_scores(model, SRC[b : b + 1], [h.tokens + [EOS]])[0]
            assert h.positional_scores == pytest.approx(forced, abs=1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_an_empty_prefix_equals_no_prefix(model, beam):
    plain = beam_search(model, SRC, DecodeConfig(beam=beam, max_len_b=6), nbest=beam)
    empty = beam_search(model, SRC, DecodeConfig(beam=beam, max_len_b=6), nbest=beam, prefix=torch.zeros(3,
                                                                                                         0, dtype=torch.long))
    padded = beam_search(model, SRC, DecodeConfig(beam=beam, max_len_b=6), nbest=beam,
                         prefix=prefix_batch([PAD], [PAD], [PAD]))
    for other in (empty, padded):
        assert [[(h.tokens, h.score) for h in s] for s in other] == [[(h.tokens, h.score) for h in s] for s in plain]


def test_a_prefixed_sentence_decodes_the_same_alone_and_in_a_batch(model):
    prefixes = prefix_batch([17, 4], [], [9])
    batched = beam_search(model, SRC, DecodeConfig(beam=3, max_len_b=6), nbest=3, prefix=prefixes)
    for b in range(3):
        row = SRC[b : b + 1, : int(SRC[b].ne(PAD).sum())]
        alone = beam_search(model, row, DecodeConfig(beam=3, max_len_b=6), nbest=3,
                            prefix=prefixes[b : b + 1])
        assert [h.tokens for h in alone[0]] == [h.tokens for h in batched[b]]


def test_sampling_keeps_the_prefix(model):
    result = sample(model, SRC, DecodeConfig(), 5, generator=torch.Generator().manual_seed(0),
                    prefix=prefix_batch([17, 4], [], [9]))
    for prefix, hyps in zip([[17, 4], [], [9]], result, strict=True):
        assert all(h.tokens[: len(prefix)] == prefix for h in hyps)


def test_a_prefix_longer_than_the_length_limit_is_an_error(model):
    with pytest.raises(ValueError, match="sentence 1: its prefix has 4 tokens but at most 3"):
        beam_search(model, SRC, DecodeConfig(beam=2, max_len_a=0, max_len_b=3), prefix=prefix_batch([4], [4,
                                                                                                          5, 6, 7], []))
