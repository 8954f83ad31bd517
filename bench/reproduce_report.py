"""The table and figures of docs/reproduction.md, from the results files of several bench/reproduce.py calls.

    python bench/reproduce_report.py [FILES...] [--docs docs/reproduction.md] [--images DIR] [--ref PATH]
                                     [--json PATH] [--check] [--accept-difference KEY ...]

FILES (default: every bench/results/reproduce_*.json but the *_hyps.json files, --tiny ones and ones without a
finished run, in name order, numbers compared as numbers) are merged run by run, keyed by (run folder, seed): a
run in two files is taken from the later one (a note on stderr), except that a record of an unfinished run never
replaces a finished one. Files whose recipes differ (patience, valid_every, average_last, tiny, data.vocab_size;
not the update cap) are refused (exit 2), unless --accept-difference names the setting. While no file holds a
finished run, the docs region is a placeholder saying so (tests/bench/test_reproduce_report.py checks that
docs/reproduction.md is current with bench/results).

Per system (bench/reproduce.py's order; a MAT system with its chosen rho only) the report gives parameters,
seeds, updates to stop and to the best validation BLEU, training minutes, test BLEU and chrF of the averaged
checkpoint (mean ± sd over seeds), the BLEU difference to the standard model of the same seed, the paired
bootstrap p-value per seed (from the results, else computed here from NAME_hyps.json beside the results file
against --ref) and the papers' claimed difference. It prints the Markdown table on stdout and writes:
  --docs FILE   the table, the files merged and the figure links between the lines
                `<!-- reproduce-report:start -->` and `<!-- reproduce-report:end -->` of FILE (the rest of FILE
                is kept); with --check nothing is written and the exit status is 1 when that region (or a
                figure it links) is not current
  --images DIR  the figures, PNG (default with --docs: images/reproduction beside FILE): valid_curves,
                pruning_curves, bleu_by_length, mute_diversity, kappa_alpha, mat_rho_grid, mat_branch_importance
                (each only when the results hold its data)
  --json PATH   the merged rows (`system_summary` of each system) and the files merged
Every file is written atomically. Exit status: 0, 1 (--check: stale), 2 (refused: unreadable or incomparable
files, or FILE without the markers; nothing written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]  # bench.* and this checkout's multibranch (no torch needed)

from bench.reproduce_figures import Figure, draw_curve, figure_data, write_png  # noqa: E402
from bench.reproduce_results import (  # noqa: E402
    FIT_SPAN,
    LENGTH_SYSTEMS,
    OFF_FRACTION,
    PRUNING_SYSTEMS,
    RECIPE_KEYS,
    RESULTS,
    Merged,
    ReportError,
    ResultsFile,
    analysis,
    branches_off,
    by_recipe,
    check_recipes,
    default_files,
    default_ref,
    end_fit,
    length_buckets,
    load_results,
    mean_sd,
    merge,
    note,
    recipe_of,
    run_key,
    summaries,
    table_runs,
)
from bench.reproduce_systems import RECIPES, WEIGHTED_REPLACEMENT_PAPER  # noqa: E402
from multibranch.atomic import atomic_write_text  # noqa: E402
from multibranch.json_file import write_json  # noqa: E402

START = "<!-- reproduce-report:start -->"
END = "<!-- reproduce-report:end -->"
PLAN_START = "<!-- reproduce-plan:start -->"
PLAN_END = "<!-- reproduce-plan:end -->"


def markers(recipe: str) -> tuple[str, str]:
    """The lines around a recipe's region of the docs (the IWSLT recipe's are the plain ones)."""
    return (START, END) if recipe == "iwslt" else (f"<!-- reproduce-report:{recipe}:start -->",
                                                     f"<!-- reproduce-report:{recipe}:end -->")


def has_line(text: str, line: str) -> bool:
    return line in (candidate.strip() for candidate in text.splitlines())


DOMINANT_ROLES = {"encoder_self": "encoder self", "decoder_self": "decoder self", "cross": "cross"}
COLUMNS = ("system", "parameters", "seeds", "updates to stop", "{minutes}", "test BLEU (mean ± sd)",
           "Δ to standard (mean ± sd)", "p (seeds pooled; per seed)", "paper's Δ")
DASH = "–"
DOC_WIDTH = 110  # docs/*.md wrap their prose here


NO_RESULTS = {
    "iwslt": """No GPU call has finished a run yet. `python bench/reproduce_report.py --docs docs/reproduction.md` writes
