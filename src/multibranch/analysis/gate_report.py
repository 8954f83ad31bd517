"""`multibranch analyze gates`: the learned mixing weights of a checkpoint as a report folder.

gates.json:
    {"checkpoint", "ratio_kernels": [3, 15], "kernel_gates": [...], "branch_weights": [...], "unit_weights": [...]}
(the rows of analysis/mixing.py; lists are empty for models without such parameters), and with prepared data
a Weighted Transformer's "replacement": {"data", "split", ...}, its split translated with the learned kappa/alpha
and with them replaced by uniform and random ones (analysis/replacement.py; the paper's Table 3).
Plots: kernel_gate_ratio.png (MUSE), kappa_alpha.png (Weighted), unit_weights.png (MUTE).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multibranch.analysis.batches import check_vocabulary
from multibranch.analysis.mixing import branch_weights, kernel_gates, unit_weights
from multibranch.analysis.replacement import ReplacementOptions, replacement_scores
from multibranch.figures import plots
from multibranch.figures.report import ReportFolder
from multibranch.loading.checkpoint import LoadedCheckpoint, load_model
from multibranch.tasks.translation.dataset import PreparedData

# the report's files beside index.md: in a folder of other files, ReportFolder.check refuses them up front
REPORT_FILES = ("gates.json", "kernel_gate_ratio.png", "kappa_alpha.png", "unit_weights.png")


def analyze_gates(ckpt: str | Path, out: str | Path, ratio: tuple[int, int] = (3, 15), force: bool = False,
                  data_dir: str | Path | None = None, replacement: ReplacementOptions | None = None) -> ReportFolder:
    """The report of `ckpt`'s mixing weights; with `data_dir` (a Weighted Transformer's prepared data), also its
    split translated with the weights replaced (`replacement`'s options). ValueError (before writing) when the
    model has no kernel gates, kappa/alpha or unit weights, or `data_dir` is given for a model without kappa/alpha."""

    ReportFolder.check(out, force, REPORT_FILES)
    options = replacement or ReplacementOptions()
    if data_dir is None:
        loaded = load_model(ckpt, "cpu")
    else:
        loaded = load_model(ckpt, options.device, task="translation")
    model = loaded.model
    report = {"checkpoint": str(ckpt), "ratio_kernels": list(ratio), "kernel_gates": kernel_gates(model, ratio),
              "branch_weights": branch_weights(model), "unit_weights": unit_weights(model)}
    if not (report["kernel_gates"] or report["branch_weights"] or report["unit_weights"]):
        raise ValueError(f"{ckpt} has no learned mixing weights (MUSE kernel gates, Weighted kappa/alpha or MUTE "
                         "unit weights): nothing to analyse")
    if data_dir is not None:
        if not report["branch_weights"]:
            raise ValueError(f"{ckpt} has no Weighted Transformer kappa/alpha: --data replaces them, leave it out")
        report["replacement"] = replaced_weights(loaded, str(ckpt), data_dir, options)
    return write_report(report, out, force)


def replaced_weights(loaded: LoadedCheckpoint, ckpt: str, data_dir: str | Path,
                     options: ReplacementOptions) -> dict[str, Any]:
    """The first `options.max_sentences` of the split translated with the learned and the replaced kappa/alpha."""
    data = PreparedData.load(data_dir)
    check_vocabulary(data, loaded.config.model, ckpt)
    split = data.split(options.split)
    n = len(split) if options.max_sentences is None else min(options.max_sentences, len(split))
    scores = replacement_scores(loaded.model, loaded.tokenizer or data.tokenizer(), split.raw_src_lines()[:n],
                                split.raw_tgt_lines()[:n], loaded.config.decode, options)
    return {"data": str(data_dir), "split": split.name, **scores}


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
    replaced = report.get("replacement")
    if replaced:
        lines += ["## Weighted Transformer kappa / alpha replaced at test time", "",
                  f"The first {replaced['sentences']} sentences of `{replaced['split']}` translated with the learned "
                  "weights, with 1/M each, and with random points of the simplex (the paper's Table 3).", "",
                  "| weights | BLEU | chrF |", "|---|---:|---:|",
                  f"| learned | {replaced['learned']['bleu']:.2f} | {replaced['learned']['chrf']:.2f} |",
                  f"| uniform | {replaced['uniform']['bleu']:.2f} | {replaced['uniform']['chrf']:.2f} |"]
        lines += [f"| random (seed {r['seed']}) | {r['bleu']:.2f} | {r['chrf']:.2f} |" for r in replaced["random"]]
        if replaced["random_mean"]:
            mean = replaced["random_mean"]
            lines.append(f"| random (mean) | {mean['bleu']:.2f} | {mean['chrf']:.2f} |")
        if replaced.get("uniform_per_module"):
            lines += ["", "1/M in one module at a time, the others learned:", "", "| module | BLEU | chrF |",
                      "|---|---:|---:|"]
            lines += [f"| {m['name']} | {m['bleu']:.2f} | {m['chrf']:.2f} |" for m in replaced["uniform_per_module"]]
        lines += ["", f"BLEU: `{replaced['signatures']['bleu']}`", ""]
    if report["unit_weights"]:
        folder.write_png("unit_weights.png", plots.unit_weights_plot(report["unit_weights"]))
        lines += ["## MUTE unit weights", "", "Learned w_j per encoder layer.", "", "![unit weights](unit_weights.png)",
                  ""]
    folder.write_text("index.md", "\n".join(lines))
    return folder
