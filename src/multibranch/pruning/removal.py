"""Physical head pruning (docs/papers.md#drophead-pruning-curve-and-dominant-heads): remove attention heads from a standard or MAT checkpoint
(a translation model, or a classifier: its encoder's self-attentions).

For an attention with heads h = 0..H-1 of width d_k (modules/attention.py layout), keeping the heads K:
    in_proj.weight [3*H*d_k, d] -> the rows of K in each of the Q, K and V blocks   [3*|K|*d_k, d]
    in_proj.bias   [3*H*d_k]    -> the same rows
    out_proj.weight [d, H*d_k]  -> the columns of K                                  [d, |K|*d_k]
    out_bias                    unchanged (a masked head never touched it)
so the pruned model computes exactly what the model with those heads' gates at 0 computes. The head
counts go into the layer config (`layer_heads`, one count per attention of every layer); the kept
head indices are recorded in meta.conversion.

A MAT (N_a > 1) is folded first (convert/fold.py; same function in eval): its heads, branch-major,
keep their gate indices. Weighted, MUSE and MUTE layers are refused (their heads are tied to other
structure: branches with FFNs and kappa/alpha, the convolution's shared V, units' stacked weights).
Drop-branch and head-drop are reset (like folding, the result is an inference artefact).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from multibranch.config import ConfigError, to_dict
from multibranch.convert.fold import fold_mat
from multibranch.convert.payload import check_state, describe_source, experiment_config, weights_only
from multibranch.schedules import RateConfig

WHY_NOT = {
    "weighted": "each head is a branch with its own FFN and kappa/alpha weights",
    "muse": "the dynamic convolution shares the attention's value projection and head layout",
    "mute": "the units' attentions are stacked weights with one head count",
}


def check_prunable(payload: dict[str, Any], where: str = "checkpoint") -> None:
    """ConfigError naming the reason unless the model is a translation model or a classifier and its stacks
    are standard/MAT layers."""
    experiment = experiment_config(payload)
    if experiment.task not in ("translation", "classification"):
        raise ConfigError(f"{where}: a {experiment.task} model cannot be pruned: prune takes translation models "
                          "and classifiers")
    cfg = experiment.model
    for stack in ("encoder", "decoder") if experiment.task == "translation" else ("encoder",):
        kind = getattr(cfg, stack).kind
        if kind != "transformer":
            reason = WHY_NOT.get(kind, "only standard/MAT layers can be pruned physically")
            raise ConfigError(f"{where}: cannot prune the {kind!r} {stack} layers physically: {reason}; "
                              "mask the heads instead (multibranch analyze heads)")


def attention_modules(model_cfg: Any) -> list[tuple[str, str, int]]:
    """(module name, role, layer) of every attention of a standard model, in module order."""
    names = [(f"encoder.layers.{i}.self_attn", "encoder_self", i) for i in range(model_cfg.encoder_layers)]
    for i in range(model_cfg.decoder_layers):
        names += [(f"decoder.layers.{i}.self_attn", "decoder_self", i), (f"decoder.layers.{i}.cross_attn", "cross", i)]
    return names


def prune_heads(payload: dict[str, Any], remove: Iterable[tuple[str, int]], source: str | None = None) -> dict[str, Any]:
    """Payload of the model without the heads `remove` ((module name, head index) pairs)."""
    where = source or "checkpoint"
    check_prunable(payload, where)
    if any(getattr(experiment_config(payload).model, s).attention_branches > 1 for s in ("encoder", "decoder")):
        payload = fold_mat(payload, source)
    cfg = experiment_config(payload)
    model = cfg.model
    state = dict(payload["model"])
    remove = sorted(set(remove))
    heads: dict[str, int] = {}
    for name, _, _ in attention_modules(model):
        heads[name] = state[f"{name}.out_proj.weight"].shape[1] // _head_dim(model, name)
    check_heads(heads, remove, where)

    kept: dict[str, list[int]] = {}
    removed = set(remove)
    for name, count in heads.items():
        keep = [h for h in range(count) if (name, h) not in removed]
        if not keep:
            raise ConfigError(f"{where}: removing every head of {name} would leave an attention without heads; "
                              "keep at least one head per module")
        kept[name] = keep
        _prune_module(state, name, count, _head_dim(model, name), keep)

    for stack, per_layer in (("encoder", ("self_attn",)), ("decoder", ("self_attn", "cross_attn"))):
        layer = getattr(model, stack)
        layers = model.encoder_layers if stack == "encoder" else model.decoder_layers
        layer.head_dim = _head_dim(model, f"{stack}.layers.0.self_attn")
        layer.layer_heads = [[len(kept[f"{stack}.layers.{i}.{a}"]) for a in per_layer] for i in range(layers)]
        if layer.ffn_drop_branch is None:
            layer.ffn_drop_branch = layer.drop_branch  # keep the FFN's effective rate
        layer.drop_branch = RateConfig()  # drop-branch on one attention branch would drop the sublayer
        layer.head_drop = False
    check_state(cfg, state, where)

    meta = {k: v for k, v in (payload.get("meta") or {}).items() if k not in ("config_hash", "valid")}
    meta["conversion"] = {"kind": "prune", "removed": [[n, h] for n, h in remove], "kept": kept}
    meta["source"] = describe_source(payload, source)
    return weights_only(payload, to_dict(cfg), state, meta)


def check_heads(heads: dict[str, int], remove: Iterable[tuple[str, int]], where: str = "checkpoint") -> None:
    """ConfigError naming the cause unless every (module, head) of `remove` is a head of `heads` (module
    name -> head count): an unknown module (with the closest names and the modules there are), or a head
    index the module does not have."""
    for name, head in remove:
        if name not in heads:
            close = difflib.get_close_matches(name, list(heads), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{where} has no attention module {name!r}; {hint}its attention modules are "
                              f"{describe_modules(heads)}")
        if not 0 <= head < heads[name]:
            raise ConfigError(f"{where}: no head {head} in attention module {name!r} (its heads are "
                              f"0-{heads[name] - 1})")


def describe_modules(heads: dict[str, int]) -> str:
    """Attention module names, layers folded: "encoder.layers.{0-5}.self_attn, decoder.layers.{0-5}.cross_attn"."""
    layers: dict[str, list[int]] = {}
    for name in heads:
        match = re.fullmatch(r"(.*\.layers\.)(\d+)(\..*)", name)
        if match is None:
            layers.setdefault(name, [])
        else:
            layers.setdefault(f"{match[1]}{{}}{match[3]}", []).append(int(match[2]))
    parts = []
    for pattern, numbers in layers.items():
        if not numbers:
            parts.append(pattern)
        elif numbers == list(range(numbers[0], numbers[0] + len(numbers))) and len(numbers) > 1:
            parts.append(pattern.format(f"{{{numbers[0]}-{numbers[-1]}}}"))
        else:
            parts.append(pattern.format(numbers[0] if len(numbers) == 1 else "{" + ",".join(map(str, numbers)) + "}"))
    return ", ".join(parts)


def _head_dim(model_cfg: Any, name: str) -> int:
    layer = model_cfg.encoder if name.startswith("encoder") else model_cfg.decoder
    return layer.head_dim or model_cfg.d_model // (layer.heads or model_cfg.heads)


def _prune_module(state: dict[str, Tensor], name: str, heads: int, head_dim: int, keep: list[int]) -> None:
    """Shrink one attention's tensors in `state` to the heads `keep` (see the module docstring)."""
    cols = torch.tensor([h * head_dim + j for h in keep for j in range(head_dim)])  # [|K|*d_k]
    inner = heads * head_dim
    rows = torch.cat([cols + block * inner for block in range(3)])  # Q | K | V rows of the kept heads
    state[f"{name}.in_proj.weight"] = state[f"{name}.in_proj.weight"][rows].clone()
    state[f"{name}.in_proj.bias"] = state[f"{name}.in_proj.bias"][rows].clone()
    state[f"{name}.out_proj.weight"] = state[f"{name}.out_proj.weight"][:, cols].clone()