the table and the figures here from `bench/results/reproduce_*.json` (every GPU call's results merged).
""",
    "cpu": """No run of the CPU recipe has finished yet. `python bench/reproduce_report.py --docs docs/reproduction.md` writes
the table and the figures here from `bench/results/reproduce_cpu_*.json` (one file per finished run).
"""}


# ---- the Markdown ------------------------------------------------------------------------------------------


def fmt(stat: dict[str, Any] | None, digits: int = 2, sign: bool = False) -> str:
    """'mean ± sd' (just the mean for one value), '–' when empty."""
    if not stat or stat.get("mean") is None:
        return DASH
    spec = f"{'+' if sign else ''},.{digits}f"
    text = format(stat["mean"], spec)
    return text + (f" ± {stat['sd']:,.{digits}f}" if stat.get("sd") is not None else "")


def table_cells(summary: dict[str, Any]) -> list[str]:
    """The Markdown cells of one summary, in COLUMNS order."""
    name = summary["system"] + (f" (ρ={summary['rho']:g})" if summary.get("rho") is not None else "")
    params = f"{summary['parameters'] / 1e6:.2f}M" if summary.get("parameters") else DASH
    updates = fmt(summary["updates"], 0)
    if summary["updates_to_best_valid"]["mean"] is not None:
        updates += f" (best at {summary['updates_to_best_valid']['mean']:,.0f})"
    minutes = fmt(summary["train_minutes"], 1)
    if len(summary["train_minutes"].get("values") or []) > 1 and not summary.get("train_minutes_comparable", True):
        minutes = ", ".join(f"{m:,.1f}" for m in summary["train_minutes"]["values"])  # unlike minutes: not averaged
    threads = summary.get("threads") or []
    if minutes != DASH and summary["jobs"]:
        minutes += f" (jobs {'/'.join(str(j) for j in summary['jobs'])}" + (
            f", {'/'.join(str(t) for t in threads)} threads" if threads and threads != [1] else "") + ")"
    paper = summary.get("paper_delta_bleu")
    return [name, params, seeds_cell(summary), updates, minutes,
            fmt(summary["test_bleu"]), delta_cell(summary), p_cell(summary),
            DASH if paper is None else f"{paper:+g}"]


def delta_cell(summary: dict[str, Any]) -> str:
    """'mean ± sd' of the Δ to standard, with the seeds it covers where they are fewer than the row's (a seed whose
    standard model has not finished has no Δ yet): '-2.30 (seed 1)'."""
    delta = summary["delta_bleu_to_standard"]
    cell = fmt(delta, sign=True)
    paired = (delta or {}).get("seeds") or []
    if paired and len(paired) < len(summary["seeds"]):
        cell += f" (seed{'s' if len(paired) > 1 else ''} {', '.join(map(str, paired))})"
    return cell


def p_cell(summary: dict[str, Any]) -> str:
    """'0.012; 0.040, 0.100, 0.030' (over the seeds together; per seed), '0.040' for one seed, '–' for none."""
    per_seed = [DASH if p["p_value"] is None else f"{p['p_value']:.3f}" for p in summary["p_values"]]
    if all(p == DASH for p in per_seed):
        return DASH
    pooled = summary.get("pooled_p_value")
    return (f"{pooled['p_value']:.3f}; " if pooled else "") + ", ".join(per_seed)


def seeds_cell(summary: dict[str, Any]) -> str:
    """'1, 2, 3 (fp32)' when the seeds share a precision, '1 (fp32), 2 (bf16)' when they do not, '1, 2' when it
    was not recorded."""
    seeds, precisions = summary["seeds"], summary.get("precisions") or [None] * len(summary["seeds"])
    if not seeds:
        return DASH
    if len(set(precisions)) == 1:
        return ", ".join(map(str, seeds)) + (f" ({precisions[0]})" if precisions[0] else "")
    return ", ".join(f"{seed} ({precision or '?'})" for seed, precision in zip(seeds, precisions, strict=True))


def devices(files: list[ResultsFile]) -> str | None:
    """What every merged call trained on ("GPU" or "CPU"); None when they differ or one does not say."""
    found = {file.device for file in files}
    return found.pop() if len(found) == 1 else None


def minutes_label(device: str | None) -> str:
    """The minutes column's label: "GPU minutes", "CPU minutes", or "training minutes" for mixed or unknown."""
    return f"{device} minutes" if device else "training minutes"


def markdown_table(rows: list[dict[str, Any]], device: str | None = None) -> str:
    """The table of `rows`, its minutes labelled by the `device` the runs trained on (`devices`)."""
    header = [column.format(minutes=minutes_label(device)) for column in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(table_cells(summary)) + " |" for summary in rows]
    return "\n".join(lines) + "\n"


def cpu_label(model: str, flags: list[str] | tuple[str, ...] | None) -> str:
    """'AMD EPYC (avx2)': a CPU model with the flags that decide its speed here."""
    return f"{model} ({', '.join(flags or []) or 'flags unknown'})"


def files_line(files: list[ResultsFile]) -> str:
    """'Results merged (...): `FILE` (GPU, commit C, date); ...'."""
    parts = []
    for file in files:
        env = file.environment
        facts = [env.get("gpu") or (f"CPU {cpu_label(env['cpu'], env.get('cpu_flags'))}"
                                    if env.get("cpu") else f"device {env.get('device') or 'unknown'}")]
        if env.get("commit"):
            facts.append(f"commit {env['commit'][:10]}" + (" with local changes" if env.get("commit_dirty") else ""))
        if file.date():
            facts.append(file.date())
        parts.append(f"`{file.label}` ({', '.join(facts)})")
    return "Results merged (a run in two files is taken from the later one): " + "; ".join(parts) + "."


