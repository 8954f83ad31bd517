"""Beam search with fixed shapes: the same search as `beam._beam_search`, shaped for a GPU.

`beam._beam_search` shrinks its batch as sentences finish, grows every cache by one position per step and
keeps finished hypotheses in Python lists: each step reads the device several times and allocates new
tensors, which a GPU pays for in launches and synchronisations. Here everything a step touches has one shape
for the whole search, lives on the device and is changed in place:

- rows: sentences * beam, all kept to the end; a finished sentence's rows go on decoding, but nothing they
  produce is recorded. Step 0's single `<s>` hypothesis is a width-K step whose hypotheses 1..K-1 score -inf.
- caches: a `StaticDecoderState` (modules/state.py): keys/values preallocated for the batch's length limit and
  written at a device position counter; cross-attention keys/values computed once.
- masks: EOS before `min_len`, forced EOS at the length limit, target prefixes and n-gram blocking are dense
  tensor operations on the step's [rows, V] scores (no `nonzero`, no boolean indexing).
- bookkeeping: finished hypotheses (tokens, length-normalised score, per-token log-probabilities, length) go
  into [sentences, K + 1, ...] buffers by `scatter` (slot K takes what is not kept), so a step never reads
  back; the host reads one boolean a step (whether every sentence is done) and copies the buffers back once.

A step is therefore a fixed sequence of kernels: `StaticBeamSearch.step` is what a CUDA graph captures and
replays (inference/graphed_search.py runs it, eagerly or replayed). Results equal `beam._beam_search`'s (same candidates, same order of
finished hypotheses; scores to float rounding), which the tests check for every layer kind and option.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from multibranch.inference.beam import (
    NEG_INF,
    Decodable,
    Hypothesis,
    LengthPenaltyKind,
    length_limits,
    normalized_log_probs,
    output_limits,
)
from multibranch.inference.candidates import top_candidates
from multibranch.modules.state import DecoderState, StaticDecoderState

if TYPE_CHECKING:
    from multibranch.experiment.decoding import DecodeConfig


def new_static_state(model: Decodable, capacity: int, device: torch.device) -> DecoderState:
    """The fixed-buffer decoder state of `model` for `capacity` decoding steps (an ensemble: one per member)."""
    make = getattr(model, "new_static_state", None)
    return make(capacity, device) if make is not None else StaticDecoderState(capacity, device)


def reserve_positions(model: Decodable, positions: int) -> None:
    """Grow sinusoidal position tables to `positions` before a search whose steps index them on the device."""
    for member in getattr(model, "members", [model]):
        table = getattr(getattr(getattr(member, "decoder", None), "embed", None), "positions", None)
        if hasattr(table, "reserve"):
            table.reserve(positions)


def length_divisor(length: Tensor, alpha: float, kind: LengthPenaltyKind) -> Tensor:
    """`beam.length_penalty` of a length tensor (EOS included): fairseq len^alpha, gnmt ((5 + len) / 6)^alpha."""
    length = length.double()
    if kind == "fairseq":
        return length.pow(alpha)
    if kind == "gnmt":
        return ((5.0 + length) / 6.0).pow(alpha)
    raise ValueError(f"unknown length penalty kind {kind!r} (expected 'fairseq' or 'gnmt')")


class StaticBeamSearch:
    """A beam search in fixed buffers for batches of up to `rows` sentences of up to `src_len` tokens: `load(src)`
    puts a batch in (the same buffers every time, so a captured step stays valid), `step()` is one search step (no
    host read, no allocation that outlives it), `all_done()` the one read a step, `results()` copies back once.
    Rows beyond the batch hold a one-token filler sentence that is done from the start."""

    def __init__(self, model: Decodable, rows: int, src_len: int, options: DecodeConfig, *, prefixed: bool = False,
                 device: torch.device | str = "cpu") -> None:
        self.model, self.B, self.S, self.K = model, rows, src_len, options.beam
        self.options, self.prefixed = options, prefixed
        self.ngram = options.no_repeat_ngram_size
        cfg = model.config
        self.pad, self.bos, self.eos = cfg.pad_id, cfg.bos_id, cfg.eos_id
        self.device = torch.device(device)
        full_source = torch.tensor([src_len])  # the longest source these buffers take
        limit = length_limits(cfg, full_source, options.max_len_a, options.max_len_b)
        self.steps = int(limit[0]) + 1  # capacity in steps
        self.loaded = 0  # sentences of the current batch
        self.enc: Any = None  # encoder output of the current batch (copied into in place after the first)
        self.state: DecoderState | None = None

    def load(self, src: Tensor, prefix: Tensor | None = None) -> None:
        """Put the batch src [b, s] (b <= rows, s <= src_len; `prefix` [b, P] pad-padded, when built `prefixed`)
        into the buffers and reset the search to step 0. ValueError for a prefix longer than its limit."""
        b, s = src.shape
        B, K, T, device = self.B, self.K, self.steps, self.device
        if b > B or s > self.S or (prefix is not None) != self.prefixed:
            raise ValueError(f"a batch of {b} x {s} (prefix: {prefix is not None}) does not fit buffers of "
                             f"{B} x {self.S} (prefix: {self.prefixed})")
        max_lens, _ = output_limits(self.model, src, self.options, prefix)  # [b]
        source = torch.full((B, self.S), self.pad, dtype=torch.long, device=device)  # [B, S]
        source[:, 0] = self.eos  # filler rows: one token, so no row is all padding
        source[:b, :s] = src
        enc = self.model.encode(source)  # one row per sentence, shared by its K hypotheses
        if self.enc is None:
            self._allocate(enc)
        else:
            _copy_encoder_out(self.enc, enc)
            self.state.reset()  # type: ignore[union-attr]
        self.loaded = b
        self.max_lens.zero_()
        self.max_lens[:b] = max_lens
        self.row_limits.copy_(self.max_lens.repeat_interleave(K))
        if self.row_prefix is not None and prefix is not None:
            padded = torch.full((B, T), self.pad, dtype=torch.long, device=device)
            width = min(prefix.shape[1], T)
            padded[:b, :width] = prefix[:, :width]
            self.row_prefix.copy_(padded.repeat_interleave(K, dim=0))
        self.position.zero_()
        self.tokens.fill_(self.pad)
        self.tokens[:, 0] = self.bos
        self.positional.zero_()
        self.scores.fill_(NEG_INF)
        self.scores[:, 0] = 0.0  # step 0: one hypothesis per sentence (the others are the same <s>)
        self.finished.zero_()
        self.done.zero_()
        self.done[b:] = True
        self.fin_tokens.fill_(self.pad)
        self.fin_positional.zero_()
        self.fin_scores.zero_()
        self.fin_length.zero_()

    def _allocate(self, enc: Any) -> None:
        """Every buffer of the search, once (later batches are copied into them)."""
        B, K, T, device = self.B, self.K, self.steps, self.device
        N = B * K
        reserve_positions(self.model, T + 1)
        self.enc = enc
        self.state = new_static_state(self.model, T, device)
        self.position = torch.zeros((), dtype=torch.long, device=device)  # the step being taken
        self.tokens = torch.full((N, T + 1), self.pad, dtype=torch.long, device=device)  # [N, 1 + T]
        self.positional = torch.zeros(N, T, device=device)  # [N, T] log-probabilities of the chosen tokens
        self.scores = torch.full((B, K), NEG_INF, device=device)  # [B, K] cumulative log-probabilities
        self.max_lens = torch.zeros(B, dtype=torch.long, device=device)  # [B] output limits (fillers: 0)
        self.row_limits = torch.zeros(N, dtype=torch.long, device=device)  # [N]
        self.row_prefix = torch.full((N, T), self.pad, dtype=torch.long, device=device) if self.prefixed else None
        self.finished = torch.zeros(B, dtype=torch.long, device=device)  # [B] finished hypotheses so far
        self.done = torch.zeros(B, dtype=torch.bool, device=device)  # [B] sentence complete
        # finished hypotheses: K slots per sentence and slot K for what is not kept
        self.fin_tokens = torch.full((B, K + 1, T), self.pad, dtype=torch.long, device=device)
        self.fin_positional = torch.zeros(B, K + 1, T, device=device)
        self.fin_scores = torch.zeros(B, K + 1, dtype=torch.float64, device=device)
        self.fin_length = torch.zeros(B, K + 1, dtype=torch.long, device=device)
        self.sentence_rows = torch.arange(B, device=device)[:, None] * K  # [B, 1] first row of each sentence

    # ---- one step ------------------------------------------------------------------------------------

    def step_scores(self) -> Tensor:
        """The step's masked fp32 log-probabilities [N, V], masked as `beam._step_scores` masks them."""
        N = self.B * self.K
        step = self.position
        logits = self.model.decode_step(self.tokens.gather(1, step.expand(N, 1)), self.enc, self.state)  # [N, V]
        values = normalized_log_probs(logits, self.model.config)
        if self.row_prefix is not None:
            wanted = self.row_prefix.gather(1, step.expand(N, 1))  # [N, 1]
            inside = wanted.ne(self.pad)  # [N, 1] rows still inside their prefix
            wanted_value = values.gather(1, wanted)  # [N, 1] before any masking
        if self.ngram:
            self._block_repeated_ngrams(values)
        forced = step >= self.row_limits  # [N] the length limit: EOS only (it wins over min_len)
        eos_value = values[:, self.eos].clone()
        values.masked_fill_(forced[:, None], NEG_INF)
        eos_value = eos_value.masked_fill(~forced & (step < self.options.min_len), NEG_INF)
        values[:, self.eos] = eos_value
        if self.row_prefix is not None:
            values.masked_fill_(inside, NEG_INF)
            values.scatter_(1, wanted, torch.where(inside, wanted_value, values.gather(1, wanted)))
        return values

    def _block_repeated_ngrams(self, values: Tensor) -> None:
        """`beam.block_repeated_ngrams` over the fixed token buffer: only n-grams wholly inside the output so
        far count, and the hits are summed into a [N, V] map instead of indexed."""
        n, step = self.ngram, self.position
        generated = self.tokens[:, 1:]  # [N, T]; positions >= step are not written yet
        if generated.shape[1] < n:
            return
        windows = generated.unfold(1, n, 1)  # [N, W, n] every n-gram of the buffer
        last = (step - (n - 1) + torch.arange(n - 1, device=self.device)).clamp(min=0)  # [n - 1]
        prefix = generated.index_select(1, last)  # [N, n - 1] the tokens the next one would follow
        match = windows[:, :, :-1].eq(prefix[:, None, :]).all(dim=2)  # [N, W]
        match &= torch.arange(windows.shape[1], device=self.device) <= step - n  # n-grams already complete
        hits = torch.zeros_like(values).scatter_add_(1, windows[:, :, -1], match.to(values.dtype))
        values.masked_fill_(hits > 0, NEG_INF)

    def step(self) -> None:
        """One search step, in place: candidates, finished hypotheses, the K that continue, caches reordered."""
        B, K = self.B, self.K
        N, step = B * K, self.position
        values = self.step_scores()  # [N, V]
        V = values.shape[1]
        n_cand = min(2 * K, K * V)
        cand_scores, cand_index = top_candidates(values.view(B, K, V), self.scores, n_cand)  # [B, C] best first
        cand_beam = torch.div(cand_index, V, rounding_mode="floor")  # [B, C]
        cand_token = cand_index - cand_beam * V
        cand_lprob = values.view(B, K * V).gather(1, cand_index)  # [B, C]
        cand_eos = cand_token.eq(self.eos)

        # 1. EOS among the top K candidates of a sentence not yet done: finished hypotheses, in candidate order
        final = cand_eos[:, :K] & cand_scores[:, :K].gt(NEG_INF) & ~self.done[:, None]  # [B, K]
        slot = self.finished[:, None] + final.long().cumsum(dim=1) - 1  # [B, K]
        slot = torch.where(final & (slot < K), slot, K)  # slot K: not kept
        rows = (self.sentence_rows + cand_beam[:, :K]).view(-1)  # [B*K] the finishing hypotheses' rows
        T = self.steps
        tokens = self.tokens[:, 1:].index_select(0, rows).view(B, K, T)  # [B, K, T] (EOS not stored)
        positional = self.positional.index_select(0, rows).view(B, K, T)
        positional.scatter_(2, step.expand(B, K, 1), cand_lprob[:, :K, None])  # the EOS' log-probability
        slots = slot[:, :, None].expand(B, K, T)
        self.fin_tokens.scatter_(1, slots, tokens)
        self.fin_positional.scatter_(1, slots, positional)
        divisor = length_divisor(step + 1, self.options.length_penalty, self.options.length_penalty_kind)
        self.fin_scores.scatter_(1, slot, cand_scores[:, :K].double() / divisor)
        self.fin_length.scatter_(1, slot, (step + 1).expand(B, K))
        self.finished.copy_((self.finished + final.sum(dim=1)).clamp(max=K))
        self.done |= self.finished.ge(K) | (step >= self.max_lens)

        # 2. the K best candidates not ending in EOS continue (EOS sorted behind every other token)
        order_key = torch.arange(n_cand, device=self.device) + n_cand * cand_eos.long()  # [B, C]
        active = order_key.topk(K, dim=1, largest=False).indices  # [B, K] in score order
        new_tokens = cand_token.gather(1, active)
        new_scores = cand_scores.gather(1, active).masked_fill(new_tokens.eq(self.eos), NEG_INF)
        order = (self.sentence_rows + cand_beam.gather(1, active)).view(-1)  # [N]

        # 3. reorder the hypotheses within their sentences and append the chosen tokens
        self.state.reorder_within_sentences(order)
        self.tokens.copy_(self.tokens.index_select(0, order))
        self.tokens.scatter_(1, (step + 1).expand(N, 1), new_tokens.view(N, 1))
        self.positional.copy_(self.positional.index_select(0, order))
        self.positional.scatter_(1, step.expand(N, 1), cand_lprob.gather(1, active).view(N, 1))
        self.scores.copy_(new_scores)
        self.position += 1

    def all_done(self) -> bool:
        """Whether every sentence is complete (the one host read of a step)."""
        return bool(self.done.all())

    def results(self) -> list[list[Hypothesis]]:
        """Finished hypotheses per sentence of the batch, in the order they were found (one copy back)."""
        b = self.loaded
        counts, lengths = self.finished[:b].tolist(), self.fin_length[:b].tolist()
        tokens, positional = self.fin_tokens[:b].tolist(), self.fin_positional[:b].tolist()
        scores = self.fin_scores[:b].tolist()
        return [[Hypothesis(tokens[i][s][: lengths[i][s] - 1], scores[i][s], positional[i][s][: lengths[i][s]])
                 for s in range(counts[i])] for i in range(b)]


def _copy_encoder_out(target: Any, new: Any) -> None:
    """Copy an encoder output (an EncoderOut, or an ensemble's per member) into `target`'s tensors."""
    for target_member, new_member in zip(getattr(target, "members", [target]), getattr(new, "members", [new]),
                                         strict=True):
        target_member.out.copy_(new_member.out)
        target_member.padding_mask.copy_(new_member.padding_mask)
