"""Beam search and greedy decoding.

Most tests use a scripted model (fairseq's TestIncrementalDecoder pattern): next-token
probabilities are written by hand per (sentence, output prefix), so the expected hypotheses and
scores below are derived by hand from those numbers. The last tests use a tiny random Transformer.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from multibranch.config import ConfigError, from_dict
from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference import candidates
from multibranch.inference.beam import (
    Hypothesis,
    _beam_search,
    beam_search,
    greedy_search,
    length_penalty,
)
from multibranch.inference.processors import NoRepeatNGram, StepState
from multibranch.inference.search import search
from multibranch.models import ModelConfig, build_model
from multibranch.models.seq2seq import EncoderOut
from multibranch.modules.state import DecoderState

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

PAD, UNK, BOS, EOS = 0, 1, 2, 3
A, B, C, D = 4, 5, 6, 7
V = 10



@dataclass
class FakeConfig:
    pad_id: int = PAD
    bos_id: int = BOS
    eos_id: int = EOS
    positions: str = "sinusoidal"
    max_positions: int = 1024


Table = dict[tuple[int, ...], dict[int, float]]


class ScriptedModel:
    """Emits hand-written next-token probabilities looked up by (sentence id, output prefix).

    The sentence id is the first source token. A sentence's script is either a Table
    {prefix: {token: prob}} (an unlisted prefix is an error, so tests cover exactly what they
    derive) or a float: pseudo-random logits seeded by (sentence, prefix), with that EOS logit.
    The prefix lives in the DecoderState, so it follows beam reordering; a static cache checks that
    rows never move across sentences without `DecoderState.reorder`.
    """

    def __init__(self, scripts: dict[int, Table | float], **config):
        self.config = FakeConfig(**config)
        self.scripts = scripts
        self.batch_sizes: list[int] = []

    def encode(self, src: torch.Tensor) -> EncoderOut:
        return EncoderOut(src.float()[:, :, None], src.eq(PAD))  # [B, S, 1]: out[:, 0, 0] = sentence id

    def decode_step(self, tokens: torch.Tensor, enc: EncoderOut, state: DecoderState) -> torch.Tensor:
        view = state.view("scripted")
        prefix = tokens if state.step == 0 else torch.cat([view.get("prefix"), tokens], dim=1)
        view.set("prefix", prefix)
        sources = enc.out[:, 0, 0].long()  # one row per source; a sentence's hypotheses may share it
        if state.step == 0:
            view.set("sentence", sources, static=True)
        assert torch.equal(view.get("sentence"), sources), "rows moved across sentences"
        sentence = sources.repeat_interleave(tokens.shape[0] // sources.shape[0])  # [N]
        state.step += 1
        self.batch_sizes.append(tokens.shape[0])
        logits = torch.full((tokens.shape[0], V), float("-inf"), device=tokens.device)  # the search's device
        for row, (sent, toks) in enumerate(zip(sentence.tolist(), prefix[:, 1:].tolist(), strict=True)):
            script = self.scripts[sent]
            if isinstance(script, dict):
                if not _reachable(script, toks):  # a -inf filler hypothesis: any distribution will do
                    logits[row] = 0.0
                    continue
                for token, prob in script[tuple(toks)].items():
                    logits[row, token] = math.log(prob)
            else:
                seed = sent
                for t in toks:
                    seed = (seed * 1_000_003 + t + 1) % (2**31)
                logits[row] = torch.randn(V, generator=torch.Generator().manual_seed(seed)) * 2
                logits[row, EOS] = script + 0.5 * len(toks)
        return logits


def _reachable(script: Table, tokens: list[int]) -> bool:
    """Whether every token of the prefix had a non-zero probability under the script."""
    return all(tokens[i] in script.get(tuple(tokens[:i]), {}) for i in range(len(tokens)))


def src_of(sentence: int, length: int) -> list[int]:
    """A source sentence of `length` tokens (EOS included) whose first token is its id."""
    return [sentence] + [A] * (length - 2) + [EOS] if length > 1 else [sentence]


def batch(*rows: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows], device=device)


def _exact(results: list[list[Hypothesis]]) -> list[list[tuple]]:
    return [[(h.tokens, h.score, h.positional_scores) for h in hyps] for hyps in results]


def run_search(model: ScriptedModel, src: torch.Tensor, beam: int, **options) -> list[list[Hypothesis]]:
    """beam_search; with beam 1 also checks that the general search equals the greedy path."""
    decode = DecodeConfig(beam=beam, **options)
    result = beam_search(model, src, decode)
    if beam == 1:
        general = _beam_search(ScriptedModel(model.scripts, **vars(model.config)), src, decode)
        assert _exact(general) == _exact(result)
    return result


def fairseq_norm(raw: float, length: int, alpha: float) -> float:
    return raw / length**alpha


def gnmt_norm(raw: float, length: int, alpha: float) -> float:
    return raw / ((5 + length) / 6) ** alpha


def assert_hyp(hyp: Hypothesis, tokens: list[int], probs: list[float], score: float) -> None:
    assert hyp.tokens == tokens
    assert hyp.positional_scores == pytest.approx([math.log(p) for p in probs], abs=1e-5)
    assert hyp.score == pytest.approx(score, abs=1e-5)


# ---- EOS handling and length penalties (beam 2) ----------------------------------------------------

# step 0: a .6, b .4
# step 1: a-EOS .33, b-c .36, a-c .27, b-EOS .04 -> top 2 = [b c, a EOS]: "a" finishes; b-EOS is 4th
# step 2: b-c-EOS .288, a-c-EOS .243 (both in the top 2); "b c" is the 2nd finished hypothesis, so
#         the sentence is done and "a c" (worse) is not kept
EOS_SCRIPT: Table = {
    (): {A: 0.6, B: 0.4},
    (A,): {EOS: 0.55, C: 0.45},
    (B,): {C: 0.9, EOS: 0.1},
    (B, C): {EOS: 0.8, D: 0.2},
    (A, C): {EOS: 0.9, D: 0.1},
}
RAW_A = math.log(0.6 * 0.55)  # "a" + EOS: 2 tokens
RAW_BC = math.log(0.4 * 0.9 * 0.8)  # "b c" + EOS: 3 tokens


@pytest.mark.parametrize(
    ("kind", "alpha", "norm"),
    [("fairseq", 0.0, fairseq_norm), ("fairseq", 1.0, fairseq_norm), ("gnmt", 1.0, gnmt_norm), ("gnmt", 0.5, gnmt_norm)],
)
def test_early_eos_finalises_and_length_penalty_picks_the_winner(kind, alpha, norm, device):
    model = ScriptedModel({1: EOS_SCRIPT})
    (hyps,) = beam_search(model, batch(src_of(1, 3), device=device), DecodeConfig(beam=2,
                                                                                  length_penalty=alpha, length_penalty_kind=kind, max_len_a=0, max_len_b=10))
    score_a, score_bc = norm(RAW_A, 2, alpha), norm(RAW_BC, 3, alpha)
    expected = {"a": ([A], [0.6, 0.55], score_a), "bc": ([B, C], [0.4, 0.9, 0.8], score_bc)}
    order = sorted(expected, key=lambda k: expected[k][2], reverse=True)
    assert len(hyps) == 2
    for hyp, key in zip(hyps, order, strict=True):
        assert_hyp(hyp, *expected[key])
    assert model.batch_sizes == [1, 2, 2]  # step 0 decodes one row per sentence; done after step 2


def test_the_hand_computed_winners_really_differ():
    """The four penalties above do not all agree (so the test exercises the normalisation)."""
    winners = {
        (fn.__name__, alpha): fn(RAW_A, 2, alpha) > fn(RAW_BC, 3, alpha)
        for fn, alpha in [(fairseq_norm, 0.0), (fairseq_norm, 1.0), (gnmt_norm, 1.0), (gnmt_norm, 0.5)]
    }
    assert winners == {("fairseq_norm", 0.0): True, ("fairseq_norm", 1.0): False,
                       ("gnmt_norm", 1.0): False, ("gnmt_norm", 0.5): True}


def test_length_penalty_formulas():
    assert length_penalty(4, 0.0, "fairseq") == 1.0 and length_penalty(1, 0.6, "gnmt") == 1.0
    assert length_penalty(4, 1.0, "fairseq") == 4.0
    assert length_penalty(7, 1.0, "gnmt") == pytest.approx(2.0)
    with pytest.raises(ValueError):
        length_penalty(3, 1.0, "average")  # type: ignore[arg-type]


# ---- n-best order (beam 3) -----------------------------------------------------------------------

# step 1: a-EOS .30, b-EOS .27, a-d .20, c-d .11, c-EOS .09, b-d .03 -> "a", "b" finish (top 3)
# step 2: a-d-EOS .14, c-d-a .088, a-d-a .06, b-d-EOS .03, c-d-EOS .022 -> "a d" finishes (3rd)
NBEST_SCRIPT: Table = {
    (): {A: 0.5, B: 0.3, C: 0.2},
    (A,): {EOS: 0.6, D: 0.4},
    (B,): {EOS: 0.9, D: 0.1},
    (C,): {EOS: 0.45, D: 0.55},
    (A, D): {EOS: 0.7, A: 0.3},
    (C, D): {EOS: 0.2, A: 0.8},
    (B, D): {EOS: 1.0},
}


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_nbest_order_and_scores(alpha, device):
    expected = [
        ([A], [0.5, 0.6], fairseq_norm(math.log(0.30), 2, alpha)),
        ([B], [0.3, 0.9], fairseq_norm(math.log(0.27), 2, alpha)),
        ([A, D], [0.5, 0.4, 0.7], fairseq_norm(math.log(0.14), 3, alpha)),
    ]
    expected.sort(key=lambda e: e[2], reverse=True)
    model = ScriptedModel({1: NBEST_SCRIPT})
    src = batch(src_of(1, 3), device=device)
    (hyps,) = beam_search(model, src, DecodeConfig(beam=3, length_penalty=alpha, max_len_a=0, max_len_b=10))
    assert len(hyps) == 3
    for hyp, exp in zip(hyps, expected, strict=True):
        assert_hyp(hyp, *exp)
    (top2,) = beam_search(ScriptedModel({1: NBEST_SCRIPT}), src, DecodeConfig(beam=3, length_penalty=alpha,
                                                                              max_len_a=0, max_len_b=10), nbest=2)
    assert [h.tokens for h in top2] == [e[0] for e in expected[:2]]


# ---- min_len and the maximum length ------------------------------------------------------------------

MIN_LEN_SCRIPT: Table = {(): {EOS: 0.7, A: 0.3}, (A,): {EOS: 0.8, B: 0.2}, (A, B): {EOS: 1.0}}


@pytest.mark.parametrize("beam", [1, 2])
def test_min_len_suppresses_eos_without_renormalising(beam):
    """EOS is masked before min_len tokens; the other tokens keep their log-probabilities."""

    def run(min_len: int) -> Hypothesis:
        model = ScriptedModel({1: MIN_LEN_SCRIPT})
        return run_search(model, batch(src_of(1, 3)), beam, length_penalty=0.0, length_penalty_kind="fairseq",
                          min_len=min_len, max_len_a=0, max_len_b=10)[0][0]

    assert_hyp(run(0), [], [0.7], math.log(0.7))
    assert_hyp(run(1), [A], [0.3, 0.8], math.log(0.3 * 0.8))
    assert_hyp(run(2), [A, B], [0.3, 0.2, 1.0], math.log(0.3 * 0.2))


LONG_SCRIPT: Table = {(): {A: 0.9, EOS: 0.1}, (A,): {A: 0.9, EOS: 0.1}, (A, A): {A: 0.95, EOS: 0.05}}


@pytest.mark.parametrize("beam", [1, 2])
def test_max_length_forces_eos(beam):
    """max_len_b = 2: after "a a" only EOS is allowed, with its own probability (.05)."""
    model = ScriptedModel({1: {**LONG_SCRIPT, (A, A): {A: 0.95, EOS: 0.05}}})
    hyp = run_search(model, batch(src_of(1, 4)), beam, length_penalty=1.0, length_penalty_kind="fairseq",
                     min_len=1, max_len_a=0, max_len_b=2)[0][0]
    assert_hyp(hyp, [A, A], [0.9, 0.9, 0.05], math.log(0.9 * 0.9 * 0.05) / 3)


def test_max_length_follows_each_source_length_and_the_learned_position_limit():
    model = ScriptedModel({1: -30.0, 2: -30.0})  # EOS practically impossible until forced
    hyps = beam_search(model, batch(src_of(1, 2), src_of(2, 5)), DecodeConfig(beam=2, max_len_a=1.0,
                                                                              max_len_b=1))
    assert [len(h[0].tokens) for h in hyps] == [3, 6]  # floor(1.0 * src_len + 1)
    assert all(len(h) == 2 for h in hyps)  # every live beam is finished at the limit
    learned = ScriptedModel({1: -30.0, 2: -30.0}, positions="learned", max_positions=5)
    hyps = beam_search(learned, batch(src_of(1, 2), src_of(2, 5)), DecodeConfig(beam=2, max_len_a=1.0,
                                                                                max_len_b=1))
    assert [len(h[0].tokens) for h in hyps] == [3, 4]  # capped at max_positions - 1


def test_sinusoidal_positions_bound_the_output_at_the_models_max_positions_too():
    """A sinusoidal table would extend without end: max_len_b = 10**6 still stops at max_positions - 1 tokens."""
    sinusoidal = ScriptedModel({1: -30.0, 2: -30.0}, positions="sinusoidal", max_positions=6)
    hyps = beam_search(sinusoidal, batch(src_of(1, 2), src_of(2, 5)), DecodeConfig(beam=2, max_len_a=0.0,
                                                                                  max_len_b=10**6))
    assert [len(h[0].tokens) for h in hyps] == [5, 5]


# ---- batches: finished sentences leave, results equal decoding alone -----------------------------


def test_finished_sentences_leave_the_batch_and_results_match_decoding_alone():
    """Sentence 1 (EOS_SCRIPT) is done after step 2; sentence 7 never ends before its maximum
    length floor(1.0 * 6 + 0) = 6, so steps 3..6 run on its 2 hypotheses only (step 0 runs one row
    per sentence: every hypothesis is `<s>` then)."""
    scripts = {1: EOS_SCRIPT, 7: -30.0}
    model = ScriptedModel(scripts)
    both = beam_search(model, batch(src_of(1, 3), src_of(7, 6)), DecodeConfig(beam=2, max_len_a=1.0,
                                                                              max_len_b=0))
    assert model.batch_sizes == [2, 4, 4, 2, 2, 2, 2]
    alone = [beam_search(ScriptedModel(scripts), batch(src), DecodeConfig(beam=2, max_len_a=1.0,
                                                                          max_len_b=0))[0]
             for src in (src_of(1, 3), src_of(7, 6))]
    assert [[h.tokens for h in hs] for hs in both] == [[h.tokens for h in hs] for hs in alone]
    for hs, ref in zip(both, alone, strict=True):
        assert [h.score for h in hs] == pytest.approx([h.score for h in ref], abs=1e-5)
    assert [len(h.tokens) for h in both[1]] == [6, 6]


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    eos_logits=st.lists(st.floats(-3.0, 2.0), min_size=4, max_size=4),
    beam=st.integers(1, 4),
    alpha=st.sampled_from([0.0, 0.6, 1.0]),
    kind=st.sampled_from(["fairseq", "gnmt"]),
    min_len=st.integers(0, 2),
    max_len_a=st.sampled_from([0.5, 1.0, 2.0]),
)
def test_batched_equals_alone_and_beam1_equals_greedy(lengths, eos_logits, beam, alpha, kind, min_len, max_len_a):
    scripts = {10 + i: eos_logits[i] for i in range(len(lengths))}
    options = dict(length_penalty=alpha, length_penalty_kind=kind, min_len=min_len, max_len_a=max_len_a, max_len_b=1)
    srcs = [src_of(10 + i, n) for i, n in enumerate(lengths)]
    batched = beam_search(ScriptedModel(scripts), batch(*srcs), DecodeConfig(beam=beam, **options))
    for src, hyps in zip(srcs, batched, strict=True):
        (alone,) = beam_search(ScriptedModel(scripts), batch(src), DecodeConfig(beam=beam, **options))
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-5)
        assert 1 <= len(hyps) <= beam
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert PAD not in h.tokens and BOS not in h.tokens and EOS not in h.tokens
            assert len(h.positional_scores) == len(h.tokens) + 1
            assert len(h.tokens) >= min(min_len, int(max_len_a * len(src) + 1))
    if beam == 1:  # beam_search used the greedy path; the general search must agree exactly
        general = _beam_search(ScriptedModel(scripts), batch(*srcs), DecodeConfig(beam=1, **options))
        assert _exact(general) == _exact(batched)


# ---- a real (tiny, random) Transformer ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(3)
    cfg = from_dict(ModelConfig, {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2,
                                  "src_vocab_size": 40, "tgt_vocab_size": 40, "output_bias": True,
                                  "encoder": {"kind": "transformer", "attention_branches": 2},
                                  "decoder": {"kind": "transformer", "attention_branches": 2}})
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        model.output_bias[EOS] = 1.5  # some hypotheses end early, others run to the limit
    return model


def _on(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The module's model on `device`: itself on the CPU, else a copy there (the fixture is shared)."""
    return model if device.type == "cpu" else copy.deepcopy(model).to(device)


