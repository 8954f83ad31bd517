"""Attention maps for the server (POST /attention, the page's heat map), through the extractor of
`multibranch analyze attention` (analysis/attention_maps.py): which maps a model offers, a request's
validation against them, and one map of one sentence.

    choices = attention_choices(model)   # {"cross": {"layers": 6, "heads": [8, ...], "branches": [2, ...]}, ...}
    check_selection(choices, "cross", layer=5, head=None, branch=1)   # raises SelectionError
    entry = sentence_map(model, tokenizer, src_ids, tgt_ids, "cross", 5, head=None, branch=1)
"""

from __future__ import annotations

from typing import Any

from multibranch.analysis.attention_maps import (
    Selection,
    SelectionError,
    branch_heads,
    capture_maps,
    map_axes,
    pieces,
    select_maps,
)
from multibranch.analysis.heads import ROLES, attention_sites


def attention_choices(model: Any) -> dict[str, dict[str, Any]]:
    """Per attention type present in the model: its number of layers and, per layer, heads and
    branches (MAT: N_a branches of M heads; every other module: 1 branch, the mean of its heads)."""
    out: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        sites = sorted((s for s in attention_sites(model) if s.role == role), key=lambda s: s.layer)
        if sites:
            out[role] = {"layers": len(sites), "heads": [s.heads for s in sites],
                         "branches": [s.heads // branch_heads(s) for s in sites]}
    return out


def check_selection(choices: dict[str, dict[str, Any]], kind: str, layer: int, head: int | None,
                    branch: int | None) -> None:
    """SelectionError naming the valid range when (kind, layer, head or branch) is not in the model."""
    if kind not in choices:
        raise SelectionError(f"kind={kind!r}: this model has {', '.join(choices) or 'no attention maps'}")
    available = choices[kind]
    if not 0 <= layer < available["layers"]:
        raise SelectionError(f"layer={layer}: the {kind} attention has layers 0..{available['layers'] - 1}")
    if (head is None) == (branch is None):
        raise SelectionError("give exactly one of head or branch")
    if head is not None and not 0 <= head < available["heads"][layer]:
        raise SelectionError(f"head={head}: layer {layer} of the {kind} attention has heads "
                             f"0..{available['heads'][layer] - 1}")
    if branch is not None and not 0 <= branch < available["branches"][layer]:
        raise SelectionError(f"branch={branch}: layer {layer} of the {kind} attention has branches "
                             f"0..{available['branches'][layer] - 1}")


def sentence_map(model: Any, tokenizer: Any, src_ids: list[int], tgt_ids: list[int], kind: str, layer: int,
                 head: int | None = None, branch: int | None = None) -> dict[str, Any]:
    """One map of one sentence (source ids without EOS, target ids without BOS): the module's name,
    the source and decoder-input tokens, the query (rows) and key (columns) tokens and the
    probabilities [rows, columns] as nested lists."""
    sites = [s for s in attention_sites(model) if s.role == kind and s.layer == layer]
    if not sites:
        raise SelectionError(f"the model has no {kind} attention in layer {layer}")
    selection = Selection(roles=(kind,), layers=(layer,), heads=None if head is None else (head,), branch=branch)
    [entry] = select_maps(sites, capture_maps(model, src_ids, tgt_ids, sites), selection)
    [(title, probs)] = entry["panels"]  # [queries, keys]
    source = [*pieces(tokenizer.src, src_ids), "</s>"]
    target = ["<s>", *pieces(tokenizer.tgt, tgt_ids)]
    rows, columns = map_axes(kind, source, target)
    return {"module": entry["name"], "title": title, "source_tokens": source, "target_tokens": target,
            "rows": rows, "columns": columns, "weights": probs.tolist()}
