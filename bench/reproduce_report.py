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
import io
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]  # bench.* and this checkout's multibranch (no torch needed)

from bench.common import multi30k_dir  # noqa: E402
from bench.reproduce_cost import run_threads  # noqa: E402
from bench.reproduce_systems import (  # noqa: E402
    MAT_SYSTEMS,
    PAPER_CLAIMS,
    RECIPES,
    SECOND_BASELINES,
    SYSTEMS,
    attention_branches,
    grid_of,
)
from multibranch.atomic import atomic_write_bytes, atomic_write_text  # noqa: E402
from multibranch.evaluate.metrics import paired_bootstrap_replicates, paired_bootstrap_statistics  # noqa: E402
from multibranch.json_file import read_json_object, write_json  # noqa: E402

RESULTS = ROOT / "bench" / "results"
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


def figure_prefix(recipe: str) -> str:
    return "" if recipe == "iwslt" else f"{recipe}_"

# what must be equal for runs of two calls to share a table; the update cap may differ (a call sets it near the
# updates the standard model needed, so that DropHead's V schedule and Weighted's kappa/alpha freeze fit the run)
RECIPE_KEYS = ("patience", "valid_every", "average_last", "tiny", "data.vocab_size")
BOOTSTRAP_SAMPLES = 1000
PRUNING_SYSTEMS = ("standard", "drophead", "drophead-constant", "mat", "mat3-narrow-drophead", "mat-drophead")
LENGTH_SYSTEMS = ("standard", "muse", "muse-simple")
DOMINANT_ROLES = {"encoder_self": "encoder self", "decoder_self": "decoder self", "cross": "cross"}
MUTE_SYSTEMS = ("mute", "mute-bias", "mute-bias-seq")
DIVERSITY_TITLES = {"att_pos": "Att Pos.", "att_sub": "Att Sub.", "ffn_sub": "FFN Sub."}
ROLES = ("encoder_self", "decoder_self", "cross")
KAPPA_ALPHA_LAYER = 1  # the paper's "second encoder layer"
KAPPA_ALPHA_WINDOW = 5  # moving-average window, in logged records
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


class ReportError(Exception):
    """A refusal: one line for stderr, exit status 2, nothing written."""


def note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


# ---- results files -----------------------------------------------------------------------------------------


@dataclass
class ResultsFile:
    path: Path
    data: dict[str, Any]

    @property
    def label(self) -> str:
        """The path relative to the checkout when inside it, else the file name."""
        try:
            return self.path.resolve().relative_to(ROOT).as_posix()
        except ValueError:
            return self.path.name

    @property
    def settings(self) -> dict[str, Any]:
        return self.data.get("settings") or {}

    @property
    def environment(self) -> dict[str, Any]:
        return self.data.get("environment") or {}

    @property
    def hyps_path(self) -> Path:
        return self.path.with_name(f"{self.path.stem}_hyps.json")

    def done_runs(self) -> int:
        return sum(1 for r in self.data.get("runs") or [] if is_done(r))

    @property
    def device(self) -> str | None:
        """"GPU" or "CPU": what the call trained on (its environment's GPU name or --device); None when unrecorded."""
        env = self.environment
        if env.get("gpu") or str(env.get("device") or "").startswith("cuda"):
            return "GPU"
        return "CPU" if env.get("device") == "cpu" or "gpu" in env else None

    def threads(self) -> int | None:
        """The threads each of the call's runs trained with (its environment's), None when unrecorded."""
        return run_threads(self.environment)

    def date(self) -> str | None:
        """The call's date: environment.date when recorded, else the latest segment start of its runs."""
        if self.environment.get("date"):
            return str(self.environment["date"])[:10]
        starts = [s.get("started") for r in self.data.get("runs") or [] for s in r.get("segments") or []]
        starts = [s for s in starts if isinstance(s, str)]
        return max(starts)[:10] if starts else None


def load_results(path: Path) -> ResultsFile:
    """A results file of bench/reproduce.py; ReportError (one line) when unreadable or of another kind."""
    data = read_json_object(path, ReportError)
    if not isinstance(data.get("runs"), list) or not isinstance(data.get("settings"), dict):
        raise ReportError(f"{path}: not a bench/reproduce.py results file (no settings and runs)")
    return ResultsFile(path, data)


