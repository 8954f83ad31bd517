"""Attention maps for the server (POST /attention, the page's heat map), through the extractor of
`multibranch analyze attention` (analysis/attention_maps.py): which maps a model offers, a request's
validation against them, and one map (or every map) of one sentence.

    choices = attention_choices(model)   # {"cross": {"layers": 6, "heads": [8, ...], "branches": [2, ...]}, ...}
    check_selection(choices, "cross", layer=5, head=None, branch=1)   # raises SelectionError
    entry = sentence_map(model, tokenizer, src_ids, tgt_ids, "cross", 5, head=None, branch=1)
    translation, src_ids, tgt_ids = sentence_ids(translator, text)   # the sentence a map is drawn of
    every = sentence_maps(model, tokenizer, src_ids, tgt_ids)   # all maps of it (multibranch.load(...).attention)
"""

from __future__ import annotations

from typing import Any

import torch

from multibranch.analysis.attention_maps import (
    Selection,
    SelectionError,
    branch_heads,
    capture_maps,
    map_axes,
    pieces,
    select_maps,
)
from multibranch.analysis.heads import ROLES, AttentionSite, attention_sites


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


def sentence_ids(translator: Any, text: str, target: str | None = None) -> tuple[str, list[int], list[int]]:
    """(translation, source ids without EOS, target ids) of the sentence a map of `text` is drawn of: the
    source encoded and truncated as `translator` translates it; the target `target`, or else the
    translator's 1-best (cut to the model's learned positions). SelectionError for an empty text or a
    given target longer than the learned positions allow."""
    keep, sources, _ = translator.encode([text])
    if not keep:
        raise SelectionError("the text is empty")
    translation = translator.translate([text])[0] if target is None else target
    tgt_ids = list(translator.tokenizer.encode_tgt([translation])[0])
    cfg = translator.model.config
    if getattr(cfg, "positions", None) == "learned" and len(tgt_ids) + 1 > cfg.max_positions:
        if target is not None:
            raise SelectionError(f"the target has {len(tgt_ids)} tokens; the model's learned positions allow "
                                 f"at most {cfg.max_positions - 1}")
        tgt_ids = tgt_ids[: cfg.max_positions - 1]
    return translation, sources[0][:-1], tgt_ids


def _site_maps(site: AttentionSite, captured: dict[str, Any]) -> dict[str, Any]:
    """The per-head maps [H, rows, columns] and per-branch maps [B, rows, columns] of one site, as
    `select_maps` draws them (a branch: the mean of its heads; a one-branch module: its 1 branch)."""
    def stacked(selection: Selection) -> Any:
        [entry] = select_maps([site], captured, selection)
        return torch.stack([probs for _, probs in entry["panels"]])

    one = Selection(roles=(site.role,), layers=(site.layer,))
    branches = site.heads // branch_heads(site)
    return {"module": site.name, "heads": stacked(one),
            "branches": torch.cat([stacked(Selection(one.roles, one.layers, branch=b)) for b in range(branches)])}


def sentence_maps(model: Any, tokenizer: Any, src_ids: list[int], tgt_ids: list[int]) -> dict[str, Any]:
    """Every map of one sentence (source ids without EOS, target ids without BOS), from one teacher-forced
    forward: the source tokens (EOS included), the decoder-input tokens (BOS included) and per attention
    type (`attention_choices`' keys) per layer {"module", "heads": [H, rows, columns], "branches":
    [B, rows, columns]} (CPU fp32 tensors; `sentence_map` gives one of these maps as nested lists)."""
    sites = attention_sites(model)
    captured = capture_maps(model, src_ids, tgt_ids, sites)
    maps: dict[str, list[dict[str, Any]]] = {}
    for role in ROLES:
        of_role = sorted((s for s in sites if s.role == role), key=lambda s: s.layer)
        if of_role:
            maps[role] = [_site_maps(site, captured) for site in of_role]
    return {"source_tokens": [*pieces(tokenizer.src, src_ids), "</s>"],
            "target_tokens": ["<s>", *pieces(tokenizer.tgt, tgt_ids)], "maps": maps}