def _sources(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (n,), generator=g).tolist()
    return [torch.randint(4, 40, (k - 1,), generator=g).tolist() + [EOS] for k in lengths]


def test_real_model_beam1_equals_greedy_exactly(tiny_model, device):
    tiny_model, src = _on(tiny_model, device), batch(*_sources(8), device=device)
    options = dict(length_penalty=0.6, length_penalty_kind="gnmt", max_len_a=1.0, max_len_b=3)
    beam1 = _beam_search(tiny_model, src, DecodeConfig(beam=1, **options))  # the general search with one beam
    greedy = greedy_search(tiny_model, src, DecodeConfig(**options))
    assert _exact(beam1) == _exact(greedy)
    assert _exact(beam_search(tiny_model, src, DecodeConfig(beam=1, **options))) == _exact(greedy)
    assert len({len(hs[0].tokens) for hs in greedy}) > 1  # lengths vary: EOS is really generated


@pytest.mark.parametrize("beam", [1, 4])
def test_real_model_batched_equals_one_sentence_at_a_time(tiny_model, beam, device):
    tiny_model, sources = _on(tiny_model, device), _sources(8, seed=1)
    cfg = DecodeConfig(beam=beam, nbest=beam, length_penalty=1.0, max_len_a=1.0, max_len_b=3)
    batched = search(tiny_model, batch(*sources, device=device), cfg)
    lengths = set()
    for src, hyps in zip(sources, batched, strict=True):
        (alone,) = search(tiny_model, batch(src, device=device), cfg)
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-5)
        lengths.add(len(hyps[0].tokens))
    assert len(lengths) > 1