def name_order(path: Path) -> list[Any]:
    """Sort key: the file name with its numbers compared as numbers (reproduce_h100_2 before _10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def default_files(folder: Path = RESULTS) -> list[ResultsFile]:
    """Every FOLDER/reproduce_*.json but *_hyps.json, the CPU recipe's curve and cost files, --tiny results and
    results without a finished run."""
    files = []
    for path in sorted(folder.glob("reproduce_*.json"), key=name_order):
        if path.name.endswith("_hyps.json") or path.name.startswith(("reproduce_cpu_curve", "reproduce_cpu_cost")):
            continue  # translations, the CPU recipe's update count and its costs: not run records
        loaded = load_results(path)
        if loaded.settings.get("tiny"):
            continue
        if not loaded.done_runs():
            note(f"{loaded.label} has no finished run; left out")
            continue
        files.append(loaded)
    return files


def recipe_of(file: ResultsFile) -> str:
    """The recipe the file's runs trained to (results files without one are the IWSLT recipe's)."""
    return str(file.settings.get("recipe") or "iwslt")


def by_recipe(files: list[ResultsFile]) -> dict[str, list[ResultsFile]]:
    """The files of each recipe, in their order: each recipe has a table of its own."""
    groups: dict[str, list[ResultsFile]] = {}
    for file in files:
        groups.setdefault(recipe_of(file), []).append(file)
    return groups


def recipe_value(file: ResultsFile, key: str) -> Any:
    value: Any = file.settings
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def check_recipes(files: list[ResultsFile], accept: tuple[str, ...] = ()) -> None:
    """ReportError naming the first setting that differs between the files (runs trained to different recipes
    are not comparable), unless `accept` lists it."""
    for key in RECIPE_KEYS:
        if key in accept:
            continue
        values = {file.label: recipe_value(file, key) for file in files}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            shown = ", ".join(f"{label}: {json.dumps(v)}" for label, v in values.items())
            raise ReportError(f"the results files differ in {key} ({shown}): their runs are not comparable "
                              f"(--accept-difference {key} merges them anyway)")


# ---- merging -----------------------------------------------------------------------------------------------


def is_done(record: dict[str, Any]) -> bool:
    return record.get("status") == "done" and isinstance(((record.get("test") or {}).get("avg") or {}).get("bleu"),
                                                         (int, float))


def run_name(record: dict[str, Any]) -> str:
    """The run's folder name (`mat3-narrow-rho0.2` for a MAT run)."""
    return Path(record["dir"]).parent.name


def run_key(record: dict[str, Any]) -> str:
    return f"{run_name(record)}/seed{record['seed']}"


@dataclass
class Merged:
    files: list[ResultsFile]
    recipe: str = "iwslt"
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # run key -> record (+ results_file, jobs)
    # run key -> a finished record of the same run trained on the other kind of device (CPU or GPU): the table
    # counts the first device's, the report sets the two side by side
    other_device: dict[str, dict[str, Any]] = field(default_factory=dict)
    sources: dict[str, ResultsFile] = field(default_factory=dict)  # run key -> the file its record came from
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # system -> row fields, later non-empty wins
    seeds: set[int] = field(default_factory=set)  # every file's settings.seeds


def merge(files: list[ResultsFile]) -> Merged:
    """The run records of `files` by run key (a later file's record replaces an earlier one, but an unfinished
    record never replaces a finished one; a note each; a finished record from the other kind of device is kept
    apart, in `other_device`), and their rows field by field."""
    merged = Merged(files, recipe=recipe_of(files[0]) if files else "iwslt")
    for file in files:
        merged.seeds.update(file.settings.get("seeds") or [])
        for record in file.data["runs"]:
            key = run_key(record)
            old = merged.runs.get(key)
            if old is not None and is_done(old) and is_done(record) and old.get("device") != file.device:
                merged.other_device[key] = {**record, "results_file": file.label, "device": file.device}
                continue
            if old is not None:
                if is_done(old) and not is_done(record):
                    note(f"{key} is in {old['results_file']} (done) and {file.label} ({record.get('status')}): "
                         f"the finished record of {old['results_file']} is kept")
                    continue
                note(f"{key} is in {old['results_file']} and {file.label}: the record of {file.label} is used")
            merged.runs[key] = {**record, "results_file": file.label, **run_sharing(record, file),
                                "device": file.device}
            merged.sources[key] = file
        for row in file.data.get("rows") or []:
            target = merged.rows.setdefault(row["system"], {})
            target.update({k: v for k, v in row.items() if v is not None and v != {} and v != []})
    return merged


