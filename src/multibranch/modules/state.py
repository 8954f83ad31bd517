"""Incremental decoding state: every cache a decoder keeps between steps, in one flat dict.

Modules see a `StateView` (a key prefix) and store tensors whose first dimension is the batch
(of hypotheses). Beam search reorders all of them with one call. Caches marked `static` depend only
on the source sentence (cross-attention keys/values): they are identical for every hypothesis of a
sentence, so reordering hypotheses *within* sentences may skip them, and beam search keeps them at
one row per sentence (the memory it passes has one row per sentence, see `ParallelAttention`).

A reorder of the per-hypothesis caches is deferred until a module next reads the cache: `get` applies
it, and `append` (a self-attention's growing keys/values) applies it in the same copy that makes room
for the new step, so a beam step copies each growing cache once instead of twice (reorder, then grow).

Histories (`extend_history`) are the alternative that never copies: a self-attention using the fused
kernel (`modules/fused_attention.py`) keeps each step's keys/values where that step wrote them, and the
state keeps one ancestor table for all of them: `ancestors[r, s]` is the row that hypothesis r
descends from at step s. A reorder moves the rows of that [rows, steps] table only.
"""

from __future__ import annotations

import torch
from torch import Tensor


class DecoderState:
    """All per-hypothesis decoder caches; `step` is the number of target positions already decoded."""

    fixed = False  # StaticDecoderState: preallocated caches written in place (see there)

    def __init__(self) -> None:
        self.step = 0
        self.tensors: dict[str, Tensor] = {}
        self.static: set[str] = set()
        self._pending: dict[str, Tensor] = {}  # key -> rows to take from tensors[key] (a deferred reorder)
        self.histories: dict[str, tuple[list[Tensor], list[Tensor]]] = {}  # key -> (keys, values) per step
        self._ancestors: Tensor | None = None  # [rows, steps so far] int64, see `extend_history`

    def view(self, prefix: str) -> StateView:
        return StateView(self, prefix)

    def offset(self) -> int | Tensor:
        """The position of the next token to decode (a 0-d device tensor in a StaticDecoderState)."""
        return self.step

    def advance(self, tokens: int) -> None:
        """`tokens` more positions have been decoded."""
        self.step += tokens

    def reorder(self, order: Tensor, sources: Tensor | None = None) -> None:
        """Keep/reorder batch rows: row r of every cache becomes old row order[r].

        `sources`: when the static caches hold one row per source sentence, shared by that sentence's
        hypotheses (the memory of beam search), the source rows to keep instead (row s <- old row
        sources[s]); None: static caches have a row per hypothesis and follow `order`.
        """
        for key, value in self.tensors.items():
            if sources is not None and key in self.static:
                self.tensors[key] = value.index_select(0, sources)
            else:
                self._defer(key, order)
        self._reorder_ancestors(order)

    def reorder_within_sentences(self, order: Tensor) -> None:
        """Like `reorder`, for an `order` that maps every row to a row of the same source sentence."""
        for key in self.tensors:
            if key not in self.static:
                self._defer(key, order)
        self._reorder_ancestors(order)

    def _reorder_ancestors(self, order: Tensor) -> None:
        if self._ancestors is not None:
            self._ancestors = self._ancestors.index_select(0, order)

    def _defer(self, key: str, order: Tensor) -> None:
        earlier = self._pending.get(key)
        self._pending[key] = order if earlier is None else earlier.index_select(0, order)

    def get(self, key: str) -> Tensor | None:
        """The cache `key` (None if absent), reordered as every `reorder` since it was stored says."""
        value = self.tensors.get(key)
        rows = self._pending.pop(key, None)
        if value is not None and rows is not None:
            value = self.tensors[key] = value.index_select(0, rows)
        return value

    def set(self, key: str, value: Tensor, static: bool = False) -> None:
        self.tensors[key] = value
        self._pending.pop(key, None)
        if static:
            self.static.add(key)

    def append(self, key: str, new: Tensor, dim: int) -> Tensor:
        """Store and return the cache `key` extended by `new` along `dim` (new is the cache itself the first
        time); the cache's pending reorder is applied while it is copied into the larger tensor."""
        past = self.tensors.get(key)
        rows = self._pending.pop(key, None)
        if past is None:
            self.tensors[key] = new
            return new
        length = past.shape[dim]
        size = list(new.shape)
        size[dim] += length
        value = new.new_empty(size)
        if rows is None:
            value.narrow(dim, 0, length).copy_(past)
        else:  # index_select writes into the strided slice directly: one copy of the past
            torch.index_select(past, 0, rows, out=value.narrow(dim, 0, length))
        value.narrow(dim, length, new.shape[dim]).copy_(new)
        self.tensors[key] = value
        return value

    def extend_history(self, key: str, keys: Tensor, values: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """Record this step's keys/values [rows, ...] of the module `key` (kept as they are: views stay views)
        and return its (keys, values) of every step so far with the ancestor table [rows, step + 1] int64:
        row r descends from row ancestors[r, s] of step s's tensors. The first module to extend its history
        in a step adds the step's column to the table (each row is its own ancestor in its own step)."""
        step, rows = self.step, keys.shape[0]
        past_keys, past_values = self.histories.setdefault(key, ([], []))
        if len(past_keys) != step:
            raise RuntimeError(f"history {key!r} has {len(past_keys)} steps at step {step}: a history must "
                               "be extended at every step from the first")
        table = self._ancestors
        if table is None or table.shape[1] == step:  # this step's column
            here = torch.arange(rows, device=keys.device)[:, None]  # [rows, 1]
            table = self._ancestors = here if table is None else torch.cat([table, here], dim=1)
        if table.shape != (rows, step + 1):
            raise RuntimeError(f"ancestor table {tuple(table.shape)} for {rows} rows at step {step}")
        past_keys.append(keys)
        past_values.append(values)
        return past_keys, past_values, table


class StaticDecoderState(DecoderState):
    """Decoder caches of a fixed shape for a whole search, changed only in place, so a decoding step has fixed
    shapes, reads nothing back to the host and can be captured as a CUDA graph and replayed.

    `position` (a 0-d long tensor on the device) is the position of the next token. A self-attention's keys
    and values live in buffers of `capacity` positions, allocated at the first step and written at
    `position` (`append`); the attention masks the positions not yet written (`future_keys`). A reorder
    copies rows within the same buffers, and `set` of an existing cache copies into it (a convolution's
    window; the cross-attention keys/values of the next batch, after `reset`). Steps decode one token per
    row. Histories (the fused CPU kernels) are not kept here."""

    fixed = True

    def __init__(self, capacity: int, device: torch.device | str) -> None:
        super().__init__()
        self.capacity = capacity
        self._stale: set[str] = set()  # static caches of the previous batch, see `reset`
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self._key_positions = torch.arange(capacity, device=device)  # [capacity]

    def offset(self) -> Tensor:
        return self.position

    def advance(self, tokens: int) -> None:
        super().advance(tokens)
        self.position += tokens

    def future_keys(self) -> Tensor:
        """[1, capacity] bool, True at the positions after `position` (not yet decoded): a key padding mask."""
        return (self._key_positions > self.position)[None, :]

    def reorder(self, order: Tensor, sources: Tensor | None = None) -> None:
        if sources is not None:
            raise ValueError("a static decoder state keeps every row for the whole search: reorder within "
                             "sentences (reorder_within_sentences)")
        self.reorder_within_sentences(order)

    def reorder_within_sentences(self, order: Tensor) -> None:
        for key, value in self.tensors.items():
            if key not in self.static:
                value.copy_(value.index_select(0, order))

    def get(self, key: str) -> Tensor | None:
        return None if key in self._stale else self.tensors.get(key)

    def set(self, key: str, value: Tensor, static: bool = False) -> None:
        current = self.tensors.get(key)
        if current is not None:  # the same memory for the whole search, and for the next batch's search
            current.copy_(value)
            self._stale.discard(key)
        else:
            super().set(key, value, static)

    def reset(self) -> None:
        """Back to position 0 for a new batch, every buffer kept: per-hypothesis caches zeroed (a convolution's
        window starts from zeros); the static ones (the previous batch's cross-attention keys/values) read as
        absent until the first step computes and `set`s the new batch's into the same memory."""
        self.position.zero_()
        self.step = 0
        self._stale = set(self.static)
        for key, value in self.tensors.items():
            if key not in self.static:
                value.zero_()

    def append(self, key: str, new: Tensor, dim: int) -> Tensor:
        """Write `new` (one position along `dim`) at `position` of the buffer `key` and return the buffer."""
        if new.shape[dim] != 1:
            raise ValueError(f"a static decoder state decodes one token per step, not {new.shape[dim]}")
        buffer = self.tensors.get(key)
        if buffer is None:
            size = list(new.shape)
            size[dim] = self.capacity
            buffer = self.tensors[key] = new.new_zeros(size)
        buffer.index_copy_(dim, self.position[None], new)
        return buffer

    def extend_history(self, key: str, keys: Tensor, values: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
        raise RuntimeError("a static decoder state keeps fixed key/value buffers, not histories")


class StateView:
    """The slice of a DecoderState that belongs to one module (keys under `prefix`)."""

    def __init__(self, state: DecoderState, prefix: str):
        self.state = state
        self.prefix = prefix

    def view(self, name: str) -> StateView:
        return StateView(self.state, f"{self.prefix}.{name}")

    def get(self, name: str) -> Tensor | None:
        return self.state.get(f"{self.prefix}.{name}")

    def set(self, name: str, value: Tensor, static: bool = False) -> None:
        self.state.set(f"{self.prefix}.{name}", value, static)

    def append(self, name: str, new: Tensor, dim: int) -> Tensor:
        """`DecoderState.append` of this module's cache `name`."""
        return self.state.append(f"{self.prefix}.{name}", new, dim)

    def extend_history(self, name: str, keys: Tensor, values: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """`DecoderState.extend_history` of this module's history `name`."""
        return self.state.extend_history(f"{self.prefix}.{name}", keys, values)

    def has_history(self, name: str) -> bool:
        return f"{self.prefix}.{name}" in self.state.histories

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def fixed(self) -> bool:
        """Whether the state is a StaticDecoderState (fixed buffers, a device position)."""
        return self.state.fixed

    def offset(self) -> int | Tensor:
        return self.state.offset()

    def future_keys(self) -> Tensor:
        return self.state.future_keys()  # type: ignore[attr-defined]
