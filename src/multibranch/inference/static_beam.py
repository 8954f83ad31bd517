"""Beam search with fixed shapes: the same search as `beam._beam_search`, shaped for a GPU.

`beam._beam_search` shrinks its batch as sentences finish, grows every cache by one position per step and
keeps finished hypotheses in Python lists: each step reads the device several times and allocates new
tensors, which a GPU pays for in launches and synchronisations. Here everything a step touches has one shape
for the whole search, lives on the device and is changed in place: the buffers, caches (a `StaticDecoderState`)
and the decoding rules (`processors`: EOS before `min_len`, forced EOS at the length limit, target prefixes, n-gram
blocking, as dense tensor operations) of `static_decoding.StaticDecoding`, with `beam` rows per sentence, and

- rows: sentences * beam, all kept to the end; a finished sentence's rows go on decoding, but nothing they
  produce is recorded. Step 0's single `<s>` hypothesis is a width-K step whose hypotheses 1..K-1 score -inf.
- bookkeeping: finished hypotheses (tokens, length-normalised score, per-token log-probabilities, length) go
  into [sentences, K + 1, ...] buffers by `scatter` (slot K takes what is not kept), so a step never reads
  back; the host reads one boolean a step (whether every sentence is done) and copies the buffers back once.

A step is therefore a fixed sequence of kernels: `StaticBeamSearch.step` is what a CUDA graph captures and
replays (inference/graphed_search.py runs it, eagerly or replayed). Results equal `beam._beam_search`'s (same candidates, same order of
finished hypotheses; scores to float rounding), which the tests check for every layer kind and option.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from multibranch.inference.beam import NEG_INF, Decodable, Hypothesis
from multibranch.inference.candidates import top_candidates
from multibranch.inference.processors import length_penalty
from multibranch.inference.static_decoding import StaticDecoding

if TYPE_CHECKING:
    from multibranch.experiment.decoding import DecodeConfig


class StaticBeamSearch(StaticDecoding):
    """A beam search in fixed buffers for batches of up to `rows` sentences of up to `src_len` tokens: `load(src)`
    puts a batch in (the same buffers every time, so a captured step stays valid), `step()` is one search step (no
    host read, no allocation that outlives it), `all_done()` the one read a step, `results()` copies back once.
    Rows beyond the batch hold a one-token filler sentence that is done from the start."""

    kind = "beam search"

    def __init__(self, model: Decodable, rows: int, src_len: int, options: DecodeConfig, *, prefixed: bool = False,
                 device: torch.device | str = "cpu") -> None:
        super().__init__(model, rows, src_len, options, options.beam, prefixed=prefixed, device=device)
        self.K = options.beam

    def _allocate_search(self) -> None:
        B, K, T, device = self.B, self.K, self.steps, self.device
        self.scores = torch.full((B, K), NEG_INF, device=device)  # [B, K] cumulative log-probabilities
        self.finished = torch.zeros(B, dtype=torch.long, device=device)  # [B] finished hypotheses so far
        self.done = torch.zeros(B, dtype=torch.bool, device=device)  # [B] sentence complete
        # finished hypotheses: K slots per sentence and slot K for what is not kept
        self.fin_tokens = torch.full((B, K + 1, T), self.pad, dtype=torch.long, device=device)
        self.fin_positional = torch.zeros(B, K + 1, T, device=device)
        self.fin_scores = torch.zeros(B, K + 1, dtype=torch.float64, device=device)
        self.fin_length = torch.zeros(B, K + 1, dtype=torch.long, device=device)
        self.sentence_rows = torch.arange(B, device=device)[:, None] * K  # [B, 1] first row of each sentence

    def _reset_search(self, loaded: int) -> None:
        self.scores.fill_(NEG_INF)
        self.scores[:, 0] = 0.0  # step 0: one hypothesis per sentence (the others are the same <s>)
        self.finished.zero_()
        self.done.zero_()
        self.done[loaded:] = True
        self.fin_tokens.fill_(self.pad)
        self.fin_positional.zero_()
        self.fin_scores.zero_()
        self.fin_length.zero_()

    # ---- one step ------------------------------------------------------------------------------------

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
        divisor = length_penalty(step + 1, self.options.length_penalty, self.options.length_penalty_kind)
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
