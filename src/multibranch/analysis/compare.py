"""`multibranch analyze compare`: several report folders of one kind side by side, as one report folder.

    analyze compare --report R1 --report R2 [--label A --label B] --out DIR

Head reports (heads.json): the pruning curves overlaid (score, and change from each model's unpruned
score) and the dominant-head table of every model. Diversity reports (diversity.json): each variant's
diversity per encoder layer, one line per model, and the means. The reports must be of one kind;
compare.json holds the numbers taken from them (nothing is recomputed).

compare.json:
    {"kind": "heads", "metric", "models": [{"label", "report", "baseline", "curve": [{"fraction",
     "masked_heads", "score", "change"}], "mean_dominant_delta": {role: mean} | null}]}
    {"kind": "diversity", "models": [{"label", "report", "layers": [...], "mean": {variant: value}}]}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multibranch.analysis.diversity import TITLES, VARIANTS
from multibranch.errors import DataError, UserError
from multibranch.figures import plots
from multibranch.figures.report import ReportFolder
from multibranch.json_file import read_json_object

# the report's files beside index.md: in a folder of other files, ReportFolder.check refuses them up front
REPORT_FILES = ("compare.json", "pruning_curves.png", "dominant_heads.png", "diversity.png")

KINDS = {"heads.json": "heads", "diversity.json": "diversity"}


def read_report(folder: str | Path) -> tuple[str, dict[str, Any]]:
    """(kind, numbers) of a report folder written by `analyze heads` or `analyze diversity`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a report folder")
    for name, kind in KINDS.items():
        if (folder / name).is_file():
            return kind, read_json_object(folder / name, DataError)
    raise DataError(f"{folder} has none of {', '.join(KINDS)}: not a heads or diversity report")


def compare_reports(folders: list[str], labels: list[str] | None, out: str | Path, force: bool = False) -> ReportFolder:
    """Read every report (one kind), then write compare.json, the overlay plots and index.md."""
    target = Path(out).resolve()
    for folder in folders:
        source = Path(folder).resolve()
        if target.is_relative_to(source):  # the report itself, or a folder inside it
            raise UserError(f"--out {out}: is or lies in the compared report {folder}, whose files the comparison "
                            "would replace; choose another --out")
    ReportFolder.check(out, force, REPORT_FILES)
    if len(folders) < 2:
        raise ValueError("give at least two reports to compare")
    labels = labels or [Path(f).name for f in folders]
    if len(labels) != len(folders) or len(set(labels)) != len(labels):
        raise ValueError(f"need {len(folders)} distinct labels, one per report (got {labels})")
    reports = [read_report(f) for f in folders]
    kinds = {kind for kind, _ in reports}
    if len(kinds) != 1:
        raise ValueError(f"the reports are of different kinds ({', '.join(sorted(kinds))}); compare one kind at a time")
    kind = kinds.pop()
    if kind == "heads":
        return _write_heads(_heads(reports, folders, labels), out, force)
    return _write_diversity(_diversity(reports, folders, labels), out, force)


def _heads(reports: list[tuple[str, dict]], folders: list[str], labels: list[str]) -> dict[str, Any]:
    metrics = {data.get("metric", "bleu") for _, data in reports}
    if len(metrics) != 1:
        raise ValueError(f"the head reports score different metrics ({', '.join(sorted(metrics))})")
    models = []
    for (_, data), folder, label in zip(reports, folders, labels, strict=True):
        curve = (data.get("pruning_curve") or {}).get("points") or []
        dominant = data.get("dominant_heads")
        if not curve and dominant is None:
            raise ValueError(f"{folder} has neither a pruning curve nor a dominant-head table")
        baseline = curve[0]["score"] if curve else dominant["baseline"]
        models.append({"label": label, "report": str(folder), "baseline": baseline,
                       "curve": [{"fraction": p["fraction"], "masked_heads": p["masked_heads"], "score": p["score"],
                                  "change": p["score"] - baseline} for p in curve],
                       "mean_dominant_delta": dominant["mean_dominant_delta"] if dominant else None})
    return {"kind": "heads", "metric": metrics.pop(), "models": models}


