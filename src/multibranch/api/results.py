"""The typed results of `Model.translate(..., alignment=True)` and `Model.attention`: Python values over what
`multibranch translate --print-alignment` prints and what `multibranch serve`'s POST /attention draws."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from multibranch.analysis.attention_maps import SelectionError, map_axes
from multibranch.errors import ConfigError
from multibranch.serve.attention import check_selection

__all__ = ["AlignedTranslation", "AttentionMaps"]


@dataclass
class AlignedTranslation:
    """One translation with its attention-based alignment, as `translate --print-alignment` prints it.

    `text`: the translation; `score`: its length-normalised score (as `--nbest` prints it; 0.0 for an empty
    text); `alignment`: (i, j) pairs, one per output SentencePiece piece j (from 0, EOS excluded): i is the
    source piece (from 0, EOS excluded) that the chosen decoder layer's cross-attention, mean over its heads,
    weighs most. `pharaoh` is the same pairs as the CLI writes them after ' ||| ' ("0-0 2-1 ...").
    """

    text: str
    alignment: list[tuple[int, int]]
    score: float = 0.0

    @classmethod
    def from_pharaoh(cls, text: str, pairs: str | None, score: float) -> AlignedTranslation:
        """From the Translator's `Translation` fields (its alignment: 'i-j ...')."""
        parsed = [tuple(int(x) for x in pair.split("-")) for pair in (pairs or "").split()]
        return cls(text, [(i, j) for i, j in parsed], score)

    @property
    def pharaoh(self) -> str:
        """'i-j i-j ...': what `translate --print-alignment` appends after ' ||| '."""
        return " ".join(f"{i}-{j}" for i, j in self.alignment)


@dataclass
class AttentionMaps:
    """Every attention map of one sentence (text and translation), as `serve`'s POST /attention and
    `analyze attention` draw them: one teacher-forced forward of the model over the translation.

    `source_tokens`: the S source pieces, EOS ("</s>") included; `target_tokens`: the T decoder-input
    pieces, BOS ("<s>") first, then the translation's pieces (no EOS): the translation's text encoded again,
    as serve does (a search may have produced other pieces of the same text, so these need not be the
    pieces `alignment=True` counts). `heads[kind][layer]`: a float32 CPU tensor [H, rows, columns] (H:
    that module's heads; a MAT module: all N_a x M heads, branch-major); `branches[kind][layer]`:
    [B, rows, columns], branch b the mean of its M heads (a one-branch module: B = 1, the mean of all its
    heads). `kind` is "encoder_self" (rows and columns: source, [S, S]), "decoder_self" ([T, T]) or
    "cross" (rows: target, columns: source, [T, S]); row t of a cross map is the query that predicts
    output piece t (the last row predicts EOS). Every row sums to 1. `modules` names each map's attention
    module. `map()` picks one map as POST /attention does; `axes()` names its rows and columns.
    """

    text: str
    translation: str
    source_tokens: list[str]
    target_tokens: list[str]
    heads: dict[str, list[torch.Tensor]]
    branches: dict[str, list[torch.Tensor]]
    modules: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_sentence(cls, text: str, translation: str, entry: dict[str, Any]) -> AttentionMaps:
        """From `serve.attention.sentence_maps`' answer."""
        maps = entry["maps"]
        return cls(text, translation, entry["source_tokens"], entry["target_tokens"],
                   heads={kind: [m["heads"] for m in layers] for kind, layers in maps.items()},
                   branches={kind: [m["branches"] for m in layers] for kind, layers in maps.items()},
                   modules={kind: [m["module"] for m in layers] for kind, layers in maps.items()})

    @property
    def kinds(self) -> list[str]:
        """The attention types this model has ("encoder_self", "decoder_self", "cross")."""
        return list(self.heads)

    def axes(self, kind: str = "cross") -> tuple[list[str], list[str]]:
        """(row tokens, column tokens) of a map of attention type `kind`."""
        self._check(kind, 0, None, None)
        return map_axes(kind, self.source_tokens, self.target_tokens)

    def map(self, kind: str = "cross", layer: int = -1, head: int | None = None,
            branch: int | None = None) -> torch.Tensor:
        """One map [rows, columns]: of `head`, or of `branch` (POST /attention's choices), or, neither
        given, the mean over all the layer's heads (for the cross attention, the map whose rows
        `alignment=True` takes the argmax of, over the search's own pieces). `layer` counts from 0; negative from the last (-1: the last). ConfigError naming
        the valid range for a choice the model does not have."""
        layer = self._check(kind, layer, head, branch)
        if head is not None:
            return self.heads[kind][layer][head]
        if branch is not None:
            return self.branches[kind][layer][branch]
        return self.heads[kind][layer].mean(dim=0)

    def _check(self, kind: str, layer: int, head: int | None, branch: int | None) -> int:
        """The layer (from 0) of a valid choice; ConfigError with serve's message otherwise."""
        if head is not None and branch is not None:
            raise ConfigError("give at most one of head or branch")
        for name, value in (("layer", layer), ("head", head), ("branch", branch)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"attention map: {name} must be an int, not {type(value).__name__}")
        choices = {k: {"layers": len(maps), "heads": [m.shape[0] for m in maps],
                       "branches": [b.shape[0] for b in self.branches[k]]} for k, maps in self.heads.items()}
        layers = choices.get(kind, {}).get("layers", 0)
        if kind in choices and -layers <= layer < 0:
            layer += layers
        try:  # neither head nor branch: every layer has branch 0
            check_selection(choices, kind, layer, head, branch if head is not None or branch is not None else 0)
        except SelectionError as err:
            raise ConfigError(f"attention map: {err}") from None
        return layer
