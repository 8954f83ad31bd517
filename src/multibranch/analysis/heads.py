"""The attention heads of a model: every gated attention module with a stable name, its type and layer.

Every attention of every layer kind is a `HeadGated` module (modules/attention.py): standard and
MAT attention (all N_a*M heads, branch-major), the Weighted Transformer's branched attention (head i
= branch i), MUSE's self-attention (the attention part of [A ; C] W_out) and cross-attention, and
MUTE's unit self-attentions (U*H heads, unit-major). A *site* is one such module; (role, layer)
identifies it within a model (no layer has two attentions of one type) and a head is (site, index).
Masking a Weighted Transformer head zeroes head_i before its branch: branch i still adds
alpha_i * (FFN_i(b_O) + b_O), as the gate scales the head, not the branch.

    sites = attention_sites(model)
    with gates_installed(sites, mask_gates(sites, [("decoder.layers.0.cross_attn", 2)])):
        logits = model(src, prev)      # head 2 of that module masked (zeroed, no rescale)
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from multibranch.modules.attention import HeadGated

ROLES = ("encoder_self", "decoder_self", "cross")
_LAYER = re.compile(r"^(?:encoder|decoder)\.layers\.(\d+)\.")

HeadId = tuple[str, int]  # (site name, head index)
HeadScores = dict[str, Tensor]  # site name -> one score per head [H] (CPU, fp32)


@dataclass(frozen=True)
class AttentionSite:
    """One attention module: `name` is its path in the model (e.g. "decoder.layers.1.cross_attn")."""

    name: str
    role: str
    layer: int
    module: HeadGated

    @property
    def heads(self) -> int:
        return self.module.gate_heads

    @property
    def key(self) -> str:
        """"<role>.<layer>", e.g. "cross.1": unique within a model."""
        return f"{self.role}.{self.layer}"


def attention_sites(model: nn.Module) -> list[AttentionSite]:
    """Every gated attention module of a Seq2SeqModel, in module order (encoder layers, then decoder
    layers; self before cross within a layer)."""
    sites = []
    for name, module in model.named_modules():
        if not isinstance(module, HeadGated):
            continue
        match = _LAYER.match(name)
        if match is None or module.role not in ROLES:
            raise ValueError(f"attention module {name!r} has no layer index or attention type (role={module.role!r})")
        sites.append(AttentionSite(name, module.role, int(match.group(1)), module))
    keys = [site.key for site in sites]
    if len(set(keys)) != len(keys):
        raise ValueError(f"two attention modules share an attention type and layer: {keys}")
    return sites


def total_heads(sites: Iterable[AttentionSite]) -> int:
    return sum(site.heads for site in sites)


def mask_gates(sites: Iterable[AttentionSite], masked: Iterable[HeadId]) -> dict[str, Tensor]:
    """0/1 gates [H] for the sites that have a masked head (the others stay ungated)."""
    by_name = {site.name: site for site in sites}
    gates: dict[str, Tensor] = {}
    for name, head in masked:
        site = by_name.get(name)
        if site is None or not 0 <= head < site.heads:
            raise ValueError(f"no head {head} in attention module {name!r}")
        if name not in gates:
            gates[name] = torch.ones(site.heads, device=_device(site.module))
        gates[name][head] = 0.0
    return gates


@contextlib.contextmanager
def gates_installed(sites: Iterable[AttentionSite], gates: Mapping[str, Tensor]) -> Iterator[None]:
    """Install `gates` (site name -> [H], or [B, H] per example) for the duration of the block; every site is
    ungated after."""
    sites = list(sites)
    names = {site.name for site in sites}
    unknown = set(gates) - names
    if unknown:
        raise ValueError(f"gates for unknown attention modules: {sorted(unknown)}")
    try:
        for site in sites:
            site.module.set_head_gate(gates.get(site.name))
        yield
    finally:
        for site in sites:
            site.module.set_head_gate(None)


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device
