"""The systems of the reproduction: each one's config delta on the standard recipe, how MAT systems are
initialised and choose rho, and the papers' claims beside them (bench/reproduce.py trains them,
bench/reproduce_report.py tabulates them).

Two recipes share the pipeline and the system names:
  iwslt  the papers' IWSLT shape (the `transformer` preset, d=512, 6+6 layers), for GPUs
  cpu    the CPU shape (the `-tiny` presets, d=192-256, 3+3 layers, parameter-matched where the papers allow),
         a fixed number of updates for every system, built in the background one run at a time
         (bench/reproduce_runner.py) or finished on a GPU"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASE_PRESET = "transformer"  # fairseq transformer_iwslt_de_en: 6+6, d=512, FFN 1024, 4 heads, dropout 0.3

# the IWSLT recipe's systems, in table order
IWSLT_SYSTEMS = ("standard", "mat2", "mat3", "standard-narrow", "mat2-narrow", "mat3-narrow", "weighted", "mute",
                 "mute-bias", "mute-bias-seq", "muse", "muse-simple", "drophead", "mat3-narrow-drophead")
# the CPU recipe's systems, in the order the runs are worth having: the main rows (CPU_MAIN: a paper's system each,
# and the combination) seed by seed, then the other rows seed by seed (first the MUTE paper's baseline layout)
CPU_SYSTEMS = ("standard", "drophead", "mat", "weighted", "muse", "mute-bias-seq", "mat-drophead", "standard-prenorm",
               "muse-simple", "mute", "mute-bias", "drophead-constant", "mat-source", "mat-proximal",
               "weighted-shared")
CPU_MAIN = CPU_SYSTEMS[:7]
SYSTEMS = IWSLT_SYSTEMS + tuple(s for s in CPU_SYSTEMS if s not in IWSLT_SYSTEMS)
# MAT system -> (the standard system it is initialised from, N_a)
MAT_SYSTEMS = {"mat2": ("standard", 2), "mat3": ("standard", 3), "mat2-narrow": ("standard-narrow", 2),
               "mat3-narrow": ("standard-narrow", 3), "mat3-narrow-drophead": ("standard-narrow", 3),
               "mat-proximal": ("mat-source", 2)}
# combinations no paper tried: MAT with Scheduled DropHead on its heads (IWSLT: MAT 3/256/2048 by proximal
# initialisation at the rho chosen for mat3-narrow, no grid of its own; CPU: mat-tiny from scratch)
COMBINATIONS = {"mat3-narrow-drophead": ("mat3-narrow", "drophead"), "mat-drophead": ("mat", "drophead")}
SOURCES = ("standard", "standard-narrow", "mat-source")

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
    # the CPU row: 2 branches, rho 0.2, a narrower d and a wider FFN, trained from scratch, parameter-matched (no
    # row of the paper is: its MATs have fewer parameters than its default baseline and more than a standard model
    # of their width); its nearest row is 2/256/2048, half the baseline's d and twice its FFN
    "mat": {"delta_bleu": 0.64, "claim": "MAT from scratch, 2 branches, rho=0.2: 2/256/2048 (24.7M) 35.59 vs the "
            "default 1/512/1024 (36.7M) 34.95, +0.64, and vs the same-width 1/256/2048 (20.0M) 34.66, +0.93, "
            "IWSLT14 De->En (MAT Table 1); +1.25 to +1.90 on IWSLT Es/Fr<->En (Table 3, rho 0.2); the "
            "headline +1.27 on De->En takes 3 branches, rho=0.3 and proximal initialisation"},
    "mat-source": {"delta_bleu": None, "claim": "none: the source model of proximal initialisation (mat-tiny's width, "
                   "one branch)"},
    "mat-proximal": {"delta_bleu": 0.9, "claim": "MAT with proximal initialisation, 2 branches, rho=0.2: (2, 2048) "
                     "35.85 vs the default 1/512/1024's 34.95, +0.90, IWSLT14 De->En (MAT Table 2); the best, "
                     "+1.27, takes 3 branches and rho=0.3"},
    "mat-drophead": {"delta_bleu": None, "claim": "none: a combination no paper tried (MAT with Scheduled DropHead)"},
    "standard-prenorm": {"delta_bleu": None, "claim": "none: the MUTE paper's baseline layout (OpenNMT-py: pre-norm, "
                         "ReLU dropout), against which its MUTE gains are measured (MUTE Table 1, App. A)"},
    "weighted-shared": {"delta_bleu": 1.1, "claim": "as `weighted`: Transformer small 27.3 -> Weighted 28.4 BLEU, "
                        "WMT14 En-De; eq. 7's FFN read as the one FFN of eq. 4, shared by the branches"},
    "drophead-constant": {"delta_bleu": 0.5, "claim": "the paper's ablation: DropHead at a constant rate, about +0.5 "
                          "BLEU, the V schedule about 0.2 more, WMT14 En-De, big (Scheduled DropHead Tables 1 and 7)"},
}

# the Weighted Transformer's Table 3: newstest2013 En-De BLEU of its configuration (C) with the learned kappa/alpha
# and with them replaced at test time (bench/reproduce_analyses.py's replacement analysis measures the same)
WEIGHTED_REPLACEMENT_PAPER = {"learned": 24.8, "uniform": 23.4, "random": 21.1}

# the papers' drop-branch grid for MAT (MAT Table 1: rho in {0, .1, .2, .3}; recommended 0.2-0.3)
DEFAULT_RHO_GRID = (0.1, 0.2, 0.3)

# --tiny: the same pipeline at a size that trains in seconds on one CPU thread
TINY = {"model": {"d_model": 32, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2},
        "train": {"max_tokens": 512, "lr": {"lr": 0.005, "warmup": 10}}, "decode": {"beam": 2}}


@dataclass(frozen=True)
class Recipe:
    """A shape of the reproduction: the preset every system starts from, its systems and the harness's defaults."""

    name: str
    base_preset: str
    systems: tuple[str, ...]
    defaults: dict[str, Any]  # bench/reproduce.py's defaults (its option names with _)
    rho: float | None = None  # MAT's drop-branch rate when fixed (no grid)
    seed_major: bool = False  # plan seed by seed (the runs worth having first) rather than standard models first
    optional: tuple[str, ...] = ()  # systems trained only when asked for by name
    main: tuple[str, ...] = ()  # with seed_major: systems whose every seed comes before the other systems' runs

    @property
    def table_systems(self) -> tuple[str, ...]:
        """The systems planned by default."""
        return tuple(s for s in self.systems if s not in self.optional)


