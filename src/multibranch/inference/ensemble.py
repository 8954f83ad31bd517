"""Ensembles at generation time: several models of one vocabulary decode as one `Decodable`.

Each step every member gives its next-token log-probabilities (pad/bos masked before its own
log_softmax, as in the search); the ensemble combines them per token:

    "prob" (default, fairseq's EnsembleModel):  log( mean_m p_m )  = logsumexp_m(log p_m) - log M
    "log-prob":                                 mean_m log p_m    (renormalised by the search)

`decode_step` returns these combined log-probabilities; the search's own masking and log_softmax
leave a normalised distribution unchanged, so beam search, sampling, n-best, prefixes and
`forced_scores` (--score-reference) work on an ensemble unchanged. Each member keeps its own encoder
output and decoder caches (`EnsembleEncoderOut`, `EnsembleState`), reordered together.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from multibranch.errors import CheckpointError
from multibranch.inference.beam import normalized_log_probs
from multibranch.modules.state import DecoderState, StaticDecoderState

EnsembleMean = Literal["prob", "log-prob"]
ENSEMBLE_MEANS: tuple[EnsembleMean, ...] = ("prob", "log-prob")
SHARED_FIELDS = ("src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id", "eos_id")


@dataclass
class EnsembleEncoderOut:
    """One EncoderOut per member (same rows in each)."""

    members: list

    def index_select(self, index: Tensor) -> EnsembleEncoderOut:
        return EnsembleEncoderOut([enc.index_select(index) for enc in self.members])


class EnsembleState(DecoderState):
    """One DecoderState per member; `step` and reordering apply to all of them."""

    def __init__(self, members: int, make: Callable[[], DecoderState] = DecoderState):
        super().__init__()
        self.members = [make() for _ in range(members)]

    def reorder(self, order: Tensor, sources: Tensor | None = None) -> None:
        for state in self.members:
            state.reorder(order, sources)

    def reorder_within_sentences(self, order: Tensor) -> None:
        for state in self.members:
            state.reorder_within_sentences(order)

    def reset(self) -> None:
        """Every member's StaticDecoderState back to position 0 (the fixed-shape search's next batch)."""
        self.step = 0
        for state in self.members:
            state.reset()  # type: ignore[attr-defined]


def check_members(configs: list, names: list[str]) -> None:
    """CheckpointError naming the first member whose vocabulary (sizes, special ids) differs from the first's."""
    first = configs[0]
    for config, name in zip(configs[1:], names[1:], strict=True):
        for field in SHARED_FIELDS:
            if getattr(config, field) != getattr(first, field):
                raise CheckpointError(
                    f"ensemble members must share one vocabulary: {name} has {field}={getattr(config, field)} but "
                    f"{names[0]} has {getattr(first, field)}")


def ensemble_config(configs: list) -> object:
    """The first member's model config with the tightest positional limit of all members (every member's
    `max_positions` caps the input and output lengths, as fairseq's max_decoder_positions takes the minimum),
    and learned positions when any member has them."""
    limit = min(c.max_positions for c in configs)
    learned = any(getattr(c, "positions", None) == "learned" for c in configs)
    first = configs[0]
    if limit == first.max_positions and (first.positions == "learned") == learned:
        return first
    return dataclasses.replace(first, max_positions=limit, **({"positions": "learned"} if learned else {}))


class Ensemble(nn.Module):
    """Models with one vocabulary, decoded with the mean of their per-step distributions."""

    def __init__(self, members: list[nn.Module], mean: EnsembleMean = "prob", names: list[str] | None = None):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        if mean not in ENSEMBLE_MEANS:
            raise ValueError(f"mean={mean!r} is not one of {', '.join(ENSEMBLE_MEANS)}")
        names = names or [f"member {i}" for i in range(len(members))]
        check_members([m.config for m in members], names)
        self.members = nn.ModuleList(members)
        self.mean = mean
        self.config = ensemble_config([m.config for m in members])

    def combine(self, lprobs: list[Tensor]) -> Tensor:
        """Per-member log-probabilities [..., V] each -> the ensemble's [..., V]."""
        stacked = torch.stack(lprobs, dim=0)  # [M, ..., V]
        if self.mean == "prob":
            return torch.logsumexp(stacked, dim=0) - math.log(len(lprobs))
        return stacked.mean(dim=0)

    def new_state(self) -> EnsembleState:
        return EnsembleState(len(self.members))

    def new_static_state(self, capacity: int, device: torch.device) -> EnsembleState:
        """One StaticDecoderState per member (the fixed-shape search)."""
        return EnsembleState(len(self.members), lambda: StaticDecoderState(capacity, device))

    def encode(self, src: Tensor) -> EnsembleEncoderOut:
        return EnsembleEncoderOut([member.encode(src) for member in self.members])

    def decode_step(self, tokens: Tensor, enc: EnsembleEncoderOut, state: EnsembleState) -> Tensor:
        """tokens [N, 1] -> the combined log-probabilities [N, V] (fp32)."""
        lprobs = [normalized_log_probs(member.decode_step(tokens, member_enc, member_state), member.config)
                  for member, member_enc, member_state in zip(self.members, enc.members, state.members, strict=True)]
        state.step += 1
        return self.combine(lprobs)

    def forward(self, src: Tensor, prev_tokens: Tensor) -> Tensor:
        """Teacher-forced src [B, S], prev_tokens [B, T] -> combined log-probabilities [B, T, V]."""
        return self.combine([normalized_log_probs(member(src, prev_tokens), member.config) for member in self.members])