LEGEND = ("Test BLEU and chrF: sacreBLEU on test_2016_flickr, the average of the last checkpoints, mean ± sd over "
          "seeds. Δ: the system's test BLEU minus the standard model's of the same seed (the seeds in brackets "
          "where not every seed of the row has one yet). p: the paired bootstrap against those standard models, "
          "first over the seeds together (each resample of test scored on every seed and the scores averaged; from "
          "two seeds on), then sacreBLEU's, one per seed. Updates to stop: where early stopping or the cap ended "
          "training (best at: the update of the best validation BLEU). {minutes}: training minutes per run (each "
          "seed's, in seed order, where the row's runs trained on different machines or settings); with jobs N, N "
          "runs shared one {device} (at one thread each where no threads are given; the machines differ: see the "
          "results files above); a run resumed by calls of another setting gives each (jobs 1/2), with the threads "
          "its calls recorded, else those of the call that finished it. Paper's Δ: the paper's own gain on its own "
          "data and shape.")


def wrap(paragraph: str) -> str:
    """A Markdown paragraph in lines of at most DOC_WIDTH characters (words and `code` kept whole)."""
    return textwrap.fill(paragraph, DOC_WIDTH, break_long_words=False, break_on_hyphens=False)


def docs_region(files: list[ResultsFile], rows: list[dict[str, Any]], figures: list[tuple[str, str]],
                merged: Merged | None = None) -> str:
    """The text between the markers: the files merged, the table, its legend, the fit, branches-off, dominant-head
    and length tables, the runs trained on both kinds of device, and the figures (link, caption); NO_RESULTS while
    no file holds a finished run."""
    recipe = merged.recipe if merged is not None else "iwslt"
    if not rows:
        return NO_RESULTS.get(recipe, NO_RESULTS["iwslt"])
    device = devices(files)
    minutes = minutes_label(device)
    parts = ["", "<!-- written by bench/reproduce_report.py: rebuild it from the results, do not edit -->", "",
             wrap(files_line(files)), "", markdown_table(rows, device).rstrip("\n"), "",
             wrap(LEGEND.format(minutes=minutes[0].upper() + minutes[1:], device=device or "device")), ""]
    if merged is not None:
        verdicts = [line for row in rows if (line := verdict_line(row))]
        if verdicts:
            parts += [wrap("Each system against the standard model, in one sentence (reproduced: a gain on every "
                           "seed with p < 0.05, over the seeds together where two or more are paired, else on each; "
                           "the opposite: a loss on every seed, as significant; else not visible at this shape):"),
                      "", *verdicts, ""]
        runs = table_runs(merged)
        for table in (fit_table(runs), branches_off_table(runs), replacement_table(runs), dominant_table(runs),
                      length_table(runs)):
            if table:
                parts += [table, ""]
        both = device_agreement(merged)
        if both:
            parts += [both, ""]
        adopted = adopted_runs(runs)
        if adopted:
            parts += [wrap(adopted), ""]
    for link, caption in figures:
        parts += [f"![{caption}]({link})", ""]
    return "\n".join(parts)


def adopted_runs(runs: dict[str, list[dict[str, Any]]]) -> str | None:
    """A sentence naming the runs another script trained (the validation curve's, taken over by the harness), with
    their threads; None when every run is the harness's own."""
    found = [f"`{run_key(run)}` ({run['trained_by']}, {run.get('train_threads') or '?'} threads)"
             for system_runs in runs.values() for run in system_runs if run.get("trained_by")]
    return ("Trained by another script, with the table's settings, and scored here: " + "; ".join(found) + "."
            if found else None)


SIGNIFICANCE = 0.05
PLANNED_SEEDS = 3


def verdict(summary: dict[str, Any]) -> str | None:
    """"reproduced", "the opposite" or "not visible at this shape" for a system's runs against the standard
    model of their seeds: for the first two, a Δ of one sign on every seed and a paired bootstrap p <
    SIGNIFICANCE: the one over the seeds together where there is one, else every seed's. None for the standard
    model and for a system without a seed paired with one."""
    delta = summary.get("delta_bleu_to_standard") or {}
    if summary["system"] == "standard" or delta.get("mean") is None:
        return None
    pooled = summary.get("pooled_p_value")
    ps = [pooled["p_value"]] if pooled else [p["p_value"] for p in summary["p_values"]]
    significant = bool(ps) and all(p is not None and p < SIGNIFICANCE for p in ps)
    values = delta.get("values") or []
    if significant and all(v > 0 for v in values):
        return "reproduced"
    if significant and all(v < 0 for v in values):
        return "the opposite"
    return "not visible at this shape"


