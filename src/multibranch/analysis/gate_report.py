"""`multibranch analyze gates`: the learned mixing weights of a checkpoint as a report folder.

gates.json:
    {"checkpoint", "ratio_kernels": [3, 15], "kernel_gates": [...], "branch_weights": [...], "unit_weights": [...]}
(the rows of analysis/mixing.py; lists are empty for models without such parameters).
Plots: kernel_gate_ratio.png (MUSE), kappa_alpha.png (Weighted), unit_weights.png (MUTE).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multibranch.analysis.mixing import branch_weights, kernel_gates, unit_weights
from multibranch.figures import plots
from multibranch.figures.report import ReportFolder
from multibranch.loading.checkpoint import load_model

# the report's files beside index.md: in a folder of other files, ReportFolder.check refuses them up front
REPORT_FILES = ("gates.json", "kernel_gate_ratio.png", "kappa_alpha.png", "unit_weights.png")


def analyze_gates(ckpt: str | Path, out: str | Path, ratio: tuple[int, int] = (3, 15),
                  force: bool = False) -> ReportFolder:
    """ValueError (before writing) when the model has no kernel gates, kappa/alpha or unit weights."""

    ReportFolder.check(out, force, REPORT_FILES)
    model = load_model(ckpt, "cpu").model
    report = {"checkpoint": str(ckpt), "ratio_kernels": list(ratio), "kernel_gates": kernel_gates(model, ratio),
              "branch_weights": branch_weights(model), "unit_weights": unit_weights(model)}
    if not (report["kernel_gates"] or report["branch_weights"] or report["unit_weights"]):
        raise ValueError(f"{ckpt} has no learned mixing weights (MUSE kernel gates, Weighted kappa/alpha or MUTE "
                         "unit weights): nothing to analyse")
    return write_report(report, out, force)


def write_report(report: dict[str, Any], out: str | Path, force: bool) -> ReportFolder:
    folder = ReportFolder.create(out, force, REPORT_FILES)
    folder.write_json("gates.json", report)
    lines = [f"# Learned mixing weights of `{report['checkpoint']}`", "", "Numbers: [gates.json](gates.json).", ""]
    gates = report["kernel_gates"]
    if gates:
        small, large = report["ratio_kernels"]
        folder.write_png("kernel_gate_ratio.png", plots.kernel_gate_ratio_plot(gates, small, large))
        lines += ["## MUSE kernel gates", "", f"softmax(g)_k={small} / softmax(g)_k={large} per layer.", "",
                  "![kernel gate ratio](kernel_gate_ratio.png)", "", "| module | softmax(g) | ratio |", "|---|---|---:|"]
        lines += [f"| {g['name']} | " + ", ".join(f"k{k}: {w:.3f}" for k, w in zip(g["kernel_sizes"], g["weights"]))
                  + f" | {'-' if g['ratio'] is None else format(g['ratio'], '.3f')} |" for g in gates]
        lines.append("")
    if report["branch_weights"]:
        folder.write_png("kappa_alpha.png", plots.kappa_alpha_heatmaps(report["branch_weights"]))
        lines += ["## Weighted Transformer kappa / alpha", "", "Effective weights per module (rows) and branch.", "",
                  "![kappa and alpha](kappa_alpha.png)", ""]
    if report["unit_weights"]:
        folder.write_png("unit_weights.png", plots.unit_weights_plot(report["unit_weights"]))
        lines += ["## MUTE unit weights", "", "Learned w_j per encoder layer.", "", "![unit weights](unit_weights.png)",
                  ""]
    folder.write_text("index.md", "\n".join(lines))
    return folder