def _repeats(tokens: list[int], n: int) -> set[int]:
    """The tokens that would complete an n-gram `tokens` already holds (plain Python)."""
    if n < 1 or len(tokens) < n:
        return set()
    grams = {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}
    tail = tuple(tokens[len(tokens) - n + 1 :])
    return {gram[-1] for gram in grams if gram[:-1] == tail}


def _reference_beam(model, src: list[int], beam: int, alpha: float, max_len: int,
                    no_repeat: int = 0) -> list[tuple[list[int], float]]:
    """The search written the plain way, for one sentence: a Python list of hypotheses, a full
    teacher-forced forward of every prefix per step (no cache, no batching), fairseq's rules
    (2K candidates; EOS among the top K finishes; K non-EOS continue; at the limit EOS is forced;
    pad/bos never; no token completing a repeated `no_repeat`-gram; done at K finished).
    Returns (tokens, normalised score), best first."""
    live: list[tuple[list[int], float]] = [([], 0.0)]
    finished: list[tuple[list[int], float]] = []
    device = next(model.parameters()).device
    source = torch.tensor([src], device=device)
    for step in range(max_len + 1):
        candidates = []  # (score, hypothesis index, token)
        for i, (toks, score) in enumerate(live):
            logits = model(source, torch.tensor([[BOS] + toks], device=device))[0, -1].float().cpu()
            logits[PAD] = logits[BOS] = float("-inf")
            lprobs = torch.log_softmax(logits, dim=-1)
            for token in _repeats(toks, no_repeat):
                lprobs[token] = float("-inf")
            if step == max_len:  # only EOS at the limit
                candidates.append((score + lprobs[EOS].item(), i, EOS))
                continue
            candidates += [(score + lp, i, t) for t, lp in enumerate(lprobs.tolist()) if lp > float("-inf")]
        candidates.sort(key=lambda c: -c[0])
        candidates = candidates[: 2 * beam]
        for score, i, token in candidates[:beam]:
            if token == EOS and len(finished) < beam:
                finished.append((live[i][0], score / (step + 1) ** alpha))
        if len(finished) >= beam or step == max_len:
            break
        live = [(live[i][0] + [t], s) for s, i, t in candidates if t != EOS][:beam]
    return sorted(finished, key=lambda h: -h[1])