def verdict_line(summary: dict[str, Any]) -> str | None:
    """One Markdown list item: the system, the paper's claim, our Δ with its spread and p-values, the verdict."""
    found = verdict(summary)
    if found is None:
        return None
    seeds = len(summary["delta_bleu_to_standard"].get("seeds") or [])
    ps = ", ".join(DASH if p["p_value"] is None else f"{p['p_value']:.3f}" for p in summary["p_values"])
    pooled = summary.get("pooled_p_value")
    p_text = f"p {pooled['p_value']:.3f} over the seeds, {ps} per seed" if pooled else f"p {ps}"
    claim = (summary.get("paper_claim") or {}).get("claim") or "no paper claims an effect"
    partial = f" so far ({seeds} of {PLANNED_SEEDS} seeds)" if seeds < PLANNED_SEEDS else ""
    line = (f"- `{summary['system']}`: Δ {fmt(summary['delta_bleu_to_standard'], sign=True)} BLEU ({p_text}): "
            f"**{found}**{partial}. The paper: {claim}.")
    other = summary.get("second_baseline")
    if other:
        p_other = other["p_value"]
        other_p_text = DASH if p_other is None else f"{p_other['p_value']:.3f}"
        together = ", seeds together" if p_other and len(p_other["seeds"]) > 1 else ""
        line += (f" Against `{other['system']}`, {other['why']}: Δ "
                 f"{fmt(other['delta_bleu'], sign=True)} BLEU (p {other_p_text}{together}; seeds "
                 f"{', '.join(map(str, other['delta_bleu']['seeds']))}).")
    return line


def fit_table(runs: dict[str, list[dict[str, Any]]]) -> str | None:
    """How well each system fits at the end of training (`end_fit`): training and validation NLL, mean ± sd over
    seeds, and each one's Δ to the standard model of the same seeds; it tells a model that fits the training data
    less well from one that fits it and generalises less."""
    standard = {run["seed"]: fit for run in runs.get("standard", []) if (fit := end_fit(run))}
    lines = []
    for system, system_runs in runs.items():
        fits = {run["seed"]: fit for run in system_runs if (fit := end_fit(run))}
        if not fits:
            continue
        cells = [fmt(mean_sd([f[key] for f in fits.values()]), 3) for key in ("train_nll", "valid_nll")]
        for key in ("train_nll", "valid_nll"):
            deltas = [fit[key] - standard[seed][key] for seed, fit in fits.items() if seed in standard]
            cells.append(DASH if system == "standard" else fmt(mean_sd(deltas), 3, sign=True))
        lines.append(f"| {system} | {len(fits)} | " + " | ".join(cells) + " |")
    if not lines:
        return None
    header = (f"The fit at the end of training: training NLL, the mean over the last {FIT_SPAN} updates, on training "
              "batches with dropout and the system's own regularisers on (DropHead and drop-branch raise it); "
              "validation NLL at the last validation, of the model itself, not the average of checkpoints; mean ± sd "
              "over seeds, and the Δ to the standard model of the same seeds. A training NLL above the standard "
              "model's with no regulariser to raise it: the model fits the training data less well; below it, with "
              "the validation NLL above: the model overfits more:")
    return "\n".join([wrap(header), "", "| system | seeds | training NLL | validation NLL | Δ training NLL | "
                      "Δ validation NLL |", "|" + "---|" * 6, *lines])


def branches_off_table(runs: dict[str, list[dict[str, Any]]]) -> str | None:
    """The Weighted Transformer's branches nearly switched off at the end of training (`branches_off`), per side:
    mean ± sd over seeds of the count, out of the side's branches, and each seed's count."""
    lines = []
    for system, system_runs in runs.items():
        per_seed = [found for run in system_runs if (found := branches_off(run))]
        if not per_seed:
            continue
        cells = []
        for side in ("encoder", "decoder"):
            counts = [found[side] for found in per_seed if side in found]
            off = [count for count, _ in counts]
            cells.append(f"{fmt(mean_sd(off), 1)} of {counts[0][1]} ({', '.join(map(str, off))})" if counts else DASH)
        lines.append(f"| {system} | {len(per_seed)} | " + " | ".join(cells) + " |")
    if not lines:
        return None
    share = f"{OFF_FRACTION:g}"
    header = (f"Weighted Transformer branches nearly switched off at the end of training: κ_i or α_i below {share} of "
              "an equal share 1/M, so that the branch's head reaches the layer's output at less than that fraction "
              "of an equal share (it is scaled by κ_i α_i); with α_i that small, the branch's FFN and κ_i get as "
              "little gradient. Counted over the layers of each side; mean ± sd over seeds, each seed's count in "
              "brackets:")
    return "\n".join([wrap(header), "", "| system | seeds | encoder | decoder |", "|---|---|---|---|", *lines])