def run_sharing(record: dict[str, Any], file: ResultsFile) -> dict[str, list[int]]:
    """The runs side by side ("jobs") and threads each training call of a run had: from its segments where they
    say (a run resumed by calls of another runner setting trained at more than one), else the results file's
    settings; the validation curve's run, taken over, trained alone at its own threads."""
    if record.get("trained_by"):
        threads = record.get("train_threads")
        return {"jobs": [1], "threads": [int(threads)] if threads else []}
    segments = [s for s in record.get("segments") or [] if isinstance(s, dict)]
    jobs = {s["jobs"] for s in segments if isinstance(s.get("jobs"), int)} or {file.settings.get("jobs")}
    threads = {s["threads"] for s in segments if isinstance(s.get("threads"), int)}
    if not threads or any(s.get("threads") is None for s in segments):  # calls that did not record theirs
        threads.add(file.threads())
    return {"jobs": sorted(j for j in jobs if j is not None), "threads": sorted(t for t in threads if t is not None)}


def systems_present(merged: Merged) -> list[str]:
    """The recipe's systems in its table order, then any other system the records name, in order of appearance."""
    order = RECIPES[merged.recipe].systems if merged.recipe in RECIPES else SYSTEMS
    found = dict.fromkeys(r["system"] for r in merged.runs.values())
    return [s for s in order if s in found] + [s for s in found if s not in order]


