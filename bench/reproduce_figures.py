"""The figures of docs/reproduction.md, from the merged results files: each figure's data, then its drawing
(matplotlib, imported only to draw)."""

from __future__ import annotations

import io
import math
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]  # bench.* and this checkout's multibranch (no torch needed)

from bench.reproduce_results import (  # noqa: E402
    LENGTH_SYSTEMS,
    PRUNING_SYSTEMS,
    Merged,
    analysis,
    chosen_rho,
    length_buckets,
    same_rho,
    table_runs,
)
from bench.reproduce_systems import MAT_SYSTEMS, SYSTEMS, attention_branches, grid_of  # noqa: E402
from multibranch.atomic import atomic_write_bytes  # noqa: E402

MUTE_SYSTEMS = ("mute", "mute-bias", "mute-bias-seq")
DIVERSITY_TITLES = {"att_pos": "Att Pos.", "att_sub": "Att Sub.", "ffn_sub": "FFN Sub."}
ROLES = ("encoder_self", "decoder_self", "cross")
KAPPA_ALPHA_LAYER = 1  # the paper's "second encoder layer", and the decoder's layer of the same index
KAPPA_ALPHA_WINDOW = 5  # moving-average window, in logged records


def figure_prefix(recipe: str) -> str:
    return "" if recipe == "iwslt" else f"{recipe}_"


# ---- figure data -------------------------------------------------------------------------------------------


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def seeds_label(system: str, seeds: int) -> str:
    """'drophead (3 seeds)': a figure's label for a system averaged over `seeds` runs."""
    return f"{system} ({seeds} seed{'s' if seeds > 1 else ''})"


def shared_points(series: list[dict[Any, float]]) -> list[Any]:
    """The x values every series has, sorted."""
    return sorted(set.intersection(*(set(s) for s in series))) if series else []


def valid_curves_data(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """system -> {"seeds": {seed: {step: bleu}}, "mean": {step: bleu at the steps all seeds share}}."""
    out = {}
    for system, mine in runs.items():
        seeds = {r["seed"]: {v["step"]: v["bleu"] for v in r["curve"]["valid"] if v.get("bleu") is not None}
                 for r in mine if (r.get("curve") or {}).get("valid")}
        seeds = {seed: points for seed, points in seeds.items() if points}
        if seeds:
            steps = shared_points(list(seeds.values()))
            out[system] = {"seeds": seeds, "mean": {s: mean([p[s] for p in seeds.values()]) for s in steps}}
    return out or None


def pruning_curves_data(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]] | None:
    """Per pruning system: [{"fraction", "score", "score_sd", "change", "change_sd"}] over the fractions all its
    seeds share (change: score minus the seed's unpruned score)."""
    models = []
    for system in PRUNING_SYSTEMS:
        curves = []
        for run in runs.get(system, []):
            points = ((analysis(run, "pruning") or {}).get("pruning_curve") or {}).get("points") or []
            points = [p for p in points if p.get("score") is not None]
            if points:
                first = min(points, key=lambda p: p["fraction"])["score"]
                curves.append({round(p["fraction"], 6): (p["score"], p["score"] - first) for p in points})
        if curves:
            curve = []
            for f in shared_points(curves):
                scores, changes = [c[f][0] for c in curves], [c[f][1] for c in curves]
                curve.append({"fraction": f, "score": mean(scores), "score_sd": sd(scores), "change": mean(changes),
                              "change_sd": sd(changes)})
            models.append({"system": system, "label": seeds_label(system, len(curves)), "curve": curve})
    return models or None


def lengths_data(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """An `analyze lengths` report of the mean BLEU per bucket over seeds, one model per system."""
    buckets: list[dict[str, Any]] = []
    models = []
    for system in LENGTH_SYSTEMS:
        per_seed = list(length_buckets(runs, system).values())
        if not per_seed:
            continue
        buckets = buckets or [{k: b.get(k) for k in ("label", "low", "high")} for b in per_seed[0].values()]
        rows = []
        for bucket in buckets:
            scores = [p[bucket["label"]]["bleu"] for p in per_seed
                      if bucket["label"] in p and p[bucket["label"]].get("bleu") is not None]
            sentences = next((p[bucket["label"]].get("sentences") for p in per_seed if bucket["label"] in p), 0)
            rows.append({"label": bucket["label"], "bleu": mean(scores) if scores else None,
                         "sentences": sentences})
        models.append({"label": seeds_label(system, len(per_seed)), "buckets": rows})
    return {"buckets": buckets, "models": models} if models else None


def diversity_data(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]] | None:
    """Per MUTE system: {"label", "layers": [{"layer", att_pos, att_sub, ffn_sub}]}, means over seeds."""
    models = []
    for system in MUTE_SYSTEMS:
        reports = [r for r in (analysis(run, "diversity") for run in runs.get(system, [])) if r and r.get("layers")]
        if not reports:
            continue
        per_seed = [{row["layer"]: row for row in report["layers"]} for report in reports]
        layers = [{"layer": layer, **{k: mean([p[layer][k] for p in per_seed if p[layer].get(k) is not None])
                                      for k in DIVERSITY_TITLES}} for layer in shared_points(per_seed)]
        models.append({"label": seeds_label(system, len(reports)), "layers": layers})
    return models or None


