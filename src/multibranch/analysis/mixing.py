"""The learned mixing weights of a model, read from its parameters: MUSE kernel gates softmax(g) and
their k=3 / k=15 ratio per layer (MUSE journal version, Fig. 8;
docs/papers.md#muse-length-buckets-and-gate-ratios), Weighted Transformer kappa/alpha per module (its Fig. 3)
and MUTE unit weights w_j per encoder layer (MUTE Fig. 3).

    kernel_gates(model)   -> [{"name", "side", "layer", "kernel_sizes", "weights", "ratio"}]
    branch_weights(model) -> [{"name", "side", "layer", "kappa", "alpha"}]
    unit_weights(model)   -> [{"name", "side", "layer", "weights"}]
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from multibranch.models.layers.mute import MuteEncoderLayer
from multibranch.modules.dynconv import DynamicConv
from multibranch.modules.simplex import BranchWeights

_LAYER = re.compile(r"^(encoder|decoder)\.layers\.(\d+)(?:\.|$)")


def _where(name: str) -> tuple[str, int]:
    match = _LAYER.match(name)
    if match is None:
        raise ValueError(f"module {name!r} is not inside an encoder or decoder layer")
    return match.group(1), int(match.group(2))


def kernel_gates(model: nn.Module, ratio: tuple[int, int] = (3, 15)) -> list[dict[str, Any]]:
    """softmax(g) of every gated dynamic convolution and softmax(g)_{ratio[0]} / softmax(g)_{ratio[1]}
    (None when the module lacks one of the two kernel sizes)."""
    rows = []
    for name, module in model.named_modules():
        if not isinstance(module, DynamicConv) or module.gate is None:
            continue
        side, layer = _where(name)
        with torch.no_grad():
            weights = module.gate_weights().float().cpu().tolist()
        by_size = dict(zip(module.kernel_sizes, weights, strict=True))
        value = by_size[ratio[0]] / by_size[ratio[1]] if ratio[0] in by_size and ratio[1] in by_size else None
        rows.append({"name": name, "side": side, "layer": layer, "kernel_sizes": list(module.kernel_sizes),
                     "weights": weights, "ratio": value})
    return rows


def branch_weights(model: nn.Module) -> list[dict[str, Any]]:
    """The effective kappa and alpha (after softmax / top-k, as the branches use them) of every module."""
    rows = []
    for name, module in model.named_modules():
        if isinstance(module, BranchWeights):
            side, layer = _where(name)
            with torch.no_grad():
                kappa, alpha = module()
            rows.append({"name": name, "side": side, "layer": layer, "kappa": kappa.float().cpu().tolist(),
                         "alpha": alpha.float().cpu().tolist()})
    return rows


def unit_weights(model: nn.Module) -> list[dict[str, Any]]:
    """The unit weights w_j of every MUTE encoder layer."""

    rows = []
    for name, module in model.named_modules():
        if isinstance(module, MuteEncoderLayer):
            side, layer = _where(name)
            rows.append({"name": name, "side": side, "layer": layer,
                         "weights": module.unit_weights.detach().float().cpu().tolist()})
    return rows
