"""Beam search and greedy decoding with fairseq's semantics, batch-first, on the decoder's KV cache.

Beam search keeps `beam` live hypotheses per sentence in one [sentences * beam] batch. Each step:

1. `model.decode_step` -> logits [b*K, V]; pad and bos logits are masked to -inf before an fp32
   log_softmax, so they are never generated and the log-probabilities are normalised over the
   other tokens (fairseq masks pad after its log_softmax; the difference is the tiny mass a
   trained model gives pad/bos). The decoding rules of `processors.processors_for` then apply
   (without renormalising): EOS masked before `min_len` output tokens, EOS the only choice once a
   sentence reaches its maximum length, n-gram blocking with `no_repeat_ngram_size` n > 0
   (fairseq's --no-repeat-ngram-size, OpenNMT's block_ngram_repeat), target prefixes.
2. Every live hypothesis extends by every token; the 2K best candidates per sentence are kept
   (at step 0 all K hypotheses are identical, so only the first one is expanded), found without
   forming the [K * V] sums (`candidates.top_candidates`). On the CPU with `cpu_kernels` built, the
   log_softmax of step 1 is deferred: the masks apply to the logits, a kernel computes each row's
   log-sum-exp, and the candidate search adds (score - log-sum-exp) to the logits, so the [b*K, V]
   log-probabilities are never written (`_step_scores`; greedy search takes the same path).
3. A candidate ending in EOS among the top K candidates is a finished hypothesis. A sentence is
   done when it has K finished hypotheses (fairseq's rule: no search for better, longer ones) or
   reaches its maximum length, where every live hypothesis is forced to end with EOS.
4. The K best candidates *not* ending in EOS continue. Done sentences leave the batch
   (`EncoderOut.index_select` + `DecoderState.reorder`), so late steps only compute the rest;
   otherwise hypotheses are reordered within their sentence (`reorder_within_sentences`).

The encoder output keeps one row per sentence: the decoder's cross-attention shares it (and its
cached keys/values) between the sentence's hypotheses rather than copying it K times, and step 0
decodes one row per sentence (the K hypotheses are all `<s>` then) and fans out to K afterwards.

A target prefix (`prefix` [B, P], right-padded with pad_id) forces sentence b's first output tokens:
while step < its prefix length, every token but prefix[b, step] is masked, and that token keeps the
log-probability the model gives it (fairseq's --prefix-size semantics, also over EOS masking and
n-gram blocking: `processors.TargetPrefix`); the search goes on from there. A prefix longer than the
sentence's maximum output length is a ValueError.

Finished scores are normalised by a length penalty (`processors.length_penalty`); raw cumulative
log-probabilities rank candidates during the search. `beam == 1` runs `greedy_search`, which takes
the argmax without candidate bookkeeping and returns exactly what the beam search would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from multibranch import cpu_kernels
from multibranch.inference.candidates import top_candidates
from multibranch.inference.processors import (
    NEG_INF,
    ScoreProcessor,
    StepState,
    apply_processors,
    length_penalty,
    processors_for,
)
from multibranch.modules.state import DecoderState

if TYPE_CHECKING:
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.models.seq2seq import EncoderOut


class Decodable(Protocol):
    """What the search needs from a model (Seq2SeqModel, or a scripted fake in tests)."""

    config: object  # pad_id, bos_id, eos_id, positions, max_positions

    def encode(self, src: Tensor) -> EncoderOut: ...

    def decode_step(self, tokens: Tensor, enc: EncoderOut, state: DecoderState) -> Tensor:
        """tokens [N, 1] -> logits [N, V]; `enc` has N / g rows when g consecutive rows (a sentence's
        hypotheses) share one source row, and the state's static caches then hold one row per source."""
        ...


def new_state(model: Decodable) -> DecoderState:
    """The empty decoder state of a model: its own kind when it makes one (an ensemble keeps one state
    per member), else a plain DecoderState."""
    make = getattr(model, "new_state", None)
    return make() if make is not None else DecoderState()