KAPPA_ALPHA_KEY = re.compile(
    rf"^(encoder|decoder)\.layers\.{KAPPA_ALPHA_LAYER}\.(?:.+\.)?weights\.(kappa|alpha)\.(\d+)$")


def kappa_alpha_data(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The Weighted Transformer's kappa/alpha of layer KAPPA_ALPHA_LAYER of each side over updates, from its lowest
    seed that logged them: {"seed", "sides": {side: {"kappa": {branch: (steps, values)}, "alpha": {...}}}}, the
    sides in encoder, decoder order."""
    for run in runs.get("weighted", []):  # sorted by seed
        sides: dict[str, dict[str, dict[int, tuple[list[int], list[float]]]]] = {}
        for record in (run.get("curve") or {}).get("kappa_alpha") or []:
            for key, value in record.items():
                found = KAPPA_ALPHA_KEY.match(key)
                if found and isinstance(value, (int, float)):
                    side = sides.setdefault(found.group(1), {"kappa": {}, "alpha": {}})
                    steps, values = side[found.group(2)].setdefault(int(found.group(3)), ([], []))
                    steps.append(record["step"])
                    values.append(float(value))
        if sides:
            return {"seed": run["seed"], "sides": {s: sides[s] for s in ("encoder", "decoder") if s in sides}}
    return None


def rho_grid_data(merged: Merged) -> dict[str, Any] | None:
    """MAT system whose grid it is -> {"scores": {rho: valid BLEU}, "chosen": rho}, from the rows."""
    out: dict[str, Any] = {}
    for system in [s for s in SYSTEMS if s in MAT_SYSTEMS]:
        scores = merged.rows.get(system, {}).get("rho_grid_valid_bleu") or {}
        scores = {float(rho): bleu for rho, bleu in scores.items() if bleu is not None}
        grid = grid_of(system)
        if scores and grid not in out:
            out[grid] = {"scores": dict(sorted(scores.items())), "chosen": chosen_rho(grid, merged)}
    return out or None


def branch_importance_data(runs: dict[str, list[dict[str, Any]]], recipe: str = "iwslt") -> dict[str, Any] | None:
    """MAT system -> role -> {"mean": [per branch], "sd": [...]}: head importance summed over each branch's heads
    (head h is in branch h // M, M = heads / N_a), averaged over the role's layers, then over seeds."""
    out: dict[str, Any] = {}
    for system, mine in runs.items():
        branches = attention_branches(system, recipe) if system in SYSTEMS else 1
        if branches < 2:
            continue
        per_seed: list[dict[str, list[float]]] = []
        for run in mine:
            report = analysis(run, "importance") or analysis(run, "pruning")
            sums: dict[str, list[list[float]]] = {}
            for module in (report or {}).get("modules") or []:
                importance = module.get("importance") or []
                if not importance or len(importance) % branches:
                    continue
                per = len(importance) // branches
                sums.setdefault(module["role"], []).append([sum(importance[b * per:(b + 1) * per])
                                                            for b in range(branches)])
            if sums:
                per_seed.append({role: [mean([layer[b] for layer in rows]) for b in range(branches)]
                                 for role, rows in sums.items()})
        roles = [r for r in ROLES if any(r in seed for seed in per_seed)]
        if roles:
            out[system] = {role: {"mean": [mean([s[role][b] for s in per_seed if role in s]) for b in range(branches)],
                                  "sd": [sd([s[role][b] for s in per_seed if role in s]) for b in range(branches)],
                                  "seeds": sum(1 for s in per_seed if role in s)} for role in roles}
    return out or None


# ---- figures -----------------------------------------------------------------------------------------------


def system_color(system: str) -> Any:
    """One colour per system, the same in every figure."""
    import matplotlib

    index = SYSTEMS.index(system) if system in SYSTEMS else len(SYSTEMS)
    return matplotlib.colormaps["tab20"](index % 20)


def draw_valid_curves(data: dict[str, Any]) -> Any:
    """Validation BLEU against updates: per system the mean over seeds (thick) and each seed (thin)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.8), layout="constrained")
    for system, curves in data.items():
        color = system_color(system)
        for points in curves["seeds"].values():
            ax.plot(list(points), list(points.values()), color=color, alpha=0.3, linewidth=0.8)
        ax.plot(list(curves["mean"]), list(curves["mean"].values()), color=color, linewidth=1.8,
                label=f"{system} ({len(curves['seeds'])})")
    ax.set_xlabel("updates")
    ax.set_ylabel("validation BLEU")
    ax.set_title("validation BLEU (mean over seeds at the updates all share; thin: each seed)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="system (seeds)", title_fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def draw_pruning_curves(models: list[dict[str, Any]]) -> Any:
    """multibranch's pruning-curve overlay of the seed means, with a ± sd band over seeds."""
    from multibranch.figures import plots

    fig = plots.pruning_curves_overlay([{**model, "color": system_color(model["system"])} for model in models])
    for ax, key in zip(fig.axes[:2], ("score", "change"), strict=True):
        for line, model in zip(ax.lines, models, strict=False):
            xs = [100 * p["fraction"] for p in model["curve"]]
            ax.fill_between(xs, [p[key] - p[f"{key}_sd"] for p in model["curve"]],
                            [p[key] + p[f"{key}_sd"] for p in model["curve"]], color=line.get_color(), alpha=0.2)
    fig.suptitle("pruning curves (least important heads first; mean ± sd over seeds)")
    return fig


def draw_bleu_by_length(report: dict[str, Any]) -> Any:
    from multibranch.figures import plots

    fig = plots.length_buckets_plot(report)
    fig.axes[0].set_title("BLEU by source length (mean over seeds)")
    return fig


def draw_mute_diversity(models: list[dict[str, Any]]) -> Any:
    from multibranch.figures import plots

    fig = plots.diversity_comparison_plot(models, DIVERSITY_TITLES)
    fig.suptitle("MUTE unit diversity per encoder layer (eq. 21; mean over seeds; dashed: identical units)")
    return fig


def draw_kappa_alpha(data: dict[str, Any]) -> Any:
    """One row per side, two panels (kappa, alpha) against updates, one line per branch: moving average of
    KAPPA_ALPHA_WINDOW records (solid) over the logged values (faint)."""
    import matplotlib.pyplot as plt

    from multibranch.figures.curves import moving_average

    sides = data["sides"]
    fig, axes = plt.subplots(len(sides), 2, figsize=(10.0, 3.2 * len(sides)), layout="constrained", sharex=True,
                             squeeze=False)
    for row, (side, series) in zip(axes, sides.items(), strict=True):
        for ax, key in zip(row, ("kappa", "alpha"), strict=True):
            for branch, (steps, values) in sorted(series[key].items()):
                line, = ax.plot(steps, moving_average(values, KAPPA_ALPHA_WINDOW), label=f"branch {branch + 1}")
                ax.plot(steps, values, color=line.get_color(), alpha=0.25, linewidth=0.8)
            ax.set_title(f"{side} layer {KAPPA_ALPHA_LAYER + 1}: {'κ' if key == 'kappa' else 'α'} ({key})")
            ax.grid(alpha=0.3)
            if series[key]:
                ax.legend(fontsize=7)
        row[0].set_ylabel("weight")
    for ax in axes[-1]:
        ax.set_xlabel("updates")
    fig.suptitle(f"Weighted Transformer (seed {data['seed']}; moving average of {KAPPA_ALPHA_WINDOW} records)")
    return fig


def draw_rho_grid(data: dict[str, Any]) -> Any:
    """Validation BLEU against MAT's drop-branch rate rho, the chosen rho marked."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), layout="constrained")
    for system, grid in data.items():
        color = system_color(system)
        ax.plot(list(grid["scores"]), list(grid["scores"].values()), marker="o", color=color, label=system)
        chosen = next((rho for rho in grid["scores"] if same_rho(rho, grid["chosen"])), None)
        if chosen is not None:
            ax.plot([chosen], [grid["scores"][chosen]], marker="*", markersize=14, color=color, linestyle="none")
    ax.set_xlabel("drop-branch rate ρ")
    ax.set_ylabel("best validation BLEU (grid seed)")
    ax.set_title("MAT ρ grid (star: the ρ chosen)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def draw_branch_importance(data: dict[str, Any]) -> Any:
    """Per MAT system, bars per branch for each attention role: head importance summed over the branch."""
    import matplotlib.pyplot as plt

    from multibranch.figures.plots import ROLE_TITLES

    fig, axes = plt.subplots(1, len(data), figsize=(4.6 * len(data), 3.6), squeeze=False, layout="constrained")
    for ax, (system, roles) in zip(axes[0], data.items(), strict=True):
        branches = len(next(iter(roles.values()))["mean"])
        width = 0.8 / branches
        for b in range(branches):
            xs = [j + (b - (branches - 1) / 2) * width for j in range(len(roles))]
            spread = [roles[r]["sd"][b] for r in roles] if any(r["seeds"] > 1 for r in roles.values()) else None
            ax.bar(xs, [roles[r]["mean"][b] for r in roles], width, yerr=spread, capsize=2, label=f"branch {b + 1}")
        ax.set_xticks(range(len(roles)), [ROLE_TITLES.get(r, r).replace(" ", "\n", 1) for r in roles],
                      fontsize=8)
        seeds = max(r["seeds"] for r in roles.values())
        ax.set_title(seeds_label(system, seeds), fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("head importance summed per branch\n(mean over layers)")
    fig.suptitle("MAT head importance per branch (mean ± sd over seeds)")
    return fig


@dataclass(frozen=True)
class Figure:
    name: str
    caption: str
    data: Callable[[Merged, dict[str, list[dict[str, Any]]]], Any]
    draw: Callable[[Any], Any]


FIGURES = (
    Figure("valid_curves.png", "validation BLEU against updates, per system", lambda m, r: valid_curves_data(r),
           draw_valid_curves),
    Figure("pruning_curves.png", "BLEU as heads are masked: standard, Scheduled DropHead, MAT, MAT + DropHead",
           lambda m, r: pruning_curves_data(r), draw_pruning_curves),
    Figure("bleu_by_length.png", "BLEU by source length: standard, MUSE, MUSE-simple", lambda m, r: lengths_data(r),
           draw_bleu_by_length),
    Figure("mute_diversity.png", "MUTE unit diversity per encoder layer", lambda m, r: diversity_data(r),
           draw_mute_diversity),
    Figure("kappa_alpha.png", "Weighted Transformer kappa and alpha of the second encoder and decoder layers during "
           "training",
           lambda m, r: kappa_alpha_data(r), draw_kappa_alpha),
    Figure("mat_rho_grid.png", "validation BLEU over MAT's rho grid", lambda m, r: rho_grid_data(m), draw_rho_grid),
    Figure("mat_branch_importance.png", "MAT head importance summed per branch",
           lambda m, r: branch_importance_data(r, m.recipe), draw_branch_importance),
)


def figure_data(merged: Merged) -> list[tuple[Figure, Any]]:
    """The figures the merged results hold data for, with that data (named with the recipe's prefix)."""
    runs = table_runs(merged)
    prefix = figure_prefix(merged.recipe)
    return [(Figure(prefix + figure.name, figure.caption, figure.data, figure.draw), data) for figure in FIGURES
            if (data := figure.data(merged, runs))]


def write_png(path: Path, fig: Any) -> None:
    """Save a matplotlib figure as PNG atomically, and close it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def draw_curve(data: dict[str, Any]) -> Any:
    """Validation BLEU against updates, the best so far, and the chosen update count where there is one."""
    import matplotlib.pyplot as plt

    steps = [p["step"] for p in data["curve"]]
    bleus = [p["bleu"] for p in data["curve"]]
    best = [max(bleus[: i + 1]) for i in range(len(bleus))]
    fig, ax = plt.subplots(figsize=(7.0, 3.6), layout="constrained")
    ax.plot(steps, bleus, marker="o", markersize=3, color=system_color("standard"), label="validation BLEU")
    ax.plot(steps, best, linestyle="--", linewidth=1.0, color="grey", label="best so far")
    chosen = data.get("chosen_updates")
    if chosen:
        ax.axvline(chosen, color="black", linewidth=0.8, linestyle=":", label=f"chosen: {chosen:,} updates")
    rule = data.get("rule") or {}
    status = f"chosen at {chosen:,} updates" if chosen else "still rising: no update count chosen yet"
    ax.set_title(f"standard model (transformer-tiny, seed {data.get('seed', 1)}): {status}\n"
                 f"rule: the best rises by at most {rule.get('gain')} BLEU over {rule.get('window')} updates",
                 fontsize=9)
    ax.set_xlabel("updates")
    ax.set_ylabel("BLEU on val (beam 5)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig

