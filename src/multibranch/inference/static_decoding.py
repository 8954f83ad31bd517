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
- rules: the processors of `processors.processors_for` (n-gram blocking, EOS before `min_len`, only EOS at a row's
  length limit, target prefixes), the same ones the shrinking engines apply, on the step's [N, V]
  log-probabilities (`step_scores`). Their `StepState` holds the step as this device counter and the buffers
  below, so every rule runs as dense tensor operations (no `nonzero`, no boolean indexing, no host read).

A subclass adds its own bookkeeping (`_allocate_search`, `_reset_search`) and its step; `load` puts a batch in the
same buffers every time, so a step captured as a CUDA graph stays valid for the next batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from multibranch.inference.beam import (
    Decodable,
    Hypothesis,
    length_limits,
    normalized_log_probs,
    output_limits,
)
from multibranch.inference.processors import StepState, apply_processors, processors_for
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


class StaticDecoding:
    """The buffers and step scores of a fixed-row decoding: `rows` sentences x `group` decoder rows per sentence.
    `load(src)` puts a batch in and resets to step 0; subclasses define `step()` (no host read, no allocation that
    outlives it), `all_done()` (the one read a step) and `results()` (one copy back)."""

    kind = "decoding"  # what the warnings call it

    def __init__(self, model: Decodable, rows: int, src_len: int, options: DecodeConfig, group: int, *,
                 prefixed: bool = False, device: torch.device | str = "cpu") -> None:
        self.model, self.B, self.S, self.group = model, rows, src_len, group
        self.options, self.prefixed = options, prefixed
        cfg = model.config
        self.pad, self.bos, self.eos = cfg.pad_id, cfg.bos_id, cfg.eos_id
        self.processors = processors_for(options, self.eos, self.pad, prefixed=prefixed)
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
        self.step_state = StepState(self.position, self.tokens, self.row_limits, self.row_prefix)  # what rules read
        self._allocate_search()

    def _allocate_search(self) -> None:
        """The subclass' own buffers (called once, after the shared ones)."""

    def _reset_search(self, loaded: int) -> None:
        """The subclass' own buffers back to step 0 for a batch of `loaded` sentences."""

    def step_scores(self) -> Tensor:
        """The step's fp32 log-probabilities [N, V] through the processors (as `beam._step_scores` applies them)."""
        N = self.B * self.group
        logits = self.model.decode_step(self.tokens.gather(1, self.position.expand(N, 1)), self.enc, self.state)
        values = normalized_log_probs(logits, self.model.config)  # [N, V]
        return apply_processors(self.processors, values, self.step_state)

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