CURVE_FILE = Path(__file__).resolve().parent / "results" / "reproduce_cpu_curve.json"


def chosen_cpu_updates(path: Path = CURVE_FILE) -> int | None:
    """The CPU recipe's number of updates, chosen from the standard model's validation curve
    (bench/reproduce_curve.py); None until that measurement has found where the curve flattens."""
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("chosen_updates")
    except (OSError, ValueError):
        return None
    return int(value) if value else None


RECIPES = {
    "iwslt": Recipe("iwslt", BASE_PRESET, IWSLT_SYSTEMS, {
        "train_lines": None, "valid_lines": None, "test_lines": None, "vocab_size": 8000, "max_updates": 12000,
        "valid_every": 500, "patience": 5, "average_last": 5, "log_every": 100, "analysis_sentences": 500,
        "amp": "none"}),
    # every system trains the same number of updates (no early stopping), validating and checkpointing about once
    # an epoch; that number comes from the standard model's validation curve (bench/reproduce_curve.py)
    "cpu": Recipe("cpu", "transformer-tiny", CPU_SYSTEMS, {
        "train_lines": None, "valid_lines": None, "test_lines": None, "vocab_size": 8000,
        "max_updates": chosen_cpu_updates(),
        "valid_every": 250, "patience": None, "average_last": 5, "log_every": 50, "analysis_sentences": 500,
        "amp": "auto"}, rho=0.2, seed_major=True,
        # proximal MAT needs its source model's best.pt in the same work folder: a chain of two whole runs
        optional=("mat-source", "mat-proximal", "weighted-shared"), main=CPU_MAIN),
}

# the CPU recipe's systems: the `-tiny` preset whose model section each one trains (training and decoding stay
# transformer-tiny's for every system, as the IWSLT recipe keeps the standard recipe's)
CPU_PRESETS = {"standard": "transformer-tiny", "standard-prenorm": "transformer-tiny", "drophead": "drophead-tiny", "drophead-constant": "drophead-tiny",
               "mat": "mat-tiny", "mat-source": "mat-tiny", "mat-proximal": "mat-tiny", "weighted": "weighted-tiny",
               "weighted-shared": "weighted-tiny",
               "muse": "muse-tiny", "muse-simple": "muse-simple-tiny", "mute": "mute-tiny",
               "mute-bias": "mute-bias-tiny", "mute-bias-seq": "mute-bias-seq-tiny"}
# the layout of the MUTE paper's models, its baseline's included (OpenNMT-py); the `mute*` presets have it too, with
# relative positions on top
ONMT_LAYOUT = {"norm": "pre", "activation_dropout": 0.1}
# the systems whose Δ the report also gives against another row than `standard`: that row, and what it is to them
SECOND_BASELINES: dict[str, tuple[str, str]] = {
    **{system: ("standard-prenorm", "the baseline layout of the paper's own comparison")
       for system in ("mute", "mute-bias", "mute-bias-seq")},
    "mat-drophead": ("mat", "MAT alone, to which it adds Scheduled DropHead"),
    "drophead-constant": ("drophead", "the V schedule the paper's ablation compares it with"),
    "weighted-shared": ("weighted", "the same paper read with a narrower FFN per branch"),
}


