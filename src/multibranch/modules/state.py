"""Incremental decoding state: every cache a decoder keeps between steps, in one flat dict.

Modules see a `StateView` (a key prefix) and store tensors whose first dimension is the batch
(of hypotheses). Beam search reorders all of them with one call. Caches marked `static` depend only
on the source sentence (cross-attention keys/values): they are identical for every hypothesis of a
sentence, so reordering hypotheses *within* sentences may skip them, and beam search keeps them at
one row per sentence (the memory it passes has one row per sentence, see `ParallelAttention`).
"""

from __future__ import annotations

from torch import Tensor


class DecoderState:
    """All per-hypothesis decoder caches; `step` is the number of target positions already decoded."""

    def __init__(self) -> None:
        self.step = 0
        self.tensors: dict[str, Tensor] = {}
        self.static: set[str] = set()

    def view(self, prefix: str) -> StateView:
        return StateView(self, prefix)

    def reorder(self, order: Tensor, sources: Tensor | None = None) -> None:
        """Keep/reorder batch rows: row r of every cache becomes old row order[r].

        `sources`: when the static caches hold one row per source sentence, shared by that sentence's
        hypotheses (the memory of beam search), the source rows to keep instead (row s <- old row
        sources[s]); None: static caches have a row per hypothesis and follow `order`.
        """
        for key, value in self.tensors.items():
            index = sources if sources is not None and key in self.static else order
            self.tensors[key] = value.index_select(0, index)

    def reorder_within_sentences(self, order: Tensor) -> None:
        """Like `reorder`, for an `order` that maps every row to a row of the same source sentence."""
        for key, value in self.tensors.items():
            if key not in self.static:
                self.tensors[key] = value.index_select(0, order)


class StateView:
    """The slice of a DecoderState that belongs to one module (keys under `prefix`)."""

    def __init__(self, state: DecoderState, prefix: str):
        self.state = state
        self.prefix = prefix

    def view(self, name: str) -> StateView:
        return StateView(self.state, f"{self.prefix}.{name}")

    def get(self, name: str) -> Tensor | None:
        return self.state.tensors.get(f"{self.prefix}.{name}")

    def set(self, name: str, value: Tensor, static: bool = False) -> None:
        key = f"{self.prefix}.{name}"
        self.state.tensors[key] = value
        if static:
            self.state.static.add(key)

    @property
    def step(self) -> int:
        return self.state.step
