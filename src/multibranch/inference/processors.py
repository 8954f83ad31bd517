"""The decoding rules, each written once: score processors over a step's [rows, V] scores, and the length penalty.

Every engine (the beam search and greedy search of `beam`, the fixed-shape search of `static_beam`, both samplers
of `sampling`) builds its lists with `processors_for` and `sampling_processors` and applies them to the step's
scores with `apply_processors`, as Hugging Face's `LogitsProcessorList` does. A processor takes the scores and the
step's `StepState` and returns the scores, changed in place where it can.

The rules (`processors_for`, applied in this order) set scores to -inf or keep them, so they mean the same on
log-probabilities and on logits whose log-sum-exp is subtracted later (the CPU search's deferred normalisation):

- `NoRepeatNGram`: a token that would complete an n-gram the row already holds is blocked (fairseq's
  --no-repeat-ngram-size, OpenNMT's block_ngram_repeat);
- `MinLength`: EOS is blocked before `min_len` output tokens, except on rows at their length limit;
- `LengthLimit`: a row at its length limit may only produce EOS, with its own score (the limit wins over
  min_len, as in fairseq);
- `TargetPrefix`: a row still inside its target prefix may only produce the prefix token, with the model's score
  for it; it is applied around the rules above, which it overrides (fairseq's --prefix-size semantics).

Sampling then draws from the rules' log-probabilities reshaped by `sampling_processors` (on a copy: the
hypotheses are scored with the rules' log-probabilities): `Temperature`, `TopK`, `TopP`, each renormalising, the
order of Hugging Face's `generate`.

Each processor works with both kinds of step: a host int (the engines whose batch shrinks, which may read the
device, and skip a rule at a step where it cannot apply) or a 0-dim long tensor on the device (the fixed-shape
engines, whose steps a CUDA graph replays: then every rule is dense tensor operations, with no host read).

A new decoding option is its `DecodeConfig` field with its line in `DECODE_OPTIONS`, its processor here (added by
`processors_for` or `sampling_processors`) and its CTranslate2 mapping (`tasks/translation/ct2.py`, `CT2_MAPPING`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, overload

import torch
from torch import Tensor

from multibranch.errors import ConfigError

if TYPE_CHECKING:
    from multibranch.experiment.decoding import DecodeConfig

LengthPenaltyKind = Literal["fairseq", "gnmt"]
NEG_INF = float("-inf")


@dataclass
class StepState:
    """What the processors read at a step; each engine fills one (the fixed-shape ones once, with their buffers).

    step: output tokens so far (the index of the token being chosen): a host int, or a 0-dim long tensor on the
      device that the engine advances in place.
    tokens: [N, 1 + T] BOS, then the output so far (columns after `step` are not written yet).
    limits: [N] each row's maximum output length (tokens before EOS).
    prefix: [N, P] each row's forced first output tokens, padded with the pad id (None: no prefixes).
    """

    step: int | Tensor
    tokens: Tensor
    limits: Tensor
    prefix: Tensor | None = None


class ScoreProcessor(Protocol):
    """One decoding rule: scores [N, V] -> scores [N, V], in place where it can."""

    def __call__(self, scores: Tensor, state: StepState) -> Tensor: ...


def apply_processors(processors: Sequence[ScoreProcessor], scores: Tensor, state: StepState) -> Tensor:
    """scores [N, V] through every processor in order."""
    for processor in processors:
        scores = processor(scores, state)
    return scores


# ---- the rules of the search's distribution ----------------------------------------------------------------


class NoRepeatNGram:
    """-inf for every token that would complete an n-gram already in its row's output (n >= 1).

    The candidate n-gram is the last n - 1 output tokens + the next one; BOS never repeats, so n-grams through it
    cannot either. The hits are scattered with a minimum (-inf for a hit, +inf for a miss), so a token that ends
    several n-grams needs no bookkeeping and the work is O(N * T), not O(N * V)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, scores: Tensor, state: StepState) -> Tensor:
        n, step = self.n, state.step
        generated = state.tokens[:, 1:]  # [N, T]
        if isinstance(step, int):
            if step < n:
                return scores
            generated = generated[:, :step]  # the output so far
        elif generated.shape[1] < n:
            return scores
        device = scores.device
        windows = generated.unfold(1, n, 1)  # [N, W, n] every n-gram of the buffer
        last = (step - (n - 1) + torch.arange(n - 1, device=device)).clamp(min=0)  # [n - 1]
        context = generated.index_select(1, last)  # [N, n - 1] the tokens the next one would follow
        match = windows[:, :, :-1].eq(context[:, None, :]).all(dim=2)  # [N, W]
        match &= torch.arange(windows.shape[1], device=device) <= step - n  # n-grams complete before this step
        hits = torch.full(match.shape, math.inf, dtype=scores.dtype, device=device).masked_fill_(match, NEG_INF)
        return scores.scatter_reduce_(1, windows[:, :, -1], hits, reduce="amin")


class MinLength:
    """-inf for EOS before `min_len` output tokens, except on rows at their length limit (`LengthLimit` wins)."""

    def __init__(self, min_len: int, eos_id: int) -> None:
        self.min_len, self.eos = min_len, eos_id

    def __call__(self, scores: Tensor, state: StepState) -> Tensor:
        step = state.step
        if isinstance(step, int) and step >= self.min_len:
            return scores
        early = (step < self.min_len) & (step < state.limits)  # [N]
        scores[:, self.eos].masked_fill_(early, NEG_INF)
        return scores


class LengthLimit:
    """A row at its length limit (step >= limits) may only produce EOS, which keeps its score."""

    def __init__(self, eos_id: int) -> None:
        self.eos = eos_id

    def __call__(self, scores: Tensor, state: StepState) -> Tensor:
        forced = state.limits <= state.step  # [N]
        if isinstance(state.step, int) and not bool(forced.any()):
            return scores
        eos_value = scores[:, self.eos].clone()  # [N]
        scores.masked_fill_(forced[:, None], NEG_INF)
        scores[:, self.eos] = eos_value
        return scores


class TargetPrefix:
    """A row whose prefix has a token at this step may only produce that token, with the score the model gives it
    before `rules` (applied in between) mask anything: a forced token overrides them."""

    def __init__(self, rules: Sequence[ScoreProcessor], pad_id: int) -> None:
        self.rules, self.pad = list(rules), pad_id

    def __call__(self, scores: Tensor, state: StepState) -> Tensor:
        prefix, step = state.prefix, state.step
        if prefix is None or (isinstance(step, int) and step >= prefix.shape[1]):
            return apply_processors(self.rules, scores, state)
        if isinstance(step, int):
            wanted = prefix[:, step : step + 1]  # [N, 1]
        else:
            wanted = prefix.gather(1, step.expand(prefix.shape[0], 1))  # [N, 1]
        inside = wanted.ne(self.pad)  # [N, 1] rows still inside their prefix
        value = scores.gather(1, wanted)  # [N, 1] before any rule
        scores = apply_processors(self.rules, scores, state)
        scores.masked_fill_(inside, NEG_INF)
        return scores.scatter_(1, wanted, torch.where(inside, value, scores.gather(1, wanted)))


def processors_for(cfg: DecodeConfig, eos_id: int, pad_id: int, *, prefixed: bool = False) -> list[ScoreProcessor]:
    """The rules `cfg` sets on the search's distribution (no_repeat_ngram_size, min_len, the length limit), in
    order, wrapped in `TargetPrefix` when the rows have target prefixes."""
    rules: list[ScoreProcessor] = []
    if cfg.no_repeat_ngram_size:
        rules.append(NoRepeatNGram(cfg.no_repeat_ngram_size))
    if cfg.min_len:
        rules.append(MinLength(cfg.min_len, eos_id))
    rules.append(LengthLimit(eos_id))
    return [TargetPrefix(rules, pad_id)] if prefixed else rules


# ---- sampling's distribution ------------------------------------------------------------------------------


class Temperature:
    """log-probabilities [N, V] -> log_softmax(scores / temperature) (renormalised after the rules' masks)."""

    def __init__(self, temperature: float) -> None:
        if not (math.isfinite(temperature) and temperature > 0):
            raise ConfigError(f"temperature={temperature} must be a finite number > 0 (1: the model's distribution)")
        # DecodeConfig bounds it to [0.001, 1000]: log-probabilities divided by it stay finite in fp32
        self.temperature = temperature

    def __call__(self, scores: Tensor, state: StepState) -> Tensor:
        if self.temperature != 1.0:
            scores.div_(self.temperature)
        return torch.log_softmax(scores, dim=-1, out=scores)


class TopK:
    """-inf outside each row's k best tokens (ties at the boundary: whichever torch.topk returns), renormalised."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, scores: Tensor, state: StepState) -> Tensor:
        if self.k >= scores.shape[-1]:
            return scores
        best = scores.topk(self.k, dim=-1).indices  # [N, k]
        keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, best, True)  # [N, V]
        scores.masked_fill_(~keep, NEG_INF)
        return torch.log_softmax(scores, dim=-1, out=scores)


class TopP:
    """-inf outside each row's smallest set of best tokens whose probability reaches p (nucleus), renormalised.
    Scores must be normalised log-probabilities."""

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, scores: Tensor, state: StepState) -> Tensor:
        ranked, order = scores.sort(dim=-1, descending=True)  # [N, V]
        probs = ranked.exp()
        before = probs.cumsum(dim=-1) - probs  # the probability of the tokens ranked above
        drop_ranked = before >= self.p
        drop_ranked[:, 0] = False  # the best token always stays (even where p rounds to 0 in the scores' dtype)
        drop = torch.zeros_like(drop_ranked).scatter_(1, order, drop_ranked)  # [N, V]
        scores.masked_fill_(drop, NEG_INF)
        return torch.log_softmax(scores, dim=-1, out=scores)


def sampling_processors(cfg: DecodeConfig) -> list[ScoreProcessor]:
    """Sampling's reshaping of the search's log-probabilities: temperature (always: it renormalises), then top_k
    (0: none) and top_p (1.0: none). ConfigError for a temperature that is not a finite number > 0."""
    processors: list[ScoreProcessor] = [Temperature(cfg.temperature)]
    if cfg.top_k > 0:
        processors.append(TopK(cfg.top_k))
    if cfg.top_p < 1.0:
        processors.append(TopP(cfg.top_p))
    return processors


# ---- finished hypotheses ----------------------------------------------------------------------------------


@overload
def length_penalty(length: int, alpha: float, kind: LengthPenaltyKind = "fairseq") -> float: ...
@overload
def length_penalty(length: Tensor, alpha: float, kind: LengthPenaltyKind = "fairseq") -> Tensor: ...
def length_penalty(length: int | Tensor, alpha: float, kind: LengthPenaltyKind = "fairseq") -> float | Tensor:
    """Divisor of a finished hypothesis' log-probability; `length` counts its tokens including EOS (an int, or a
    long tensor of lengths -> float64).

    fairseq: len^alpha.  gnmt (Wu et al. 2016, OpenNMT): ((5 + len) / 6)^alpha.  alpha = 0 -> 1.
    """
    value = length.double() if isinstance(length, Tensor) else float(length)
    if kind == "fairseq":
        return value**alpha
    if kind == "gnmt":
        return ((5.0 + value) / 6.0) ** alpha
    raise ValueError(f"unknown length penalty kind {kind!r} (expected 'fairseq' or 'gnmt')")
