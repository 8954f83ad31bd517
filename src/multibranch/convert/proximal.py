"""Proximal initialisation (MAT §3.3, docs/papers.md#mat-proximal-initialisation): a MAT checkpoint from a trained standard Transformer.

Every attention module (encoder self, decoder self, decoder cross) is copied verbatim into each of
the N_a branches; with N_f > 1 the FFN is copied into each FFN branch; embeddings, layer norms and
everything else are copied once. With `branch_merge="mean"` the result computes exactly the source
model (c * N_a identical terms, c = 1/N_a); with "mean_sq" every attention output is divided by N_a and
every FFN output by N_f (where they have more than one branch).

Widths are not converted (the released converter only duplicates tensors): d, d_h, heads, depth and
vocabulary of the MAT are those of the source; asking for other widths is an error. The optimizer,
LR schedule and counters restart: the payload carries no training state.

Tensor layout (see `modules/attention.py`, I = M * d_k heads of one branch, branch-major):
    in_proj.weight  [3*I, d]  -> [3*N_a*I, d]   Q | K | V, each block = N_a copies
    in_proj.bias    [3*I]     -> [3*N_a*I]
    out_proj.weight [d, I]    -> [d, N_a*I]     [W_O ... W_O]
    out_bias        [1, d]    -> [N_a, d]
    ffn.fc1.weight  [d_h, d]  -> [N_f*d_h, d];  fc1.bias [d_h] -> [N_f*d_h]
    ffn.fc2.weight  [d, d_h]  -> [d, N_f*d_h];  fc2_bias [1, d] -> [N_f, d]
"""

from __future__ import annotations

import logging
import re
from typing import Any

from torch import Tensor

from multibranch.checkpoint.format import CheckpointError
from multibranch.config import ConfigError, deep_merge, parse_override, to_dict
from multibranch.convert.payload import check_state, describe_source, experiment_config, weights_only

log = logging.getLogger(__name__)

# Layer options a MAT may set freely; every other layer field must equal the source's.
MAT_LAYER_OPTIONS = frozenset(
    {"attention_branches", "ffn_branches", "drop_branch", "ffn_drop_branch", "drop_branch_granularity",
     "branch_merge", "head_drop"}
)
# Model fields that do not change any tensor (regularisation, init scheme).
FREE_MODEL_FIELDS = frozenset({"dropout", "attention_dropout", "activation_dropout", "drophead", "init"})

ATTENTION_KEY = re.compile(r"^(encoder|decoder)\.layers\.\d+\.(self_attn|cross_attn)\.(in_proj\.weight|in_proj\.bias|out_proj\.weight|out_bias)$")
FFN_KEY = re.compile(r"^(encoder|decoder)\.layers\.\d+\.ffn\.(fc1\.weight|fc1\.bias|fc2\.weight|fc2_bias)$")