def system_delta(system: str, max_updates: int, rho: float | None = None, *, tiny: bool = False,
                 recipe: str = "iwslt") -> dict[str, Any]:
    """The config that `system` adds to its recipe's base preset (deep-merged by `train --config`)."""
    if system in COMBINATIONS:
        first, second = COMBINATIONS[system]
        return deep_merge(system_delta(first, max_updates, rho, tiny=tiny, recipe=recipe),
                          system_delta(second, max_updates, tiny=tiny, recipe=recipe))
    if recipe == "cpu":
        return cpu_system_delta(system, max_updates, rho, tiny=tiny)
    d, ffn = (TINY["model"]["d_model"], TINY["model"]["ffn_dim"]) if tiny else (512, 1024)
    narrow = {"d_model": d // 2, "ffn_dim": 2 * ffn} if "-narrow" in system else {}
    if system in SOURCES:
        return {"model": narrow} if narrow else {}
    if system in MAT_SYSTEMS:
        layer = {"kind": "transformer", "attention_branches": MAT_SYSTEMS[system][1], "drop_branch": rho}
        return {"model": {**narrow, "encoder": dict(layer), "decoder": dict(layer)}}
    if system == "weighted":
        return {"model": weighted_freeze(max_updates)}
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


def weighted_freeze(max_updates: int) -> dict[str, Any]:
    """The Weighted Transformer's layers with kappa/alpha frozen for the last sixth of the run (the paper's 10k of
    60k updates)."""
    freeze = max(1, max_updates // 6)
    return {"encoder": {"kind": "weighted", "freeze_last": freeze},
            "decoder": {"kind": "weighted", "decoder_branched": "cross", "freeze_last": freeze}}


def cpu_system_delta(system: str, max_updates: int, rho: float | None = None, *, tiny: bool = False) -> dict[str, Any]:
    """The CPU recipe's `system`: the model section of its `-tiny` preset (CPU_PRESETS), with MAT's rho, the
    Weighted Transformer's freeze and DropHead's schedule planned for `max_updates`. --tiny keeps TINY's sizes."""
    if system not in CPU_PRESETS:
        raise ValueError(f"system {system!r} is not in the CPU recipe ({', '.join(CPU_SYSTEMS)})")
    model = changes(preset_model(CPU_PRESETS[system]), preset_model(RECIPES["cpu"].base_preset))
    if system == "standard-prenorm":
        model.update(ONMT_LAYOUT)
    elif system == "mat-source":  # mat-tiny's width with one branch: what proximal initialisation copies
        for side in ("encoder", "decoder"):
            model[side] = {**model[side], "attention_branches": 1, "drop_branch": 0.0}
    elif system in ("mat", "mat-proximal") and rho is not None:
        for side in ("encoder", "decoder"):
            model[side] = {**model[side], "drop_branch": rho}
    elif system in ("weighted", "weighted-shared"):
        model = deep_merge(model, weighted_freeze(max_updates))
        if system == "weighted-shared":  # one FFN of the full width for every branch (docs/papers.md)
            for side in ("encoder", "decoder"):
                model[side] = {**model[side], "ffn_mode": "shared"}
    elif system == "drophead-constant":
        model["drophead"] = {**model["drophead"], "rate": {"schedule": "constant", "rate": model["drophead"]["rate"]["rate"]}}
    if tiny:  # the plumbing size: TINY's width and depth whatever the preset's (layer kinds stay)
        model.update(TINY["model"])
    return {"model": model}


def changes(config: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """What `config` sets differently from `base`: the part that deep-merged onto `base` gives `config` back (a
    section whose layer `kind` differs is kept whole, as `train --config` replaces it whole)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        old = base.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and value.get("kind") == old.get("kind"):
            inner = changes(value, old)
            if inner:
                out[key] = {"kind": value["kind"], **inner} if "kind" in value else inner
        elif key not in base or value != old:
            out[key] = value
    return out


def preset_model(name: str) -> dict[str, Any]:
    """The model section of preset `name` with its base chain merged (src/multibranch/configs/NAME.yaml)."""
    from multibranch.experiment import load_preset_dict  # torch comes with it: only when a CPU run is planned

    return load_preset_dict(name)["model"]


def attention_branches(system: str, recipe: str = "iwslt") -> int:
    """N_a, the attention branches of `system` as `recipe` trains it (1 for the systems without MAT)."""
    if recipe != "cpu" or system in MAT_SYSTEMS:  # the IWSLT recipe's MAT systems (a combination: its MAT's)
        return MAT_SYSTEMS[grid_of(system)][1] if grid_of(system) in MAT_SYSTEMS else 1
    model = deep_merge(preset_model(RECIPES[recipe].base_preset),
                       system_delta(system, RECIPES[recipe].defaults["max_updates"] or 1, recipe=recipe)["model"])
    return int(model["encoder"].get("attention_branches", 1))


def grid_of(system: str) -> str:
    """The MAT system whose rho grid chooses `system`'s rho (a combination uses its MAT system's)."""
    return COMBINATIONS[system][0] if system in COMBINATIONS else system


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
