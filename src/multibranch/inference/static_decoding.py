"""Fixed buffers for decoding on rows that stay for the whole batch: what the fixed-shape beam search
(`static_beam`) and the sampler (`sampling`) share.

A batch of up to `rows` sentences (of up to `src_len` source tokens) decodes `group` rows per sentence (a beam's
hypotheses, a sentence's samples). Everything a step touches has one shape for the whole search and lives on the
device, changed in place:

- encoder output: one row per sentence, shared by its `group` decoder rows (its cross-attention keys/values are
  computed once, at the first step); rows beyond the batch hold a one-token filler sentence.
- caches: a `StaticDecoderState` (modules/state.py), keys/values preallocated for the length limit of the longest
  source and written at a device position counter (`position`).
- output so far: tokens [N, 1 + T] (BOS first) and the chosen tokens' log-probabilities [N, T].
- masks: EOS before `min_len`, only EOS at a row's length limit, target prefixes and n-gram blocking are dense
  operations on the step's [N, V] log-probabilities (`step_scores`: no `nonzero`, no boolean indexing), with
  `beam._step_scores`' semantics.

A subclass adds its own bookkeeping (`_allocate_search`, `_reset_search`) and its step; `load` puts a batch in the
same buffers every time, so a step captured as a CUDA graph stays valid for the next batch.
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


class StaticDecoding:
    """The buffers and step scores of a fixed-row decoding: `rows` sentences x `group` decoder rows per sentence.
    `load(src)` puts a batch in and resets to step 0; subclasses define `step()` (no host read, no allocation that
    outlives it), `all_done()` (the one read a step) and `results()` (one copy back)."""

    kind = "decoding"  # what the warnings call it

    def __init__(self, model: Decodable, rows: int, src_len: int, options: DecodeConfig, group: int, *,
                 prefixed: bool = False, device: torch.device | str = "cpu") -> None:
        self.model, self.B, self.S, self.group = model, rows, src_len, group
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
        into the buffers and reset to step 0. ValueError for a prefix longer than its limit."""
        b, s = src.shape
        B, G, T, device = self.B, self.group, self.steps, self.device
        if b > B or s > self.S or (prefix is not None) != self.prefixed:
            raise ValueError(f"a batch of {b} x {s} (prefix: {prefix is not None}) does not fit buffers of "
                             f"{B} x {self.S} (prefix: {self.prefixed})")
        max_lens, _ = output_limits(self.model, src, self.options, prefix)  # [b]
        source = torch.full((B, self.S), self.pad, dtype=torch.long, device=device)  # [B, S]
        source[:, 0] = self.eos  # filler rows: one token, so no row is all padding
        source[:b, :s] = src
        enc = self.model.encode(source)  # one row per sentence, shared by its G decoder rows
        if self.enc is None:
            self._allocate(enc)
        else:
            _copy_encoder_out(self.enc, enc)
            self.state.reset()  # type: ignore[union-attr]
        self.loaded = b
        self.max_lens.zero_()
        self.max_lens[:b] = max_lens
        self.row_limits.copy_(self.max_lens.repeat_interleave(G))
        if self.row_prefix is not None and prefix is not None:
            padded = torch.full((B, T), self.pad, dtype=torch.long, device=device)
            width = min(prefix.shape[1], T)
            padded[:b, :width] = prefix[:, :width]
            self.row_prefix.copy_(padded.repeat_interleave(G, dim=0))
        self.position.zero_()
        self.tokens.fill_(self.pad)
        self.tokens[:, 0] = self.bos
        self.positional.zero_()
        self._reset_search(b)

    def _allocate(self, enc: Any) -> None:
        """Every buffer, once (later batches are copied into them)."""
        B, T, device = self.B, self.steps, self.device
        N = B * self.group
        reserve_positions(self.model, T + 1)
        self.enc = enc
        self.state = new_static_state(self.model, T, device)
        self.position = torch.zeros((), dtype=torch.long, device=device)  # the step being taken
        self.tokens = torch.full((N, T + 1), self.pad, dtype=torch.long, device=device)  # [N, 1 + T]
        self.positional = torch.zeros(N, T, device=device)  # [N, T] log-probabilities of the chosen tokens
        self.max_lens = torch.zeros(B, dtype=torch.long, device=device)  # [B] output limits (fillers: 0)
        self.row_limits = torch.zeros(N, dtype=torch.long, device=device)  # [N]
        self.row_prefix = torch.full((N, T), self.pad, dtype=torch.long, device=device) if self.prefixed else None
        self._allocate_search()

    def _allocate_search(self) -> None:
        """The subclass' own buffers (called once, after the shared ones)."""

    def _reset_search(self, loaded: int) -> None:
        """The subclass' own buffers back to step 0 for a batch of `loaded` sentences."""

    def step_scores(self) -> Tensor:
        """The step's masked fp32 log-probabilities [N, V], masked as `beam._step_scores` masks them."""
        N = self.B * self.group
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
        raise NotImplementedError

    def all_done(self) -> bool:
        raise NotImplementedError

    def results(self) -> list[list[Hypothesis]]:
        raise NotImplementedError


def _copy_encoder_out(target: Any, new: Any) -> None:
    """Copy an encoder output (an EncoderOut, or an ensemble's per member) into `target`'s tensors."""
    for target_member, new_member in zip(getattr(target, "members", [target]), getattr(new, "members", [new]),
                                         strict=True):
        target_member.out.copy_(new_member.out)
        target_member.padding_mask.copy_(new_member.padding_mask)