def proximal_init(
    payload: dict[str, Any],
    attention_branches: int,
    ffn_branches: int = 1,
    layer_overrides: dict[str, Any] | None = None,
    *,
    overrides: list[str] | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """MAT payload with N_a = `attention_branches` (and N_f = `ffn_branches`) from a standard one.

    layer_overrides: MAT options set on encoder and decoder layers, e.g.
        {"drop_branch": 0.3, "branch_merge": "mean"} (keys from MAT_LAYER_OPTIONS).
    overrides: `section.key=value` strings applied last (e.g. "model.dropout=0.3",
        "model.decoder.attention_branches=2", "train.lr.warmup=4000"); they may not change widths.
    """
    if attention_branches < 1 or ffn_branches < 1:
        raise ConfigError("--branches and --ffn-branches must be >= 1")
    where = source or "source checkpoint"
    old = experiment_config(payload)
    sides = ("encoder", "decoder") if old.model.decoder_layers else ("encoder",)  # a classifier has no decoder
    _require_standard(old.model, sides, where)
    unknown = sorted(set(layer_overrides or {}) - MAT_LAYER_OPTIONS)
    if unknown:
        raise ConfigError(f"not a MAT layer option: {', '.join(unknown)}; allowed: {', '.join(sorted(MAT_LAYER_OPTIONS))}")

    data = to_dict(old)
    for side in sides:
        data["model"][side].update(
            {"attention_branches": attention_branches, "ffn_branches": ffn_branches, **(layer_overrides or {})}
        )
    for text in overrides or []:
        data = deep_merge(data, parse_override(text))
    new = experiment_config({"config": data})
    _require_same_widths(to_dict(old.model), to_dict(new.model))

    branches = {side: getattr(new.model, side) for side in sides}
    state: dict[str, Tensor] = {}
    for key, tensor in payload["model"].items():
        if m := ATTENTION_KEY.match(key):
            state[key] = duplicate_attention(key, tensor, branches[m.group(1)].attention_branches)
        elif m := FFN_KEY.match(key):
            state[key] = duplicate_ffn(key, tensor, branches[m.group(1)].ffn_branches)
        else:
            state[key] = tensor  # same object: tied embeddings stay tied
    check_state(new, state, where)

    # "mean_sq" scales a merge of N > 1 identical branches by 1/N: attention outputs by 1/N_a, FFN outputs by 1/N_f
    scaled = sorted({part for layer in branches.values() if layer.branch_merge == "mean_sq"
                     for part, n in (("attention outputs by 1/N_a", layer.attention_branches),
                                     ("FFN outputs by 1/N_f", layer.ffn_branches)) if n > 1})
    if scaled:
        log.warning(
            "branch_merge='mean_sq' does not preserve the source function: it divides %s (as in the released MAT "
            "code); use 'mean' for a function-preserving proximal init", " and ".join(scaled)
        )
    src_meta = payload.get("meta") or {}
    meta = {
        "step": 0,
        "epoch": 0,
        "data_fingerprint": src_meta.get("data_fingerprint"),
        "conversion": {
            "kind": "proximal_init",
            **{
                side: {"attention_branches": layer.attention_branches, "ffn_branches": layer.ffn_branches,
                       "branch_merge": layer.branch_merge}
                for side, layer in branches.items()
            },
            "function_preserving": not scaled,
            "restart": "optimizer, LR schedule (warm-up from step 0) and counters restart",
        },
        "source": describe_source(payload, source),
    }
    return weights_only(payload, to_dict(new), state, meta)


def duplicate_attention(key: str, t: Tensor, n: int) -> Tensor:
    """One attention tensor of a single-branch module -> the same for n identical branches."""
    if n == 1:
        return t
    if key.endswith("in_proj.weight"):  # [3*I, d] -> [3*n*I, d]
        three_i, d = t.shape
        return t.reshape(3, 1, three_i // 3, d).expand(3, n, three_i // 3, d).reshape(3 * n * (three_i // 3), d).clone()
    if key.endswith("in_proj.bias"):  # [3*I] -> [3*n*I]
        return t.reshape(3, 1, -1).expand(3, n, t.shape[0] // 3).reshape(-1).clone()
    if key.endswith("out_proj.weight"):  # [d, I] -> [d, n*I]
        return t.repeat(1, n)
    return t.repeat(n, 1)  # out_bias [1, d] -> [n, d]


def duplicate_ffn(key: str, t: Tensor, n: int) -> Tensor:
    """One FFN tensor of a single-branch FFN -> the same for n identical branches."""
    if n == 1:
        return t
    if key.endswith("fc1.weight"):  # [d_h, d] -> [n*d_h, d]
        return t.repeat(n, 1)
    if key.endswith("fc1.bias"):  # [d_h] -> [n*d_h]
        return t.repeat(n)
    if key.endswith("fc2.weight"):  # [d, d_h] -> [d, n*d_h]
        return t.repeat(1, n)
    return t.repeat(n, 1)  # fc2_bias [1, d] -> [n, d]


def _require_standard(model: Any, sides: tuple[str, ...], where: str) -> None:
    for side in sides:
        layer = getattr(model, side)
        if layer.kind != "transformer":
            raise CheckpointError(
                f"{where}: proximal init needs a standard Transformer, but its {side} layers are of kind {layer.kind!r}"
            )
        if layer.attention_branches != 1 or layer.ffn_branches != 1:
            raise CheckpointError(
                f"{where}: proximal init needs a standard Transformer, but its {side} layers already have "
                f"attention_branches={layer.attention_branches}, ffn_branches={layer.ffn_branches}"
            )


def _require_same_widths(old: dict[str, Any], new: dict[str, Any]) -> None:
    """ConfigError listing every requested structural change (proximal init only copies tensors)."""
    diffs = []
    for name, value in old.items():
        if name in FREE_MODEL_FIELDS:
            continue
        if name in ("encoder", "decoder"):
            for field, layer_value in value.items():
                if field not in MAT_LAYER_OPTIONS and new[name].get(field) != layer_value:
                    diffs.append(f"model.{name}.{field}: source {layer_value!r}, requested {new[name].get(field)!r}")
        elif new.get(name) != value:
            diffs.append(f"model.{name}: source {value!r}, requested {new.get(name)!r}")
    if diffs:
        raise ConfigError(
            "proximal init copies tensors and cannot change the architecture (train the standard "
            "model with the MAT's widths): " + "; ".join(diffs)
        )
