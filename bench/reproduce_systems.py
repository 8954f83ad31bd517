"""The systems of the reproduction: each one's config delta on the standard recipe, how MAT systems are
initialised and choose rho, and the papers' claims beside them (bench/reproduce.py trains them,
bench/reproduce_report.py tabulates them)."""

from __future__ import annotations

from typing import Any

BASE_PRESET = "transformer"  # fairseq transformer_iwslt_de_en: 6+6, d=512, FFN 1024, 4 heads, dropout 0.3

SYSTEMS = ("standard", "mat2", "mat3", "standard-narrow", "mat2-narrow", "mat3-narrow", "weighted", "mute", "mute-bias",
           "mute-bias-seq", "muse", "muse-simple", "drophead", "mat3-narrow-drophead")
# MAT system -> (the standard system it is initialised from, N_a)
MAT_SYSTEMS = {"mat2": ("standard", 2), "mat3": ("standard", 3), "mat2-narrow": ("standard-narrow", 2),
               "mat3-narrow": ("standard-narrow", 3), "mat3-narrow-drophead": ("standard-narrow", 3)}
# a combination no paper tried: MAT 3/256/2048 by proximal initialisation with Scheduled DropHead on its heads,
# at the rho chosen for mat3-narrow (no grid of its own)
COMBINATIONS = {"mat3-narrow-drophead": ("mat3-narrow", "drophead")}
SOURCES = ("standard", "standard-narrow")

# The papers' own results (their data sets and shapes, not Multi30k; the headline sections of docs/papers.md), for
# the column beside ours: BLEU gained over their standard Transformer where they give one.
PAPER_CLAIMS: dict[str, dict[str, Any]] = {
    "mat2": {"delta_bleu": None, "claim": "none at this width: the paper's MAT results are at d=256 (see mat2-narrow)"},
    "mat3": {"delta_bleu": None, "claim": "none at this width: the paper's +1.27 is 3/256/2048 (see mat3-narrow)"},
    "standard-narrow": {"delta_bleu": None, "claim": "none: the source model of proximal initialisation (1/256/2048)"},
    "mat2-narrow": {"delta_bleu": None, "claim": "MAT 2/256/2048, rho=0.2: +1.25 to +1.90 BLEU over the 1/512/1024 "
                    "baseline on IWSLT Es<->En and Fr<->En (no proximal init; MAT Table 3)"},
    "mat3-narrow": {"delta_bleu": 1.27, "claim": "MAT 3/256/2048, rho=0.3, proximal init: 34.95 (1/512/1024) -> 36.22 "
                    "BLEU, IWSLT14 De->En (MAT Table 1, §4.3)"},
    "weighted": {"delta_bleu": 1.1, "claim": "Transformer small 27.3 -> Weighted 28.4 BLEU, WMT14 En-De "
                 "newstest2014 (large 28.4 -> 28.9; Weighted Transformer Table 1)"},
    "mute": {"delta_bleu": 1.12, "claim": "+1.12 BLEU over Transformer-Base, NIST Zh-En average (MUTE Table 1)"},
    "mute-bias": {"delta_bleu": 1.44, "claim": "+1.44 BLEU over Transformer-Base, NIST Zh-En average (MUTE Table 1)"},
    "mute-bias-seq": {"delta_bleu": 1.52, "claim": "+1.52 BLEU over Transformer-Base, NIST Zh-En average "
                      "(MUTE Table 1)"},
    "muse": {"delta_bleu": None, "claim": "MUSE 36.3 BLEU, IWSLT14 De->En, its own 12+12 d=384 shape "
             "(MUSE Table 2)"},
    "muse-simple": {"delta_bleu": None, "claim": "MUSE-simple 35.8 BLEU, IWSLT14 De->En (MUSE Table 2)"},
    "drophead": {"delta_bleu": 0.7, "claim": "transformer-big 28.7 -> Scheduled DropHead 29.4 BLEU, WMT14 En-De, "
                 "and a flatter pruning curve (Scheduled DropHead Table 1, §4.3)"},
    "mat3-narrow-drophead": {"delta_bleu": None, "claim": "none: a combination no paper tried (MAT 3/256/2048 "
                             "with Scheduled DropHead)"},
}

# the papers' drop-branch grid for MAT (MAT Table 1: rho in {0, .1, .2, .3}; recommended 0.2-0.3)
DEFAULT_RHO_GRID = (0.1, 0.2, 0.3)

# --tiny: the same pipeline at a size that trains in seconds on one CPU thread
TINY = {"model": {"d_model": 32, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2},
        "train": {"max_tokens": 512, "lr": {"lr": 0.005, "warmup": 10}}, "decode": {"beam": 2}}


def system_delta(system: str, max_updates: int, rho: float | None = None, *, tiny: bool = False) -> dict[str, Any]:
    """The config that `system` adds to the standard recipe (deep-merged by `train --config`)."""
    if system in COMBINATIONS:
        first, second = COMBINATIONS[system]
        return deep_merge(system_delta(first, max_updates, rho, tiny=tiny), system_delta(second, max_updates, tiny=tiny))
    d, ffn = (TINY["model"]["d_model"], TINY["model"]["ffn_dim"]) if tiny else (512, 1024)
    narrow = {"d_model": d // 2, "ffn_dim": 2 * ffn} if "-narrow" in system else {}
    if system in SOURCES:
        return {"model": narrow} if narrow else {}
    if system in MAT_SYSTEMS:
        layer = {"kind": "transformer", "attention_branches": MAT_SYSTEMS[system][1], "drop_branch": rho}
        return {"model": {**narrow, "encoder": dict(layer), "decoder": dict(layer)}}
    if system == "weighted":
        freeze = max(1, max_updates // 6)  # the paper freezes kappa/alpha for its last 10k of 60k updates
        return {"model": {"encoder": {"kind": "weighted", "freeze_last": freeze},
                          "decoder": {"kind": "weighted", "decoder_branched": "cross", "freeze_last": freeze}}}
    if system.startswith("mute"):
        encoder: dict[str, Any] = {"kind": "mute", "units": 4}
        if system in ("mute-bias", "mute-bias-seq"):
            encoder.update({"bias_modules": ["identity", "swap", "mask", "disorder"], "bias_switch": 0.85})
        if system == "mute-bias-seq":
            encoder.update({"fusion": "sequential", "autoshuffle_penalty": 2.5e-4})
        # the model side of the mute presets: pre-norm, Shaw relative positions, ReLU dropout = dropout
        return {"model": {"norm": "pre", "relative_positions": 16, "activation_dropout": 0.3,
                          "encoder": encoder, "decoder": {"kind": "transformer"}}}
    if system in ("muse", "muse-simple"):
        layer = {"kind": "muse", "conv": system == "muse", "kernel_sizes": [3, 15]}
        return {"model": {"init": "torch", "encoder": dict(layer), "decoder": dict(layer)}}
    if system == "drophead":
        return {"model": {"dropout": 0.2, "drophead": {"rate": {"schedule": "v", "rate": 0.2}}}}
    raise ValueError(f"unknown system {system!r}")


def grid_of(system: str) -> str:
    """The MAT system whose rho grid chooses `system`'s rho (a combination uses its MAT system's)."""
    return COMBINATIONS[system][0] if system in COMBINATIONS else system


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
