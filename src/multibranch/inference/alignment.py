"""Attention-based word alignment of translations (fairseq's --print-alignment hard, OpenNMT's
-report_align): for every output token, the source token that the chosen decoder layer's
cross-attention weighs most.

    attention = cross_attention(model, src, targets, layer)   # per sentence [T, S], mean over heads
    pairs = hard_alignment(attention[b], source_len, target_len)   # [(i, j)]: source i - target j

`layer` defaults to the last decoder layer (fairseq's `alignment_layer = num_layers - 1`); the map
is the mean over all its heads (a MAT layer: over all N_a x M heads of every branch; an ensemble:
also over members, as fairseq's EnsembleModel averages attention). It is computed in one
teacher-forced forward over the finished outputs, whose cross-attention equals the search's step by
step (causal decoder). Indices count SentencePiece pieces from 0, EOS excluded on both sides. This
is what the model attended to, not a trained aligner: attention need not follow word
correspondence, and the last layer is often not the most faithful one (try --alignment-layer).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from multibranch.modules.attention import HeadGated


def cross_attention_module(model: nn.Module, layer: int) -> HeadGated:
    """The cross-attention module of decoder layer `layer` (negative: from the last) of a Seq2SeqModel."""
    layers = model.decoder.layers  # type: ignore[union-attr]
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise ValueError(f"alignment layer {layer!r}: give an int, a decoder layer (negative: from the last)")
    if not -len(layers) <= layer < len(layers):
        raise ValueError(f"alignment layer {layer}: the decoder has layers 0..{len(layers) - 1}")
    found = [m for m in layers[layer].modules() if isinstance(m, HeadGated) and m.role == "cross"]
    if len(found) != 1:
        raise ValueError(f"decoder layer {layer} has {len(found)} cross-attention modules, not one")
    return found[0]


def check_alignment_layer(model: nn.Module, layer: int) -> None:
    """ValueError unless every member of `model` (an Ensemble, or one model) has decoder layer `layer`."""
    for member in getattr(model, "members", [model]):
        cross_attention_module(member, layer)


@torch.inference_mode()
def cross_attention(model: nn.Module, src: Tensor, targets: list[list[int]], layer: int = -1) -> list[Tensor]:
    """src [B, S] (right-padded), `targets[b]` output ids without EOS -> per sentence the cross-attention
    [len(targets[b]) + 1, source length] of decoder layer `layer`, mean over heads (and members);
    row t is the query that predicts output token t (the last row predicts EOS)."""
    members = list(getattr(model, "members", [model]))
    cfg = members[0].config
    B = len(targets)
    T = max(len(t) for t in targets) + 1
    prev = torch.full((B, T), cfg.pad_id, dtype=torch.long, device=src.device)  # [B, T] BOS + output
    prev[:, 0] = cfg.bos_id
    for row, ids in enumerate(targets):
        prev[row, 1 : len(ids) + 1] = torch.tensor(ids, dtype=torch.long)
    captured: list[Tensor] = []  # per member [B, T, S]

    def probe(probs: Tensor) -> None:  # [B, H, T, S]
        captured.append(probs.float().mean(dim=1))

    for member in members:
        module = cross_attention_module(member, layer)
        module.attention_probe = probe
        try:
            member(src, prev, features_only=True)
        finally:
            module.attention_probe = None
    total = torch.stack(captured).mean(dim=0)  # [B, T, S]
    src_lens = src.ne(cfg.pad_id).sum(dim=1).tolist()
    return [total[b, : len(ids) + 1, : src_lens[b]].cpu() for b, ids in enumerate(targets)]


def hard_alignment(attention: Tensor, source_len: int, target_len: int) -> list[tuple[int, int]]:
    """attention [>= target_len, >= source_len + 1] -> (source i, target j) for every target token
    j < target_len, i the argmax over the first `source_len` source positions (EOS excluded)."""
    if source_len == 0 or target_len == 0:
        return []
    best = attention[:target_len, :source_len].argmax(dim=1)  # [target_len]
    return [(int(i), j) for j, i in enumerate(best.tolist())]


def pharaoh(pairs: list[tuple[int, int]]) -> str:
    """'i-j i-j ...' (Pharaoh format: source index - target index, from 0)."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
