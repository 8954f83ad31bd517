"""Matplotlib figures of the head analyses (Agg backend: no display needed). Each function returns a
figure for `ReportFolder.write_png`.

Matplotlib is imported by the first drawing, not with this module: the trainer and the analyses import it,
and a command that draws nothing (translate, train without --plots) starts without matplotlib's import."""

from __future__ import annotations

import functools
import math
from typing import Any


@functools.cache
def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _integer_ticks(axis: Any) -> None:
    """Ticks of `axis` (ax.xaxis, ax.yaxis) at integers only: layers, heads, units."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))

ROLE_TITLES = {"encoder_self": "encoder self-attention", "decoder_self": "decoder self-attention",
               "cross": "encoder-decoder attention"}


def head_heatmaps(modules: list[dict[str, Any]], key: str, title: str, label: str) -> Any:
    """One heatmap (layers x heads) per attention type of `modules[i][key]` (lists per head)."""
    roles = [r for r in ROLE_TITLES if any(m["role"] == r for m in modules)]
    fig, axes = _pyplot().subplots(1, len(roles), figsize=(4.6 * len(roles), 3.6), squeeze=False, layout="constrained")
    for ax, role in zip(axes[0], roles, strict=True):
        rows = sorted((m for m in modules if m["role"] == role), key=lambda m: m["layer"])
        width = max(len(m[key]) for m in rows)
        grid = [[*m[key], *[math.nan] * (width - len(m[key]))] for m in rows]  # pruned modules: fewer heads
        image = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_title(ROLE_TITLES[role], fontsize=10)
        ax.set_xlabel("head")
        _integer_ticks(ax.xaxis)
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(rows)), [str(m["layer"]) for m in rows])
        fig.colorbar(image, ax=ax)
    fig.suptitle(f"{title} ({label})")
    return fig


def pruning_curve_plot(points: list[dict[str, Any]], metric: str = "BLEU") -> Any:
    fig, ax = _pyplot().subplots(figsize=(5.5, 3.6), layout="constrained")
    ax.plot([100 * p["fraction"] for p in points], [p["score"] for p in points], marker="o")
    ax.set_xlabel("heads masked (%)")
    ax.set_ylabel(metric)
    ax.set_title("pruning curve (least important heads first)")
    ax.grid(alpha=0.3)
    return fig


def length_buckets_plot(report: dict[str, Any]) -> Any:
    """Grouped bars: BLEU per source-length bucket for each model, sentence counts on a second axis."""
    labels = [b["label"] for b in report["buckets"]]
    models = report["models"]
    fig, ax = _pyplot().subplots(figsize=(7.0, 3.8), layout="constrained")
    width = 0.8 / len(models)
    for i, model in enumerate(models):
        xs = [j + (i - (len(models) - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, [math.nan if b["bleu"] is None else b["bleu"] for b in model["buckets"]], width,
               label=model["label"])
    counts = ax.twinx()
    counts.plot(range(len(labels)), [b["sentences"] for b in models[0]["buckets"]], color="black", marker=".",
                linewidth=1, label="sentences")
    counts.set_ylabel("sentences")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("source length (subword tokens)")
    ax.set_ylabel("BLEU")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("BLEU by source length")
    return fig


def kernel_gate_ratio_plot(gates: list[dict[str, Any]], small: int, large: int) -> Any:
    """softmax(g)_small / softmax(g)_large against the layer, one line per side (encoder, decoder)."""
    fig, ax = _pyplot().subplots(figsize=(5.5, 3.6), layout="constrained")
    for side in ("encoder", "decoder"):
        rows = sorted((g for g in gates if g["side"] == side and g["ratio"] is not None), key=lambda g: g["layer"])
        if rows:
            ax.plot([g["layer"] for g in rows], [g["ratio"] for g in rows], marker="o", label=side)
    ax.set_xlabel("layer")
    _integer_ticks(ax.xaxis)
    ax.set_ylabel(f"gate k={small} / gate k={large}")
    ax.set_title("MUSE kernel-gate ratio")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def kappa_alpha_heatmaps(rows: list[dict[str, Any]]) -> Any:
    """Two heatmaps (modules x branches): kappa and alpha."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(9.0, 0.4 * len(rows) + 2.0), layout="constrained")
    for ax, key in zip(axes, ("kappa", "alpha"), strict=True):
        image = ax.imshow([r[key] for r in rows], aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_title(key)
        ax.set_xlabel("branch")
        _integer_ticks(ax.xaxis)
        ax.set_yticks(range(len(rows)), [f"{r['side']} {r['layer']}" for r in rows])
        fig.colorbar(image, ax=ax)
    return fig


def unit_weights_plot(rows: list[dict[str, Any]]) -> Any:
    """Unit weight w_j against j, one line per MUTE layer."""
    fig, ax = _pyplot().subplots(figsize=(5.5, 3.6), layout="constrained")
    for row in rows:
        ax.plot(range(1, len(row["weights"]) + 1), row["weights"], marker="o", label=f"layer {row['layer']}")
    ax.set_xlabel("unit j")
    _integer_ticks(ax.xaxis)
    ax.set_ylabel("w_j")
    ax.set_title("MUTE unit weights")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def diversity_plot(layers: list[dict[str, Any]], titles: dict[str, str]) -> Any:
    """Diversity of each variant against the encoder layer, with the identical-units level exp(-1)."""
    fig, ax = _pyplot().subplots(figsize=(5.5, 3.6), layout="constrained")
    for key, title in titles.items():
        ax.plot([row["layer"] for row in layers], [row[key] for row in layers], marker="o", label=title)
    ax.axhline(math.exp(-1.0), color="gray", linestyle="--", linewidth=1, label="identical units")
    ax.set_xlabel("encoder layer")
    _integer_ticks(ax.xaxis)
    ax.set_ylabel("diversity exp(-mean cos)")
    ax.set_title("MUTE unit diversity (eq. 21)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def _grid(panels: int, width: float = 4.0, height: float = 3.0) -> tuple[Any, list[Any]]:
    cols = min(3, panels)
    rows = math.ceil(panels / cols)
    fig, axes = _pyplot().subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained")
    flat = list(axes.flat)
    for ax in flat[panels:]:
        ax.set_visible(False)
    return fig, flat[:panels]


def run_curves_plot(curves: dict[str, dict[str, dict[str, list]]]) -> Any:
    """One panel per metric name (train and valid series together)."""
    keys = list(dict.fromkeys([*curves["train"], *curves["valid"]]))
    fig, axes = _grid(len(keys))
    for ax, key in zip(axes, keys, strict=True):
        for kind, style in (("train", "-"), ("valid", "o-")):
            series = curves[kind].get(key)
            if series:
                ax.plot(series["step"], series["value"], style, markersize=3, label=kind)
        if key in ("lr",):
            ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
        ax.set_title(key)
        ax.set_xlabel("update")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    return fig


def metric_group(name: str) -> tuple[str, str]:
    """'encoder.layers.0.branched.weights.kappa.2' -> ('encoder.layers.0.branched.weights.kappa', '2');
    a name without a trailing index is its own group."""
    head, _, last = name.rpartition(".")
    if head and last.isdigit():
        return head, last
    stripped = last.rstrip("0123456789")
    if head and stripped and stripped != last:  # 'w3', 'k15'
        return f"{head}.{stripped}", last
    return name, ""


def module_curves_plot(curves: dict[str, dict[str, list]]) -> Any:
    """One panel per metric group (e.g. a module's kappa), raw values faint, moving average solid."""
    groups: dict[str, list[str]] = {}
    for name in curves:
        groups.setdefault(metric_group(name)[0], []).append(name)
    fig, axes = _grid(len(groups), 4.2, 2.8)
    for ax, (group, names) in zip(axes, groups.items(), strict=True):
        for name in names:
            series = curves[name]
            line, = ax.plot(series["step"], series["smoothed"], label=metric_group(name)[1] or None)
            ax.plot(series["step"], series["value"], color=line.get_color(), alpha=0.25, linewidth=0.8)
        ax.set_title(group, fontsize=8)
        ax.set_xlabel("update")
        if any(metric_group(n)[1] for n in names):
            ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    return fig


def schedule_curves_plot(curves: dict[str, dict[str, Any]]) -> Any:
    fig, ax = _pyplot().subplots(figsize=(6.0, 3.6), layout="constrained")
    for path, series in curves.items():
        ax.plot(series["step"], series["value"], label=f"{path} ({series['schedule']})")
    ax.set_xlabel("update")
    ax.set_ylabel("rate")
    ax.set_title("rate schedules")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def attention_map_plot(panels: list[tuple[str, Any]], queries: list[str], keys: list[str], title: str) -> Any:
    """One heatmap per panel (queries down, keys across) with token labels."""
    tokens = max(len(queries), len(keys))
    cols = min(4 if tokens <= 20 else 2, len(panels))
    rows = math.ceil(len(panels) / cols)
    size = min(0.22 * tokens + 1.5, 7.0)  # inches per panel: long sentences must not make huge images
    fig, axes = _pyplot().subplots(rows, cols, figsize=(size * cols, size * rows), squeeze=False, layout="constrained")
    flat = list(axes.flat)
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    for ax, (name, probs) in zip(flat, panels, strict=False):
        grid = probs.numpy() if hasattr(probs, "numpy") else probs  # a CPU tensor [L, S] or nested lists
        ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(name, fontsize=9)
        font = 7 if tokens <= 30 else 5
        ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=font)
        ax.set_yticks(range(len(queries)), queries, fontsize=font)
    fig.suptitle(title, fontsize=10)
    return fig


def pruning_curves_overlay(models: list[dict[str, Any]], metric: str = "BLEU") -> Any:
    """Two panels: each model's pruning curve (score) and its change from the model's unpruned score (in the model's
    "color" where it has one)."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(10.0, 3.6), layout="constrained")
    for model in models:
        xs = [100 * p["fraction"] for p in model["curve"]]
        style = {"marker": "o", "label": model["label"], "color": model.get("color")}
        axes[0].plot(xs, [p["score"] for p in model["curve"]], **style)
        axes[1].plot(xs, [p["change"] for p in model["curve"]], **style)
    for ax, ylabel in zip(axes, (metric, f"{metric} change from unpruned"), strict=True):
        ax.set_xlabel("heads masked (%)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("pruning curves (least important heads first)")
    return fig


def dominant_heads_bars(models: list[dict[str, Any]], roles: list[str], metric: str = "BLEU") -> Any:
    """Grouped bars: mean score change when each module's dominant head is masked, per attention type and model."""
    fig, ax = _pyplot().subplots(figsize=(6.5, 3.6), layout="constrained")
    width = 0.8 / len(models)
    for i, model in enumerate(models):
        xs = [j + (i - (len(models) - 1) / 2) * width for j in range(len(roles))]
        ax.bar(xs, [model["mean_dominant_delta"].get(r, math.nan) for r in roles], width, label=model["label"])
    ax.set_xticks(range(len(roles)), [ROLE_TITLES.get(r, r) for r in roles], fontsize=8)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_ylabel(f"{metric} change")
    ax.set_title("dominant head masked (mean over layers)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return fig


def diversity_comparison_plot(models: list[dict[str, Any]], titles: dict[str, str]) -> Any:
    """One panel per diversity variant: diversity against the encoder layer, one line per model."""
    fig, axes = _pyplot().subplots(1, len(titles), figsize=(4.0 * len(titles), 3.4), squeeze=False, layout="constrained")
    for ax, (key, title) in zip(axes[0], titles.items(), strict=True):
        for model in models:
            ax.plot([row["layer"] for row in model["layers"]], [row[key] for row in model["layers"]], marker="o",
                    label=model["label"])
        ax.axhline(math.exp(-1.0), color="gray", linestyle="--", linewidth=1)
        ax.set_title(title)
        ax.set_xlabel("encoder layer")
        _integer_ticks(ax.xaxis)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("diversity exp(-mean cos)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("MUTE unit diversity (eq. 21; dashed: identical units)")
    return fig