def check_prefix(prefix: Tensor | None, max_lens: Tensor, pad_id: int) -> None:
    """ValueError when a prefix [B, P] (pad_id-padded) is longer than its sentence's max_lens [B]."""
    if prefix is None:
        return
    lengths = prefix.ne(pad_id).sum(dim=1)  # [B]
    over = lengths.gt(max_lens).nonzero().squeeze(1).tolist()
    if over:
        b = over[0]
        raise ValueError(f"sentence {b}: its prefix has {int(lengths[b])} tokens but at most "
                         f"{int(max_lens[b])} output tokens are allowed")


@dataclass
class Hypothesis:
    """One finished translation: tokens without EOS, length-normalised score, and the
    log-probability of every output token (including the final EOS, so len = len(tokens) + 1)."""

    tokens: list[int]
    score: float
    positional_scores: list[float]


def max_output_lengths(model: Decodable, src: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """Per sentence, the most output tokens before EOS: floor(a * src_len + b) [B] long.

    src_len counts non-pad source tokens (EOS included). The model's `max_positions` caps the output at
    max_positions - 1 tokens (the EOS needs the last position), whatever its kind of positions: learned ones
    end there, and a sinusoidal table would extend past what the model was trained on.
    """
    return length_limits(model.config, src.ne(model.config.pad_id).sum(dim=1), max_len_a, max_len_b)


def length_limits(cfg: object, src_lens: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """`max_output_lengths` from the source lengths src_lens [B] (EOS included) and a model config."""
    positions = getattr(cfg, "max_positions", None)
    cap = positions - 1 if positions is not None else 2**31 - 1
    # clamped in float64 before the cast, so that a huge a or b (a request's 1e20) gives the cap, not an overflow
    return torch.floor(max_len_a * src_lens.double() + float(max_len_b)).clamp(min=0, max=cap).long()


def output_limits(model: Decodable, src: Tensor, options: DecodeConfig, prefix: Tensor | None) -> tuple[Tensor, int]:
    """Each sentence's output length limit [B] under `options`' max_len_a/b (checked against its forced `prefix`, if
    any) and the number of decoding steps a batch of them needs (the longest limit + EOS; 0 for an empty batch)."""
    max_lens = max_output_lengths(model, src, options.max_len_a, options.max_len_b)  # [B]
    check_prefix(prefix, max_lens, model.config.pad_id)
    return max_lens, (int(max_lens.max()) + 1 if src.shape[0] else 0)


def masked_logits(logits: Tensor, cfg: object) -> Tensor:
    """logits [..., V] -> fp32 [..., V] with pad and bos set to -inf (in place when `logits` is fp32)."""
    logits = logits.float()
    logits[..., cfg.pad_id] = NEG_INF  # type: ignore[attr-defined]
    logits[..., cfg.bos_id] = NEG_INF  # type: ignore[attr-defined]
    return logits


def normalized_log_probs(logits: Tensor, cfg: object) -> Tensor:
    """logits [..., V] -> fp32 log-probabilities [..., V] with pad and bos masked to -inf *before*
    the log_softmax (the search's distribution; forced scoring uses the same one). fp32 `logits`
    are overwritten: masked, then normalised in place (the [rows, V] buffer is written once instead of
    being copied into a new one: ~25% less time for this log_softmax on the CPU)."""
    logits = masked_logits(logits, cfg)
    return torch.log_softmax(logits, dim=-1, out=logits)


@torch.inference_mode()
def forced_scores(model: torch.nn.Module, src: Tensor, targets: list[list[int]]) -> list[list[float]]:
    """Teacher-forced log-probabilities of given outputs: src [B, S] (right-padded), `targets[b]` the
    output ids of sentence b *including* the final EOS. One batched forward over source and
    reference; returns per sentence the log-probability of every target token (len = len(targets[b])),
    under the same distribution as the search (pad/bos masked before the log_softmax).
    """
    cfg = model.config
    B, T = len(targets), max((len(t) for t in targets), default=0)
    if B == 0 or T == 0:
        return [[] for _ in targets]
    tgt = torch.full((B, T), cfg.pad_id, dtype=torch.long, device=src.device)  # [B, T]
    for row, ids in enumerate(targets):
        tgt[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    prev = torch.cat([torch.full((B, 1), cfg.bos_id, dtype=torch.long, device=src.device), tgt[:, :-1]], dim=1)
    prev = prev.masked_fill(tgt.eq(cfg.pad_id), cfg.pad_id)  # [B, T] bos + target shifted right
    lprobs = normalized_log_probs(model(src, prev), cfg)  # [B, T, V]
    gathered = lprobs.gather(2, tgt.unsqueeze(2)).squeeze(2)  # [B, T]
    return [gathered[row, : len(ids)].tolist() for row, ids in enumerate(targets)]


def _step_scores(
    model: Decodable,
    enc: EncoderOut,
    state: DecoderState,
    processors: Sequence[ScoreProcessor],
    step_state: StepState,
    deferred: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """One decoding step of the rows of `step_state` (its tokens [N, 1 + T]: BOS + output so far, column `step`
    the last one) -> (values [N, V], offset [N] or None): the step's fp32 log-probabilities, through `processors`,
    are values - offset (values alone when offset is None).

    `deferred` (the searches) on fp32 CPU logits with the CPU kernels built: values are the masked logits and
    offset their log-sum-exp per row (`cpu_kernels` row_logsumexp), so the [N, V] log-probabilities are never
    written; the candidate search folds the offset into the hypotheses' scores. Otherwise values are the
    log-probabilities themselves (log_softmax in place) and offset None. The processors set values to -inf or keep
    them, so they mean the same on either kind."""
    step = step_state.step
    logits = model.decode_step(step_state.tokens[:, step : step + 1], enc, state)  # [N, V]
    offset = None
    if deferred and cpu_kernels.usable(logits) and logits.is_contiguous() and logits.numel():
        values = masked_logits(logits, model.config)
        offset = cpu_kernels.kernels().row_logsumexp(values)  # [N]
    else:
        values = normalized_log_probs(logits, model.config)
    return apply_processors(processors, values, step_state), offset


def _finish(
    hyps: list[list[Hypothesis]],
    sentences: list[int],
    tokens: Tensor,
    positional: Tensor,
    scores: list[float],
    length: int,
    options: DecodeConfig,
    cap: int,
) -> None:
    """Store finished hypotheses (bookkeeping, not the hot path): tokens [n, length-1] (no EOS),
    positional [n, length] (with EOS), raw scores normalised by `options`' length penalty; sentence s keeps
    at most `cap` of them."""
    divisor = length_penalty(length, options.length_penalty, options.length_penalty_kind)
    for sent, toks, pos, raw in zip(sentences, tokens.tolist(), positional.tolist(), scores, strict=True):
        if len(hyps[sent]) < cap:
            hyps[sent].append(Hypothesis(toks, raw / divisor, pos))


def best_first(hyps: list[list[Hypothesis]], nbest: int | None) -> list[list[Hypothesis]]:
    """Each sentence's hypotheses, best score first (ties keep the order they were found in), at most `nbest`."""
    return [sorted(h, key=lambda x: x.score, reverse=True)[:nbest] for h in hyps]


@torch.inference_mode()
def greedy_search(model: Decodable, src: Tensor, options: DecodeConfig, *,
                  prefix: Tensor | None = None) -> list[list[Hypothesis]]:
    """Argmax decoding of src [B, S] under `options` (its beam is not read); one hypothesis per sentence
    (== beam search, beam 1)."""
    cfg = model.config
    B = src.shape[0]
    device = src.device
    max_lens, steps = output_limits(model, src, options, prefix)  # [B], decoding steps
    enc = model.encode(src)
    state = new_state(model)
    tokens = torch.full((B, steps + 1), cfg.pad_id, dtype=torch.long, device=device)  # [b, 1 + T]
    tokens[:, 0] = cfg.bos_id
    positional = torch.zeros(B, steps, device=device)  # [b, T] log-probs of the chosen tokens
    scores = torch.zeros(B, device=device)  # [b] cumulative
    alive = torch.arange(B, device=device)  # original index of each live sentence
    hyps: list[list[Hypothesis]] = [[] for _ in range(B)]
    processors = processors_for(options, cfg.eos_id, cfg.pad_id, prefixed=prefix is not None)
    for step in range(steps):
        rows_prefix = None if prefix is None else prefix[alive]  # [b, P]
        values, offset = _step_scores(model, enc, state, processors, StepState(step, tokens, max_lens, rows_prefix),
                                      deferred=True)
        best_lprob, best = values.max(dim=-1)  # [b]
        if offset is not None:
            best_lprob = best_lprob - offset
        scores = scores + best_lprob
        ended = best.eq(cfg.eos_id) & best_lprob.gt(NEG_INF)  # [b]
        if ended.any():
            rows = ended.nonzero().squeeze(1)
            pos = torch.cat([positional[rows, :step], best_lprob[rows, None]], dim=1)  # [n, step + 1]
            _finish(hyps, alive[rows].tolist(), tokens[rows, 1 : step + 1], pos, scores[rows].tolist(),
                    step + 1, options, 1)
            keep = (~ended).nonzero().squeeze(1)  # [b']
            if keep.numel() == 0:
                break
            enc = enc.index_select(keep)
            state.reorder(keep)
            tokens, positional, scores = tokens[keep], positional[keep], scores[keep]
            alive, max_lens, best, best_lprob = alive[keep], max_lens[keep], best[keep], best_lprob[keep]
        tokens[:, step + 1] = best
        positional[:, step] = best_lprob
    return hyps


def beam_search(model: Decodable, src: Tensor, options: DecodeConfig, *, nbest: int | None = None,
                prefix: Tensor | None = None) -> list[list[Hypothesis]]:
    """Beam search over src [B, S] (right-padded with pad_id) with `options` (the beam, length penalty, length
    limits, min length, n-gram blocking); `prefix` [B, P] forces output prefixes.

    Returns per sentence its finished hypotheses (up to `nbest`, default all: `options.beam`), best first.
    `options.beam == 1` is delegated to `greedy_search` (same result, less bookkeeping).
    """
    if options.beam < 1:
        raise ValueError(f"beam={options.beam} must be >= 1")
    if options.beam == 1:
        return greedy_search(model, src, options, prefix=prefix)
    return best_first(_beam_search(model, src, options, prefix=prefix), nbest)


@torch.inference_mode()
def _beam_search(model: Decodable, src: Tensor, options: DecodeConfig, *,
                 prefix: Tensor | None = None) -> list[list[Hypothesis]]:
    """The general search for any beam >= 1 (tests compare its beam-1 result with greedy_search);
    finished hypotheses per sentence in the order they were found."""
    cfg = model.config
    eos = cfg.eos_id
    K = options.beam
    B = src.shape[0]
    device = src.device
    max_lens, steps = output_limits(model, src, options, prefix)  # [B], decoding steps
    enc = model.encode(src)  # [b, S, d]: one row per sentence, shared by its hypotheses
    state = new_state(model)
    # `width` hypotheses per live sentence: 1 at step 0 (all K would be the same <s>), then K
    tokens = torch.full((B, steps + 1), cfg.pad_id, dtype=torch.long, device=device)  # [b*width, 1 + T]
    tokens[:, 0] = cfg.bos_id
    positional = torch.zeros(B, steps, device=device)  # [b*width, T]
    scores = torch.zeros(B, 1, device=device)  # [b, width] cumulative log-probabilities
    alive = torch.arange(B, device=device)  # original index of each live sentence
    finished = torch.zeros(B, dtype=torch.long, device=device)  # [b] finished hypotheses so far
    hyps: list[list[Hypothesis]] = [[] for _ in range(B)]
    processors = processors_for(options, eos, cfg.pad_id, prefixed=prefix is not None)

    for step in range(steps):
        b = alive.numel()
        width = scores.shape[1]
        rows_prefix = None if prefix is None else prefix[alive].repeat_interleave(width, dim=0)  # [b*width, P]
        step_state = StepState(step, tokens, max_lens.repeat_interleave(width), rows_prefix)
        values, offset = _step_scores(model, enc, state, processors, step_state, deferred=True)
        # values [b*width, V]: log-probabilities = values - offset
        V = values.shape[1]
        n_cand = min(2 * K, width * V)
        offset = None if offset is None else offset.view(b, width)
        base = scores if offset is None else scores - offset  # [b, width]
        cand_scores, cand_index = top_candidates(values.view(b, width, V), base, n_cand)  # [b, C], best first
        cand_beam = torch.div(cand_index, V, rounding_mode="floor")  # [b, C]
        cand_token = cand_index - cand_beam * V  # [b, C]
        cand_lprob = values.view(b, width * V).gather(1, cand_index)  # [b, C] (beam-major flat index)
        if offset is not None:  # the log-probabilities, and the scores as score + log-probability (as greedy's)
            cand_lprob = cand_lprob - offset.gather(1, cand_beam)
            cand_scores = scores.gather(1, cand_beam) + cand_lprob
        cand_eos = cand_token.eq(eos)  # [b, C]

        # 1. EOS among the top K candidates: finished hypotheses (a loop over those only)
        final = cand_eos[:, :K] & cand_scores[:, :K].gt(NEG_INF)  # [b, min(C, K)]
        if final.any():
            sent, cand = final.nonzero(as_tuple=True)  # in candidate (= score) order per sentence
            rows = sent * width + cand_beam[sent, cand]
            pos = torch.cat([positional[rows, :step], cand_lprob[sent, cand, None]], dim=1)  # [n, step + 1]
            _finish(hyps, alive[sent].tolist(), tokens[rows, 1 : step + 1], pos, cand_scores[sent, cand].tolist(),
                    step + 1, options, K)
            finished = (finished + final.sum(dim=1)).clamp(max=K)
        done = finished.ge(K) | max_lens.le(step)  # [b] K finished, or the length limit reached

        # 2. the K best candidates not ending in EOS continue (EOS sorted behind every other token)
        order_key = torch.arange(n_cand, device=device) + n_cand * cand_eos.long()  # [b, C]
        active = order_key.topk(K, dim=1, largest=False).indices  # [b, K], in score order
        new_scores = cand_scores.gather(1, active)  # [b, K]
        new_tokens = cand_token.gather(1, active)
        new_lprob = cand_lprob.gather(1, active)
        new_scores = new_scores.masked_fill(new_tokens.eq(eos), NEG_INF)  # only when < K non-EOS exist
        source_rows = torch.arange(b, device=device)[:, None] * width + cand_beam.gather(1, active)  # [b, K]

        # 3. drop done sentences, reorder hypotheses (the sentence-level memory follows `keep`)
        if done.any():
            keep = (~done).nonzero().squeeze(1)  # [b']
            if keep.numel() == 0:
                break
            source_rows, new_scores, new_tokens, new_lprob = (
                source_rows[keep], new_scores[keep], new_tokens[keep], new_lprob[keep])
            alive, max_lens, finished = alive[keep], max_lens[keep], finished[keep]
            order = source_rows.reshape(-1)  # [b'*K]
            enc = enc.index_select(keep)
            state.reorder(order, sources=keep)
        else:
            order = source_rows.reshape(-1)  # [b*K]
            state.reorder_within_sentences(order)
        tokens = tokens.index_select(0, order)
        tokens[:, step + 1] = new_tokens.reshape(-1)
        positional = positional.index_select(0, order)
        positional[:, step] = new_lprob.reshape(-1)
        scores = new_scores
    return hyps