def replacement_table(runs: dict[str, list[dict[str, Any]]]) -> str | None:
    """The Weighted Transformer's Table 3: test BLEU with the learned kappa/alpha and with them replaced at test
    time by 1/M each and by random points of the simplex (the mean of a run's draws), mean ± sd over seeds, each
    replacement's Δ to the learned weights of the same seed in brackets; the paper's numbers last."""
    lines = []
    for system, system_runs in runs.items():
        per_seed = [found for run in system_runs if (found := analysis(run, "replacement"))]
        if not per_seed:
            continue
        cells = [fmt(mean_sd([r["learned"]["bleu"] for r in per_seed]))]
        for key in ("uniform", "random_mean"):
            pairs = [(r[key]["bleu"], r["learned"]["bleu"]) for r in per_seed if r.get(key)]
            deltas = [replaced - learned for replaced, learned in pairs]
            cells.append(f"{fmt(mean_sd([replaced for replaced, _ in pairs]))} ({fmt(mean_sd(deltas), sign=True)})"
                         if pairs else DASH)
        lines.append(f"| {system} | {len(per_seed)} | " + " | ".join(cells) + " |")
    if not lines:
        return None
    paper = WEIGHTED_REPLACEMENT_PAPER
    lines.append(f"| the paper (newstest2013) | – | {paper['learned']:.1f} | {paper['uniform']:.1f} "
                 f"({paper['uniform'] - paper['learned']:+.1f}) | {paper['random']:.1f} "
                 f"({paper['random'] - paper['learned']:+.1f}) |")
    per_module = module_replacement_lines(runs)
    if per_module:
        lines += ["", wrap("1/M in one module at a time, the other modules' weights learned: the Δ test BLEU to the "
                           "learned weights of the same seed, mean ± sd over seeds:"), "", *per_module]
    header = ("Weighted Transformer weights replaced at test time (its Table 3): test BLEU with the learned κ/α, "
              "with 1/M each, and with random points of the simplex (the mean of a run's draws), mean ± sd over seeds; "
              "in brackets the Δ to the learned weights of the same seed. The paper: the learned weights cannot be "
              "replaced by either:")
    return "\n".join([wrap(header), "", "| system | seeds | learned | uniform | random |", "|---|---|---|---|---|",
                      *lines])