def same_rho(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and f"{a:g}" == f"{b:g}"


def chosen_rho(system: str, merged: Merged) -> float | None:
    """The rho of a MAT system's table runs: its row's; else that of a combination extending it; else the one
    rho of its finished runs outside the grid; else the grid's best validation BLEU (ties: the smaller)."""
    if merged.rows.get(system, {}).get("rho") is not None:
        return float(merged.rows[system]["rho"])
    for other, row in merged.rows.items():
        if other != system and grid_of(other) == system and row.get("rho") is not None:
            return float(row["rho"])
    runs = [r for r in merged.runs.values() if r["system"] == system and r.get("rho") is not None]
    outside = {f"{r['rho']:g}" for r in runs if not r.get("grid") and is_done(r)}
    if len(outside) == 1:
        return float(outside.pop())
    grid = [r for r in runs if r.get("grid") and r.get("best_valid_bleu") is not None]
    if grid:
        return float(max(grid, key=lambda r: (r["best_valid_bleu"], -r["rho"]))["rho"])
    return None


def table_runs(merged: Merged) -> dict[str, list[dict[str, Any]]]:
    """The finished runs each system's row counts, by seed (MAT: the chosen rho only; a grid run only at a seed
    some call asked for)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for system in systems_present(merged):
        runs = [r for r in merged.runs.values() if r["system"] == system and is_done(r)]
        if system in MAT_SYSTEMS:
            rho = chosen_rho(system, merged)
            runs = [r for r in runs if same_rho(r.get("rho"), rho) and (not r.get("grid") or r["seed"] in merged.seeds)]
        if runs:
            out[system] = sorted(runs, key=lambda r: r["seed"])
    return out


# ---- statistics --------------------------------------------------------------------------------------------


def mean_sd(values: list[float]) -> dict[str, Any]:
    """{"n", "mean", "sd", "values"}: statistics.fmean and stdev (sd None for fewer than two values)."""
    if not values:
        return {"n": 0, "mean": None, "sd": None, "values": []}
    return {"n": len(values), "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None, "values": values}


def recorded_p_value(run: dict[str, Any], standard: dict[str, Any] | None) -> float | None:
    """The paired-bootstrap p-value in the run's compare_to_standard, if it compared exactly the two test scores
    now paired (a standard run replaced by a later call's makes it stale: None)."""
    bleu = (run.get("compare_to_standard") or {}).get("bleu") or {}
    if standard is None or bleu.get("p_value") is None:
        return None
    pairs = ((bleu.get("baseline"), standard["test"]["avg"]["bleu"]), (bleu.get("system"), run["test"]["avg"]["bleu"]))
    if any(recorded is None or abs(recorded - now) > 1e-4 for recorded, now in pairs):
        return None
    return float(bleu["p_value"])


def system_summary(system: str, runs: list[dict[str, Any]], standard_by_seed: dict[int, dict[str, Any]],
                   row: dict[str, Any] | None = None, p_values: dict[int, float | None] | None = None,
                   second_baseline_by_seed: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """One table row: statistics over the finished `runs` of `system` (one per seed), paired by seed with
    `standard_by_seed` (seed -> the standard model's run). `row`: the merged results row (parameters, rho,
    paper_claim); `p_values`: seed -> p computed elsewhere, used where the runs record none. mean ± sd are
    statistics.fmean / stdev (sd None for one seed); BLEU and chrF of the averaged checkpoint on test.
    `second_baseline_by_seed`: the runs of the system's SECOND_BASELINES row, for a second Δ against it (the
    baseline the paper measured its gain from, or the row a combination adds to: `second_baseline`)."""
    row = row or {}
    runs = sorted((r for r in runs if is_done(r)), key=lambda r: r["seed"])
    claim = row.get("paper_claim") or PAPER_CLAIMS.get(system) or {}
    summary: dict[str, Any] = {
        "system": system, "rho": row.get("rho") if system in MAT_SYSTEMS else None,
        "parameters": row.get("parameters"), "runs": [run_key(r) for r in runs], "seeds": [r["seed"] for r in runs],
        "precisions": [r.get("precision") for r in runs],
        "updates": mean_sd([r["updates"] for r in runs if r.get("updates") is not None]),
        "updates_to_best_valid": mean_sd([r["best_valid_step"] for r in runs if r.get("best_valid_step")]),
        "train_minutes": mean_sd([r["train_minutes"] for r in runs if r.get("train_minutes") is not None]),
        "jobs": sorted({j for r in runs for j in r.get("jobs") or []}),
        "threads": sorted({t for r in runs for t in r.get("threads") or []}),
        "results_files": sorted({r["results_file"] for r in runs if r.get("results_file")}),
        "test_bleu": mean_sd([r["test"]["avg"]["bleu"] for r in runs]),
        "test_chrf": mean_sd([r["test"]["avg"]["chrf"] for r in runs if r["test"]["avg"].get("chrf") is not None]),
        "test_bleu_best_ckpt": mean_sd([r["test"]["best"]["bleu"] for r in runs
                                        if (r["test"].get("best") or {}).get("bleu") is not None]),
        "delta_bleu_to_standard": None, "p_values": [], "pooled_p_value": None,
        "paper_delta_bleu": claim.get("delta_bleu"), "paper_claim": claim or None, "second_baseline": None,
    }
    if system == "standard":
        return summary
    paired = [r for r in runs if r["seed"] in standard_by_seed]
    summary["delta_bleu_to_standard"] = paired_delta(paired, standard_by_seed)
    for r in paired:
        p = recorded_p_value(r, standard_by_seed[r["seed"]])
        origin = "results" if p is not None else None
        if p is None and (p_values or {}).get(r["seed"]) is not None:
            p, origin = p_values[r["seed"]], "computed"
        summary["p_values"].append({"seed": r["seed"], "p_value": p, "from": origin})
    summary["pooled_p_value"] = pooled_p_value(paired, standard_by_seed)
    base = second_baseline_by_seed or {}
    against = [r for r in runs if r["seed"] in base]
    if against:
        other, why = SECOND_BASELINES[system]
        summary["second_baseline"] = {"system": other, "why": why, "delta_bleu": paired_delta(against, base),
                                     "p_value": pooled_p_value(against, base, fewest=1)}
    return summary


def paired_delta(runs: list[dict[str, Any]], baseline_by_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """mean ± sd over seeds of each run's test BLEU minus its seed's baseline run's, with the seeds paired."""
    delta = mean_sd([r["test"]["avg"]["bleu"] - baseline_by_seed[r["seed"]]["test"]["avg"]["bleu"] for r in runs])
    return {**delta, "seeds": [r["seed"] for r in runs]}


def pooled_p_value(runs: list[dict[str, Any]], baseline_by_seed: dict[int, dict[str, Any]], fewest: int = 2
                   ) -> dict[str, Any] | None:
    """The paired bootstrap over the seeds together (`paired_bootstrap_replicates`: every resample of test scored on
    each seed, the BLEU averaged over the seeds) of `runs` against the baseline runs of their seeds
    (`baseline_by_seed`), from their per-line BLEU statistics: {"p_value", "seeds"}; None for fewer than `fewest`
    seeds (one: sacreBLEU's paired test) or where a run lacks statistics."""
    pairs = [(baseline_by_seed[r["seed"]]["test"]["avg"].get("bleu_sentence_stats"),
              r["test"]["avg"].get("bleu_sentence_stats")) for r in runs]
    if len(pairs) < fewest or not all(base and mine for base, mine in pairs):
        return None
    result = paired_bootstrap_replicates([base for base, _ in pairs], [mine for _, mine in pairs],
                                         samples=BOOTSTRAP_SAMPLES)
    return {"p_value": result["p_value"], "seeds": [r["seed"] for r in runs]}


# ---- p-values from the saved translations --------------------------------------------------------------------


def default_ref() -> Path:
    """test_2016_flickr.de of $MULTIBRANCH_MULTI30K, $MULTIBRANCH_SHARED_DATA/multi30k or ../shared/data/multi30k."""
    return multi30k_dir() / "test_2016_flickr.de"


def bootstrap_p_value(baseline: list[str], system: list[str], ref: Path) -> float | None:
    """p-value of the BLEU difference (sacreBLEU paired bootstrap, `multibranch evaluate --compare`, 1000
    resamples, its fixed seed) of `system` against `baseline` (lines of test translations); None on failure."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH"))
                                                     if p)}
    with tempfile.TemporaryDirectory(prefix="reproduce-report-") as folder:
        base, mine, out = Path(folder, "standard.hyp"), Path(folder, "system.hyp"), Path(folder, "compare.json")
        base.write_text("".join(f"{line}\n" for line in baseline), encoding="utf-8")
        mine.write_text("".join(f"{line}\n" for line in system), encoding="utf-8")
        result = subprocess.run([sys.executable, "-m", "multibranch", "evaluate", "--hyp", str(base), "--compare",
                                 str(mine), "--ref", str(ref), "--bootstrap-samples", str(BOOTSTRAP_SAMPLES),
                                 "--json", str(out), "--force"], capture_output=True, text=True, env=env, cwd=ROOT)
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines()
            note(f"paired bootstrap failed: {lines[-1] if lines else f'exit status {result.returncode}'}")
            return None
        return float(json.loads(out.read_text(encoding="utf-8"))["compare"]["bleu"]["p_value"])


def hyps_p_values(merged: Merged, runs: dict[str, list[dict[str, Any]]], ref: Path | None
                  ) -> dict[str, dict[int, float | None]]:
    """system -> seed -> p-value for the runs that record no current one: from both runs' per-line BLEU
    statistics (`bleu_sentence_stats`), else from the *_hyps.json files."""
    standard = {r["seed"]: r for r in runs.get("standard", [])}
    hyps: dict[Path, dict[str, Any]] = {}

    def lines(record: dict[str, Any]) -> list[str] | None:
        path = merged.sources[run_key(record)].hyps_path
        if path not in hyps:
            try:
                hyps[path] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
            except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
                note(f"{path}: not readable ({error}); no p-values from it")
                hyps[path] = {}
        found = (hyps[path].get(run_key(record)) or {}).get("avg")
        return found if isinstance(found, list) else None

    tasks: dict[tuple[str, int], tuple[list[str], list[str]]] = {}
    out: dict[str, dict[int, float | None]] = {}
    for system, mine in runs.items():
        for run in mine:
            base = standard.get(run["seed"])
            if system == "standard" or base is None or recorded_p_value(run, base) is not None:
                continue
            stats = [r["test"]["avg"].get("bleu_sentence_stats") for r in (base, run)]
            if all(stats):
                out.setdefault(system, {})[run["seed"]] = paired_bootstrap_statistics(
                    stats[0], stats[1], samples=BOOTSTRAP_SAMPLES)["p_value"]
                continue
            pair = (lines(base), lines(run))
            if pair[0] is not None and pair[1] is not None:
                tasks[(system, run["seed"])] = pair  # type: ignore[assignment]
    if not tasks:
        return out
    if ref is None or not ref.is_file():
        note(f"reference {ref} not found: no p-values from the saved translations (--ref)")
        return out
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        futures = {key: pool.submit(bootstrap_p_value, base, mine, ref) for key, (base, mine) in tasks.items()}
        for (system, seed), future in futures.items():
            out.setdefault(system, {})[seed] = future.result()
    return out


def summaries(merged: Merged, ref: Path | None) -> list[dict[str, Any]]:
    """`system_summary` of every system with a finished run, in table order."""
    runs = table_runs(merged)
    standard = {r["seed"]: r for r in runs.get("standard", [])}
    computed = hyps_p_values(merged, runs, ref)
    out = []
    for system, mine in runs.items():
        row = {**merged.rows.get(system, {})}
        if system in MAT_SYSTEMS:
            row["rho"] = chosen_rho(system, merged)
        other = {r["seed"]: r for r in runs.get(SECOND_BASELINES.get(system, ("",))[0], [])}
        out.append(system_summary(system, mine, standard, row, computed.get(system), other))
    return out


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
    threads = summary.get("threads") or []
    if minutes != DASH and summary["jobs"]:
        minutes += f" (jobs {'/'.join(str(j) for j in summary['jobs'])}" + (
            f", {'/'.join(str(t) for t in threads)} threads" if threads and threads != [1] else "") + ")"
    paper = summary.get("paper_delta_bleu")
    return [name, params, seeds_cell(summary), updates, minutes,
            fmt(summary["test_bleu"]), fmt(summary["delta_bleu_to_standard"], sign=True), p_cell(summary),
            DASH if paper is None else f"{paper:+g}"]


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


def files_line(files: list[ResultsFile]) -> str:
    """'Results merged (...): `FILE` (GPU, commit C, date); ...'."""
    parts = []
    for file in files:
        env = file.environment
        facts = [env.get("gpu") or (f"CPU {env['cpu']} ({', '.join(env.get('cpu_flags') or []) or 'flags unknown'})"
                                    if env.get("cpu") else f"device {env.get('device') or 'unknown'}")]
        if env.get("commit"):
            facts.append(f"commit {env['commit'][:10]}" + (" with local changes" if env.get("commit_dirty") else ""))
        if file.date():
            facts.append(file.date())
        parts.append(f"`{file.label}` ({', '.join(facts)})")
    return "Results merged (a run in two files is taken from the later one): " + "; ".join(parts) + "."


LEGEND = ("Test BLEU and chrF: sacreBLEU on test_2016_flickr, the average of the last checkpoints, mean ± sd over "
          "seeds. Δ: the system's test BLEU minus the standard model's of the same seed. p: the paired bootstrap "
          "against those standard models, first over the seeds together (each resample of test scored on every "
          "seed and the scores averaged; from two seeds on), then sacreBLEU's, one per seed. Updates to "
          "stop: where early stopping or the cap ended training (best at: the update of the best validation "
          "BLEU). {minutes}: training minutes per run; with jobs N, N runs shared one {device} (at one thread each "
          "where no threads are given; the machines differ: see the results files above); a run resumed by calls "
          "of another setting gives each (jobs 1/2), with the threads its calls recorded, else those of the call "
          "that finished it. Paper's Δ: the "
          "paper's own gain on its own data and shape.")


def wrap(paragraph: str) -> str:
    """A Markdown paragraph in lines of at most DOC_WIDTH characters (words and `code` kept whole)."""
    return textwrap.fill(paragraph, DOC_WIDTH, break_long_words=False, break_on_hyphens=False)


def docs_region(files: list[ResultsFile], rows: list[dict[str, Any]], figures: list[tuple[str, str]],
                merged: Merged | None = None) -> str:
    """The text between the markers: the files merged, the table, its legend, the dominant-head and length tables, the runs
    trained on both kinds of device, and the figures (link, caption); NO_RESULTS while no file holds a finished
    run."""
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
        for table in (dominant_table(runs), length_table(runs)):
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


def length_buckets(runs: dict[str, list[dict[str, Any]]], system: str) -> dict[int, dict[str, dict[str, Any]]]:
    """Each seed of `system` that has the lengths analysis: its buckets by label, in the analysis' order."""
    found = {}
    for run in runs.get(system, []):
        report = analysis(run, "lengths")
        if report and report.get("models"):
            found[run["seed"]] = {b["label"]: b for b in report["models"][0]["buckets"]}
    return found


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


# ---- figure data -------------------------------------------------------------------------------------------


def analysis(run: dict[str, Any], name: str) -> dict[str, Any] | None:
    report = (run.get("analyses") or {}).get(name)
    return report if isinstance(report, dict) and "error" not in report else None


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


KAPPA_ALPHA_KEY = re.compile(rf"^encoder\.layers\.{KAPPA_ALPHA_LAYER}\.(?:.+\.)?weights\.(kappa|alpha)\.(\d+)$")


def kappa_alpha_data(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The Weighted Transformer's kappa/alpha of encoder layer KAPPA_ALPHA_LAYER over updates, from its lowest
    seed that logged them: {"seed", "kappa": {branch: (steps, values)}, "alpha": {...}}."""
    for run in runs.get("weighted", []):  # sorted by seed
        series: dict[str, dict[int, tuple[list[int], list[float]]]] = {"kappa": {}, "alpha": {}}
        for record in (run.get("curve") or {}).get("kappa_alpha") or []:
            for key, value in record.items():
                found = KAPPA_ALPHA_KEY.match(key)
                if found and isinstance(value, (int, float)):
                    steps, values = series[found.group(1)].setdefault(int(found.group(2)), ([], []))
                    steps.append(record["step"])
                    values.append(float(value))
        if series["kappa"] or series["alpha"]:
            return {"seed": run["seed"], **series}
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
    """Two panels (kappa, alpha) against updates, one line per branch: moving average of KAPPA_ALPHA_WINDOW
    records (solid) over the logged values (faint)."""
    import matplotlib.pyplot as plt

    from multibranch.figures.curves import moving_average

    fig, axes = plt.subplots(1, 2, figsize=(10.0, 3.6), layout="constrained", sharex=True)
    for ax, key in zip(axes, ("kappa", "alpha"), strict=True):
        for branch, (steps, values) in sorted(data[key].items()):
            line, = ax.plot(steps, moving_average(values, KAPPA_ALPHA_WINDOW), label=f"branch {branch + 1}")
            ax.plot(steps, values, color=line.get_color(), alpha=0.25, linewidth=0.8)
        ax.set_title(f"{'κ' if key == 'kappa' else 'α'} ({key})")
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("weight")
    fig.suptitle(f"Weighted Transformer, encoder layer {KAPPA_ALPHA_LAYER + 1} (seed {data['seed']}; moving average of "
                 f"{KAPPA_ALPHA_WINDOW} records)")
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
    Figure("kappa_alpha.png", "Weighted Transformer kappa and alpha of the second encoder layer during training",
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
                + (", ".join(f"`{r}`" for r in done) if done else "none yet") + ".")
    costs = cost_table()
    priority = priority_paragraph()
    figure = f"\n![{CURVE_CAPTION}]({curve_link})\n" if curve_link else ""
    return ("\n" + wrap(text) + "\n" + figure + (f"\n{costs}" if costs else "")
            + (f"\n{priority}" if priority else "") + "\n")


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
