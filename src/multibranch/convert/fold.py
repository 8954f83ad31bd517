"""Folding a MAT (docs/papers.md#mat-folding): N_a branches of M heads become one attention of N_a*M heads.

In eval, c * sum_i MHA_i(x) is one multi-head attention whose heads are all the branches' heads:
the Q/K/V rows are already stacked branch-major (`modules/attention.py`), so only the output side
changes:
    out_proj.weight [d, N_a*M*d_k]  -> c * out_proj.weight      (vertical stack of c * W_O^i)
    out_bias        [N_a, d]        -> c * sum_i b_O^i  [1, d]
and the layer config becomes attention_branches=1, heads=N_a*M, head_dim=d/M.

N_f FFN branches fold the same way into one FFN of width N_f*d_h (fc2 scaled by c, one bias
c * sum_i b_2^i). `ffn_dim` is a single model-wide width, so the FFN can be folded only when the
encoder and decoder have the same N_f; otherwise only attention is folded and the result says so
(meta.conversion.ffn_folded = False).

Drop-branch rates on folded sublayers are reset to 0: the folded model is an inference artefact
(drop-branch on a single folded branch would drop the whole sublayer, a different regulariser).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from torch import Tensor

from multibranch.config import ConfigError, to_dict
from multibranch.convert.payload import check_state, describe_source, experiment_config, weights_only
from multibranch.modules.merge import merge_constant
from multibranch.schedules import RateConfig

log = logging.getLogger(__name__)

ATTENTION_OUT = re.compile(r"^(encoder|decoder)\.layers\.\d+\.(self_attn|cross_attn)\.(out_proj\.weight|out_bias)$")
FFN_OUT = re.compile(r"^(encoder|decoder)\.layers\.\d+\.ffn\.(fc2\.weight|fc2_bias)$")


def fold_mat(payload: dict[str, Any], source: str | None = None) -> dict[str, Any]:
    """Payload of the folded model: same function in eval, one attention branch per sublayer."""
    where = source or "checkpoint"
    cfg = experiment_config(payload)
    model = cfg.model
    sides = ("encoder", "decoder") if model.decoder_layers else ("encoder",)  # a classifier has no decoder
    layers = {side: getattr(model, side) for side in sides}
    for side, layer in layers.items():
        if layer.kind != "transformer":
            raise ConfigError(f"{where}: only MAT/standard layers can be folded; the {side} layers are {layer.kind!r}")
    before = {side: {"attention_branches": layer.attention_branches, "ffn_branches": layer.ffn_branches}
              for side, layer in layers.items()}
    n_f = {layer.ffn_branches for layer in layers.values()}
    fold_ffn = len(n_f) == 1
    if not fold_ffn:
        log.warning(
            "encoder and decoder have different ffn_branches (%s); model.ffn_dim is model-wide, so the FFN branches "
            "are kept and only attention is folded", sorted(n_f)
        )

    state: dict[str, Tensor] = {}
    for key, tensor in payload["model"].items():
        if m := ATTENTION_OUT.match(key):
            layer = layers[m.group(1)]
            state[key] = fold_output(key, tensor, merge_constant(layer.attention_branches, layer.branch_merge))
        elif fold_ffn and (m := FFN_OUT.match(key)):
            layer = layers[m.group(1)]
            state[key] = fold_output(key, tensor, merge_constant(layer.ffn_branches, layer.branch_merge))
        else:
            state[key] = tensor

    for layer in layers.values():
        heads = layer.heads or model.heads
        layer.head_dim = layer.head_dim or model.d_model // heads
        layer.heads = layer.attention_branches * heads
        if not fold_ffn and layer.ffn_drop_branch is None:
            layer.ffn_drop_branch = layer.drop_branch  # keep the FFN's effective rate
        layer.drop_branch = RateConfig()
        layer.head_drop = False
    if fold_ffn:
        model.ffn_dim *= n_f.pop()
        for layer in layers.values():
            layer.ffn_branches = 1
            layer.ffn_drop_branch = None
    for layer in layers.values():
        layer.attention_branches = 1
    check_state(cfg, state, where)

    src_meta = payload.get("meta") or {}
    meta = {k: v for k, v in src_meta.items() if k != "config_hash"}  # same function: scores still hold
    meta["conversion"] = {
        "kind": "fold",
        "before": before,
        "ffn_folded": fold_ffn,
        **({} if fold_ffn else {"ffn_note": "encoder/decoder ffn_branches differ; model.ffn_dim cannot express it"}),
    }
    meta["source"] = describe_source(payload, source)
    return weights_only(payload, to_dict(cfg), state, meta)


def fold_output(key: str, t: Tensor, c: float) -> Tensor:
    """Output weight [d, N*w] -> c * weight; per-branch biases [N, d] -> c * sum [1, d].

    The arithmetic mirrors the modules' forward (sum the biases, then scale) so that the folded
    model reproduces the unfolded one to the last bit in most cases."""
    if key.endswith("weight"):
        return t * c if c != 1.0 else t
    bias = t.sum(0, keepdim=True) if t.shape[0] > 1 else t  # [1, d]
    return bias * c if c != 1.0 else bias