def module_replacement_lines(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The table of 1/M in one module at a time: a row per system, a column per module (in model order)."""
    rows: dict[str, dict[str, list[float]]] = {}
    for system, system_runs in runs.items():
        for run in system_runs:
            found = analysis(run, "replacement") or {}
            for module in found.get("uniform_per_module") or []:
                deltas = rows.setdefault(system, {}).setdefault(module["name"], [])
                deltas.append(module["bleu"] - found["learned"]["bleu"])
    if not rows:
        return []
    names = list(dict.fromkeys(name for modules in rows.values() for name in modules))
    lines = ["| system | " + " | ".join(module_label(name) for name in names) + " |", "|" + "---|" * (1 + len(names))]
    for system, modules in rows.items():
        lines.append(f"| {system} | " + " | ".join(fmt(mean_sd(modules.get(name, [])), sign=True) for name in names)
                     + " |")
    return lines


def module_label(name: str) -> str:
    """'decoder.layers.1.branched.weights' -> 'decoder 1' (the module's own name after it where not `branched`)."""
    parts = name.removesuffix(".weights").split(".")
    if len(parts) < 3 or parts[1] != "layers":
        return name
    rest = ".".join(parts[3:])
    return f"{parts[0]} {parts[2]}" + (f" {rest}" if rest and rest != "branched" else "")


def dominant_table(runs: dict[str, list[dict[str, Any]]]) -> str | None:
    """Scheduled DropHead's Table 4: the test BLEU change when each attention's dominant head (the one whose
    masking alone lowers BLEU most) is masked, averaged over the layers of each role, mean ± sd over seeds (from
    the pruning analysis)."""
    lines = []
    for system in PRUNING_SYSTEMS:
        per_seed = [(((analysis(run, "pruning") or {}).get("dominant_heads") or {}).get("mean_dominant_delta") or {})
                    for run in runs.get(system, [])]
        per_seed = [d for d in per_seed if d]
        if per_seed:
            cells = [fmt(mean_sd([d[role] for d in per_seed if d.get(role) is not None]), sign=True)
                     for role in DOMINANT_ROLES]
            lines.append(f"| {system} | {len(per_seed)} | " + " | ".join(cells) + " |")
    if not lines:
        return None
    header = ("BLEU change when the dominant head of one attention is masked (Scheduled DropHead, Table 4; "
              "mean over the layers of each kind, mean ± sd over seeds):")
    return "\n".join([wrap(header), "", "| system | seeds | " + " | ".join(DOMINANT_ROLES.values()) + " |",
                      "|" + "---|" * (2 + len(DOMINANT_ROLES)), *lines])


def length_table(runs: dict[str, list[dict[str, Any]]]) -> str | None:
    """MUSE's Fig. 3 as numbers: test BLEU per source-length bucket of each LENGTH_SYSTEMS system (mean ± sd over
    seeds), and in brackets its Δ to the standard model of the same seeds (from the lengths analysis)."""
    standard = length_buckets(runs, "standard")
    systems = [(system, per_seed) for system in LENGTH_SYSTEMS if (per_seed := length_buckets(runs, system))]
    if not systems:
        return None
    first = next(iter(systems[0][1].values()))
    labels = list(first)
    lines = []
    for system, per_seed in systems:
        cells = []
        for label in labels:
            scores = [b[label]["bleu"] for b in per_seed.values() if b.get(label, {}).get("bleu") is not None]
            cell = fmt(mean_sd(scores))
            deltas = [b[label]["bleu"] - standard[seed][label]["bleu"] for seed, b in per_seed.items()
                      if system != "standard" and seed in standard and b.get(label, {}).get("bleu") is not None
                      and standard[seed].get(label, {}).get("bleu") is not None]
            if deltas:
                cell += f" ({fmt(mean_sd(deltas), sign=True)})"
            cells.append(cell)
        lines.append(f"| {system} | {len(per_seed)} | " + " | ".join(cells) + " |")
    header = ("Test BLEU by source length in subword tokens (MUSE, Fig. 3; each bucket's test sentences beside its "
              "label; mean ± sd over seeds, and in brackets the Δ to the standard model of the same seeds):")
    columns = [f"{label} ({first[label].get('sentences', '?')})" for label in labels]
    return "\n".join([wrap(header), "", "| system | seeds | " + " | ".join(columns) + " |",
                      "|" + "---|" * (2 + len(labels)), *lines])


def device_agreement(merged: Merged) -> str | None:
    """The runs trained on both a CPU and a GPU: both test BLEU scores, and whether they agree within the
    spread of the system's seeds (2 sd of the table's runs; a difference beyond it is a defect to find)."""
    if not merged.other_device:
        return None
    runs = table_runs(merged)
    lines = []
    for key, other in sorted(merged.other_device.items()):
        mine = merged.runs[key]
        spread = mean_sd([r["test"]["avg"]["bleu"] for r in runs.get(mine["system"], [])])["sd"]
        diff = other["test"]["avg"]["bleu"] - mine["test"]["avg"]["bleu"]
        verdict = DASH if spread is None else ("within" if abs(diff) <= 2 * spread else "OUTSIDE")
        lines.append(f"| {key} | {mine['test']['avg']['bleu']:.2f} ({mine.get('device') or '?'}) | "
                     f"{other['test']['avg']['bleu']:.2f} ({other.get('device') or '?'}) | {diff:+.2f} | {verdict} |")
    return "\n".join(["Runs trained on both kinds of device (test BLEU; agreement: the difference within 2 sd of "
                      "the system's seeds):", "", "| run | table | other device | difference | agreement |",
                      "|---|---|---|---|---|", *lines])


def replace_region(text: str, body: str, path: Path, marks: tuple[str, str] = (START, END)) -> str:
    """`text` with the lines between its start and end marker lines (`marks`) replaced by `body`."""
    start, end = marks
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip() == start]
    ends = [i for i, line in enumerate(lines) if line.strip() == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ReportError(f"{path}: needs one line {start} and, after it, one line {end}")
    return "".join(lines[:starts[0] + 1]) + body + "".join(lines[ends[0]:])


# ---- the command -------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", type=Path, metavar="FILES",
                   help="results files, merged in this order (default: bench/results/reproduce_*.json, see above)")
    p.add_argument("--docs", type=Path, default=None, help="rewrite the marked region of this Markdown file")
    p.add_argument("--images", type=Path, default=None,
                   help="folder of the figures (default with --docs: images/reproduction beside it)")
    p.add_argument("--ref", type=Path, default=None, help="test references for p-values from *_hyps.json "
                   "(default: $MULTIBRANCH_MULTI30K/test_2016_flickr.de, or under $MULTIBRANCH_SHARED_DATA/multi30k "
                   "or ../shared/data/multi30k)")
    p.add_argument("--json", type=Path, default=None, help="also write the merged rows as JSON")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if --docs is not current")
    p.add_argument("--accept-difference", action="append", default=[], choices=RECIPE_KEYS, metavar="KEY",
                   help=f"merge files that differ in this setting (one of {', '.join(RECIPE_KEYS)})")
    args = p.parse_args(argv)
    if args.check and args.docs is None:
        p.error("--check needs --docs")
    if args.images is None and args.docs is not None:
        args.images = args.docs.parent / "images" / "reproduction"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        files = [load_results(path) for path in args.files] if args.files else default_files()
        groups = by_recipe(files)
        for group in groups.values():
            check_recipes(group, tuple(args.accept_difference))
        doc_text = None
        recipes = list(groups) or ["iwslt"]
        if args.docs is not None:
            try:
                doc_text = args.docs.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise ReportError(f"{args.docs}: cannot be read ({error})") from None
            # every recipe whose region the page has is rewritten (a placeholder while it has no finished run);
            # the markers of a recipe with results must be there before anything is computed
            recipes = [r for r in RECIPES if r in groups or has_line(doc_text, markers(r)[0])]
            for recipe in recipes:
                replace_region(doc_text, "", args.docs, markers(recipe))
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    new_text, all_rows, figures = doc_text, {}, []
    for recipe in recipes:
        group = groups.get(recipe, [])
        merged = merge(group)
        merged.recipe = recipe
        rows = summaries(merged, args.ref or default_ref())
        all_rows[recipe] = rows
        if rows:
            heading = f"{recipe} recipe:\n" if len(recipes) > 1 else ""  # stdout is the table alone otherwise
            print(f"{heading}{markdown_table(rows, devices(group))}", end="")
        else:
            note(f"no finished run of the {recipe} recipe to report yet")
        mine = figure_data(merged) if args.images is not None else []
        figures += mine
        if new_text is not None:
            links = [(Path(os.path.relpath(args.images / f.name, args.docs.parent)).as_posix(), f.caption)
                     for f, _ in mine]
            new_text = replace_region(new_text, docs_region(group, rows, links, merged), args.docs, markers(recipe))
    if new_text is not None and has_line(new_text, PLAN_START):
        curve = curve_figure() if args.images is not None else None
        link = None
        if curve is not None:
            figures.append(curve)
            link = Path(os.path.relpath(args.images / curve[0].name, args.docs.parent)).as_posix()
        new_text = replace_region(new_text, plan_region(link), args.docs, (PLAN_START, PLAN_END))
    if doc_text is not None and args.check:
        stale = [f"{args.docs}: a generated region is not current"] if new_text != doc_text else []
        stale += [f"{args.images / f.name}: missing" for f, _ in figures if not (args.images / f.name).is_file()]
        for line in stale:
            print(f"stale: {line}", file=sys.stderr)
        if not stale:
            print(f"{args.docs}: current", file=sys.stderr)
        return 1 if stale else 0
    if figures:
        args.images.mkdir(parents=True, exist_ok=True)
        for figure, data in figures:
            write_png(args.images / figure.name, figure.draw(data))
            print(f"wrote {args.images / figure.name}", file=sys.stderr)
    if doc_text is not None and new_text != doc_text:
        atomic_write_text(args.docs, new_text)
        print(f"wrote {args.docs}", file=sys.stderr)
    if args.json is not None:
        write_json(args.json, {"files": [{"file": f.label, "recipe": recipe_of(f),
                                          **{k: f.environment.get(k) for k in ("gpu", "commit")}, "date": f.date()}
                                         for f in files],
                               "rows": [row for rows in all_rows.values() for row in rows],
                               "rows_by_recipe": all_rows})
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def plan_region(curve_link: str | None = None) -> str:
    """The CPU recipe's plan as it stands in bench/results: runs done and left, and the core-hours the ones left
    need at each precision measured (bench/reproduce_cost.py; the same on every machine); with `curve_link`, the
    figure of the standard model's validation curve there."""
    from bench.reproduce_cost import cost_file
    from bench.reproduce_runner import plan_status

    precisions = [p for p in ("fp32", "bf16") if cost_file(p).is_file()] or ["fp32"]
    plans = {p: plan_status(RESULTS, None, precision=p) for p in precisions}
    first = plans[precisions[0]]
    done = [r["run"] for r in first["runs"] if r["state"] == "done"]
    hours = "; ".join(f"about {plan['core_hours_left']:.0f} core-hours at {p}"
                      + (f" (not estimated: {len(plan['not_estimated'])} runs)" if plan["not_estimated"] else "")
                      for p, plan in plans.items())
    if first["updates"] is None:
        text = (f"CPU recipe: its number of updates is not chosen yet (`bench/reproduce_curve.py`, the standard "
                f"model's validation curve{curve_progress()}); then {len(first['runs'])} runs, of which the curve's "
                f"own is the standard model of seed 1.")
    else:
        main_rows = [r for r in first["runs"] if r["run"].split("/")[0] in RECIPES["cpu"].main]
        main_left = [r for r in main_rows if r["state"] != "done"]
        main_hours = sum(r["minutes_left"] or 0 for r in main_left) / 60
        unknown = sum(r["minutes_left"] is None for r in main_left)
        text = (f"CPU recipe ({first['updates']:,} updates a run, seeds 1-3): {first['done']} of "
                f"{len(first['runs'])} runs done, {first['left']} left; {hours}, two runs side by side. The main "
                f"rows ({', '.join(f'`{s}`' for s in RECIPES['cpu'].main)}; trained first): "
                f"{len(main_rows) - len(main_left)} of {len(main_rows)} runs done, about {main_hours:.0f} core-hours "
                f"left at {precisions[0]}" + (f" (not estimated: {unknown} runs)" if unknown else "") + ". Done: "
                + (", ".join(f"`{r}`" for r in done) if done else "none yet") + "."
                + per_cpu_hours(precisions[0], first["updates"]))
    costs = cost_table()
    priority = priority_paragraph()
    figure = f"\n![{CURVE_CAPTION}]({curve_link})\n" if curve_link else ""
    return ("\n" + wrap(text) + "\n" + figure + (f"\n{costs}" if costs else "")
            + (f"\n{priority}" if priority else "") + "\n")


def per_cpu_hours(precision: str, updates: int, results: Path = RESULTS) -> str:
    """' On each CPU with finished runs, ...: about X core-hours on A, Y on B.' where runs finished on more than
    one CPU (the plan above takes the slowest one's pace), else ''."""
    from bench.reproduce_cost import finished_runs
    from bench.reproduce_runner import plan_status

    cpus = sorted({run["cpu"] for run in finished_runs(precision, updates, results) if run["cpu"][0]})
    if len(cpus) < 2:
        return ""
    hours = [f"about {plan_status(results, None, precision=precision, cpu=cpu)['core_hours_left']:.0f} on "
             f"{cpu_label(*cpu)}" for cpu in cpus]
    return (" At the pace of each CPU's own finished runs, the runs left need " + ", ".join(hours)
            + f" (core-hours at {precision}).")


PRIORITY_FILE = RESULTS / "runner_priority.json"


def priority_paragraph() -> str:
    """What the runner costs the foreground (bench/results/runner_priority.json), or '' when not measured."""
    try:
        data = json.loads(PRIORITY_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    env = data["environment"]
    paused, going = data["paused"], data["going"]
    return wrap(f"What the runner costs the machine's other work: `{data['workload']}` took "
                f"{paused['median_wall_s']:.1f} s with the runner paused and {going['median_wall_s']:.1f} s with it "
                f"going ({data['going_over_paused']:.2f}×, the median of {len(going['repeats'])} rounds each), the "
                f"runner taking {going['runner_share_of_cpu']:.0%} of the CPU meanwhile (`python "
                f"bench/runner_priority.py`, {env['cpu_model']}, {data['cores']} cores, {env['date']}).") + "\n"


CURVE_CAPTION = "the standard model's validation BLEU, every 250 updates, from which the number of updates is chosen"


def curve_figure() -> tuple[Figure, Any] | None:
    """The figure of bench/results/reproduce_cpu_curve.json (None before its first validation)."""
    from bench.reproduce_systems import CURVE_FILE

    try:
        data = json.loads(CURVE_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not data.get("curve"):
        return None
    return Figure("cpu_validation_curve.png", CURVE_CAPTION, lambda m, r: data, draw_curve), data


def curve_progress() -> str:
    """', measured to update N so far' from bench/results/reproduce_cpu_curve.json, or ''."""
    from bench.reproduce_systems import CURVE_FILE

    try:
        curve = json.loads(CURVE_FILE.read_text(encoding="utf-8")).get("curve") or []
    except (OSError, ValueError):
        return ""
    return f", measured to update {curve[-1]['step']:,} so far (best validation BLEU {max(p['bleu'] for p in curve):.2f})" \
        if curve else ""


def cost_table() -> str:
    """Minutes per 1,000 updates of each CPU-recipe system at one thread, per precision measured
    (bench/results/reproduce_cpu_cost_<precision>.json), or '' when none was."""
    from bench.reproduce_cost import cost_file

    measured = {}
    for precision in ("fp32", "bf16"):
        if cost_file(precision).is_file():
            data = json.loads(cost_file(precision).read_text(encoding="utf-8"))
            measured[precision] = ({row["system"]: row for row in data["rows"]}, data["environment"])
    if not measured:
        return ""
    systems = list(dict.fromkeys(s for rows, _ in measured.values() for s in rows))
    lines = ["| system | parameters | " + " | ".join(f"min / 1,000 updates ({p})" for p in measured) + " |",
             "|---|---|" + "---|" * len(measured)]
    for system in systems:
        row = next(rows[system] for rows, _ in measured.values() if system in rows)
        cells = [f"{rows[system]['minutes_per_1000_updates']:.0f} ({rows[system]['relative_to_standard']:.2f}×)"
                 if system in rows and rows[system].get("relative_to_standard") else DASH
                 for rows, _ in measured.values()]
        lines.append(f"| {system} | {row['parameters'] / 1e6:.2f}M | " + " | ".join(cells) + " |")
    sources = "; ".join(f"{p}: {env['cpu']} ({', '.join(env['cpu_flags']) or 'no flags read'}), {env['date']}, "
                        f"`{env['command']}`" for p, (_, env) in measured.items())
    return ("What a run costs here: CPU minutes per 1,000 updates at one thread (in brackets: relative to the "
            "standard model), validation and evaluation not included.\n\n" + "\n".join(lines) + "\n\n"
            + wrap(f"Measured with `bench/reproduce_cost.py` ({sources}).") + "\n")


if __name__ == "__main__":
    sys.exit(main())