def _diversity(reports: list[tuple[str, dict]], folders: list[str], labels: list[str]) -> dict[str, Any]:
    models = [{"label": label, "report": str(folder), "layers": data["layers"], "mean": data["mean"]}
              for (_, data), folder, label in zip(reports, folders, labels, strict=True)]
    return {"kind": "diversity", "models": models}


def _write_heads(report: dict[str, Any], out: str | Path, force: bool) -> ReportFolder:
    metric = "BLEU" if report["metric"] == "bleu" else "accuracy (%)"
    folder = ReportFolder.create(out, force, REPORT_FILES)
    folder.write_json("compare.json", report)
    lines = ["# Head analyses compared", "", "Numbers: [compare.json](compare.json). Reports: "
             + ", ".join(f"[{m['label']}]({m['report']})" for m in report["models"]) + ".", ""]
    with_curve = [m for m in report["models"] if m["curve"]]
    if with_curve:
        folder.write_png("pruning_curves.png", plots.pruning_curves_overlay(with_curve, metric))
        fractions = sorted({p["fraction"] for m in with_curve for p in m["curve"]})
        lines += ["## Pruning curves", "", "Least important heads masked first; right: change from each model's "
                  "unpruned score.", "", "![pruning curves](pruning_curves.png)", "",
                  "| heads masked | " + " | ".join(m["label"] for m in with_curve) + " |",
                  "|---:|" + "---:|" * len(with_curve)]
        for fraction in fractions:
            cells = []
            for m in with_curve:
                point = next((p for p in m["curve"] if p["fraction"] == fraction), None)
                cells.append("-" if point is None else f"{point['score']:.2f} ({point['change']:+.2f})")
            lines.append(f"| {fraction:.0%} | " + " | ".join(cells) + " |")
        lines.append("")
    with_table = [m for m in report["models"] if m["mean_dominant_delta"]]
    if with_table:
        roles = list(dict.fromkeys(r for m in with_table for r in m["mean_dominant_delta"]))
        folder.write_png("dominant_heads.png", plots.dominant_heads_bars(with_table, roles, metric))
        lines += ["## Dominant heads", "", f"Mean {metric} change when the dominant head of each module is masked.",
                  "", "![dominant heads](dominant_heads.png)", "",
                  "| model | unpruned | " + " | ".join(roles) + " |", "|---|---:|" + "---:|" * len(roles)]
        for m in with_table:
            cells = " | ".join(f"{m['mean_dominant_delta'][r]:+.2f}" if r in m["mean_dominant_delta"] else "-"
                               for r in roles)
            lines.append(f"| {m['label']} | {m['baseline']:.2f} | {cells} |")
        lines.append("")
    folder.write_text("index.md", "\n".join(lines))
    return folder


def _write_diversity(report: dict[str, Any], out: str | Path, force: bool) -> ReportFolder:
    folder = ReportFolder.create(out, force, REPORT_FILES)
    folder.write_json("compare.json", report)
    folder.write_png("diversity.png", plots.diversity_comparison_plot(report["models"], TITLES))
    lines = ["# MUTE unit diversity compared", "", "Numbers: [compare.json](compare.json). Reports: "
             + ", ".join(f"[{m['label']}]({m['report']})" for m in report["models"]) + ".", "",
             "![diversity](diversity.png)", "", "Mean over encoder layers (identical units: exp(-1) = 0.368):", "",
             "| model | " + " | ".join(TITLES.values()) + " |", "|---|" + "---:|" * len(VARIANTS)]
    lines += [f"| {m['label']} | " + " | ".join(f"{m['mean'][v]:.3f}" for v in VARIANTS) + " |"
              for m in report["models"]]
    folder.write_text("index.md", "\n".join(lines) + "\n")
    return folder
