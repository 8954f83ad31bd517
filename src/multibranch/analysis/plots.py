"""Matplotlib figures of the head analyses (Agg backend: no display needed). Each function returns a
figure for `ReportFolder.write_png`."""

from __future__ import annotations

import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

ROLE_TITLES = {"encoder_self": "encoder self-attention", "decoder_self": "decoder self-attention",
               "cross": "encoder-decoder attention"}


def head_heatmaps(modules: list[dict[str, Any]], key: str, title: str, label: str) -> Any:
    """One heatmap (layers x heads) per attention type of `modules[i][key]` (lists per head)."""
    roles = [r for r in ROLE_TITLES if any(m["role"] == r for m in modules)]
    fig, axes = plt.subplots(1, len(roles), figsize=(4.6 * len(roles), 3.6), squeeze=False, layout="constrained")
    for ax, role in zip(axes[0], roles, strict=True):
        rows = sorted((m for m in modules if m["role"] == role), key=lambda m: m["layer"])
        width = max(len(m[key]) for m in rows)
        grid = [[*m[key], *[math.nan] * (width - len(m[key]))] for m in rows]  # pruned modules: fewer heads
        image = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_title(ROLE_TITLES[role], fontsize=10)
        ax.set_xlabel("head")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(rows)), [str(m["layer"]) for m in rows])
        fig.colorbar(image, ax=ax)
    fig.suptitle(f"{title} ({label})")
    return fig


def pruning_curve_plot(points: list[dict[str, Any]], metric: str = "BLEU") -> Any:
    fig, ax = plt.subplots(figsize=(5.5, 3.6), layout="constrained")
    ax.plot([100 * p["fraction"] for p in points], [p["score"] for p in points], marker="o")
    ax.set_xlabel("heads masked (%)")
    ax.set_ylabel(metric)
    ax.set_title("pruning curve (least important heads first)")
    ax.grid(alpha=0.3)
    return fig