@pytest.mark.parametrize("block", [None, 3])
def test_real_model_search_equals_a_plain_reference_search(tiny_model, device, block, monkeypatch):
    """The batched, cached search (shared encoder rows, step 0 on one row per sentence, finished
    sentences leaving the batch) finds what the plain per-sentence search above finds (the reference's
    forwards on the same device, its bookkeeping on the CPU). block=3: the candidates are found in
    blocks of 3 tokens (`candidates.top_candidates`; the default block is too wide for 40 tokens)."""
    if block is not None:
        monkeypatch.setattr(candidates, "BLOCK", block)
    tiny_model, sources, beam, alpha = _on(tiny_model, device), _sources(6, seed=4), 3, 1.0
    cfg = DecodeConfig(beam=beam, nbest=beam, length_penalty=alpha, min_len=0, max_len_a=1.0, max_len_b=2)
    with torch.inference_mode():
        batched = search(tiny_model, batch(*sources, device=device), cfg)
        for src, hyps in zip(sources, batched, strict=True):
            expected = _reference_beam(tiny_model, src, beam, alpha, max_len=len(src) + 2)
            assert [h.tokens for h in hyps] == [toks for toks, _ in expected]
            assert [h.score for h in hyps] == pytest.approx([score for _, score in expected], abs=1e-4)
    assert len({len(hs[0].tokens) for hs in batched}) > 1  # EOS is really generated at different steps


# ---- no repeated n-grams ----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(4, 6), min_size=0, max_size=9), min_size=1, max_size=4).filter(
    lambda rows: len({len(r) for r in rows}) == 1), st.integers(1, 4))
def test_block_repeated_ngrams_bans_exactly_what_a_plain_scan_finds(rows, n):
    """Both kinds of step: a host int over the output so far, and a device counter over a longer buffer whose
    columns after the step are not written yet (the fixed-shape engines)."""
    generated = torch.tensor(rows, dtype=torch.long).reshape(len(rows), -1)  # [N, L], tokens from {4, 5, 6}
    N, L = generated.shape
    tokens = torch.cat([torch.full((N, 1), BOS), generated], dim=1)  # [N, 1 + L]
    unwritten = torch.cat([tokens, torch.randint(4, 7, (N, 3))], dim=1)  # [N, 1 + L + 3]: stale tokens after L
    limits = torch.full((N,), 99)
    for state in (StepState(L, tokens, limits), StepState(torch.tensor(L), unwritten, limits)):
        lprobs = NoRepeatNGram(n)(torch.zeros(N, V), state)
        for row, toks in zip(lprobs, rows, strict=True):
            assert {t for t in range(V) if row[t] == float("-inf")} == _repeats(toks, n)


# greedy: a, a, then "a" would repeat the bigram (a, a) -> b; after a, a, b, a both a and b would repeat
# a bigram -> EOS. Without blocking: a a a a and EOS forced at the length limit (max_len_b = 4).
LOOP_SCRIPT: Table = {
    (): {A: 0.9, B: 0.1},
    (A,): {A: 0.6, B: 0.3, EOS: 0.1},
    (A, A): {A: 0.6, B: 0.3, EOS: 0.1},
    (A, A, A): {A: 0.6, B: 0.3, EOS: 0.1},
    (A, A, A, A): {A: 0.6, EOS: 0.4},
    (A, A, B): {A: 0.7, EOS: 0.3},
    (A, A, B, A): {A: 0.5, B: 0.4, EOS: 0.1},
}


@pytest.mark.parametrize(("n", "tokens", "probs"), [
    (0, [A, A, A, A], [0.9, 0.6, 0.6, 0.6, 0.4]),
    (2, [A, A, B, A], [0.9, 0.6, 0.3, 0.7, 0.1]),
])
def test_no_repeat_ngram_size_steers_greedy_off_a_loop_without_renormalising(n, tokens, probs):
    model = ScriptedModel({1: LOOP_SCRIPT})
    (hyps,) = run_search(model, batch(src_of(1, 3)), 1, length_penalty=0.0, max_len_a=0, max_len_b=4,
                         no_repeat_ngram_size=n)
    assert_hyp(hyps[0], tokens, probs, sum(math.log(p) for p in probs))


@pytest.mark.parametrize("n", [1, 2])
def test_real_model_no_repeat_search_equals_the_plain_reference_and_has_no_repeats(tiny_model, n):
    sources, beam, alpha = _sources(6, seed=4), 3, 1.0
    cfg = DecodeConfig(beam=beam, nbest=beam, length_penalty=alpha, min_len=0, max_len_a=1.0, max_len_b=2,
                       no_repeat_ngram_size=n)
    with torch.inference_mode():
        blocked = search(tiny_model, batch(*sources), cfg)
        free = search(tiny_model, batch(*sources), DecodeConfig(**{**vars(cfg), "no_repeat_ngram_size": 0}))
        for src, hyps in zip(sources, blocked, strict=True):
            expected = _reference_beam(tiny_model, src, beam, alpha, max_len=len(src) + 2, no_repeat=n)
            assert [h.tokens for h in hyps] == [toks for toks, _ in expected]
            assert [h.score for h in hyps] == pytest.approx([score for _, score in expected], abs=1e-4)
    def has_repeat(tokens: list[int]) -> bool:
        return any(_repeats(tokens[:i], n) & {tokens[i]} for i in range(len(tokens)))
    assert not any(has_repeat(h.tokens) for hyps in blocked for h in hyps)
    assert any(has_repeat(h.tokens) for hyps in free for h in hyps)  # the blocking had something to do


def test_no_repeat_ngram_size_must_not_be_negative():
    with pytest.raises(ConfigError, match="no_repeat_ngram_size=-1"):
        DecodeConfig(no_repeat_ngram_size=-1).validate()
