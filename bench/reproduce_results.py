"""The results files of bench/reproduce.py calls, merged run by run, and the statistics of each system's runs
against the standard model of the same seed: what bench/reproduce_report.py puts on docs/reproduction.md."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]  # bench.* and this checkout's multibranch (no torch needed)

from bench.common import multi30k_dir  # noqa: E402
from bench.reproduce_cost import recorded_cpu, run_threads  # noqa: E402
from bench.reproduce_systems import MAT_SYSTEMS, PAPER_CLAIMS, RECIPES, SECOND_BASELINES, SYSTEMS, grid_of  # noqa: E402
from multibranch.evaluate.metrics import paired_bootstrap_replicates, paired_bootstrap_statistics  # noqa: E402
from multibranch.json_file import read_json_object  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# what must be equal for runs of two calls to share a table; the update cap may differ (a call sets it near the
# updates the standard model needed, so that DropHead's V schedule and Weighted's kappa/alpha freeze fit the run)
RECIPE_KEYS = ("patience", "valid_every", "average_last", "tiny", "data.vocab_size")
BOOTSTRAP_SAMPLES = 1000
PRUNING_SYSTEMS = ("standard", "drophead", "drophead-constant", "mat", "mat3-narrow-drophead", "mat-drophead")
LENGTH_SYSTEMS = ("standard", "muse", "muse-simple")


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

    @property
    def machine(self) -> str | tuple[Any, ...] | None:
        """What the call trained on: the GPU's name, else the CPU's model and flags (as run-time estimates tell
        CPUs apart); None when unrecorded."""
        env = self.environment
        if env.get("gpu"):
            return env["gpu"]
        return recorded_cpu(env) if env.get("cpu") else None

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
    """The harness's key of a results file's run record: its work folder's name and its seed ("weighted/seed1")."""
    return f"{run_name(record)}/seed{record['seed']}"


# the settings that decide how a run trains and is scored: a reported run counts for a call with the same ones
RUN_SETTINGS = ("recipe", "tiny", "max_updates", "patience", "valid_every", "valid_sentences", "average_last",
                "warmup", "lr", "overrides", "analyses")
ENGINE_SETTINGS = ("train.graphs=", "decode.fixed_shapes=")  # how a run is computed, not what it trains


def training_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The RUN_SETTINGS of a results file's settings block (or of a call's arguments), engine choices left out."""
    sets = [o for o in settings.get("overrides") or [] if not o.startswith(ENGINE_SETTINGS)]
    return {**{key: settings.get(key) for key in RUN_SETTINGS}, "overrides": sets}


def reported_run_keys(folders: list[Path], settings: dict[str, Any]) -> set[str]:
    """The keys (RUN/seedK) of the finished runs that the results files in `folders` hold, trained to the same
    training settings as `settings`: a file per run, or a GPU call's one file for all its runs."""
    mine = training_settings(settings)
    found: set[str] = set()
    for folder in dict.fromkeys(folders):
        for path in sorted(folder.glob("reproduce*.json")):
            if path.name.endswith("_hyps.json"):  # translations
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
                continue  # curve and cost files
            if training_settings(data["settings"]) == mine:
                found.update(run_key(r) for r in data.get("runs") or []
                             if r.get("status") == "done" and r.get("dir") and r.get("seed") is not None)
    return found


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
                                "device": file.device, "machine": file.machine}
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
        "train_minutes_comparable": len({(r.get("machine"), tuple(r.get("jobs") or ()), tuple(r.get("threads") or ()))
                                         for r in runs}) <= 1,
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


# ---- the analyses of a run ---------------------------------------------------------------------------------


def analysis(run: dict[str, Any], name: str) -> dict[str, Any] | None:
    report = (run.get("analyses") or {}).get(name)
    return report if isinstance(report, dict) and "error" not in report else None



FIT_SPAN = 500  # the updates at the end of training whose training NLL `end_fit` averages


def end_fit(run: dict[str, Any]) -> dict[str, float] | None:
    """How well a run fits at the end of training: the mean training NLL over the last FIT_SPAN updates it logged
    (on training batches, with dropout and the system's own regularisers on) and the validation NLL of its last
    validation; None where its curve lacks either."""
    curve = run.get("curve") or {}
    train = [p for p in curve.get("train") or [] if p.get("nll") is not None and p.get("step") is not None]
    valid = [p for p in curve.get("valid") or [] if p.get("nll") is not None and p.get("step") is not None]
    if not train or not valid:
        return None
    last = max(p["step"] for p in train)
    recent = [p["nll"] for p in train if p["step"] > last - FIT_SPAN]
    return {"train_nll": statistics.fmean(recent), "valid_nll": max(valid, key=lambda p: p["step"])["nll"]}


OFF_FRACTION = 0.1  # a Weighted Transformer branch weighed below this fraction of an equal share 1/M is nearly off


def branches_off(run: dict[str, Any]) -> dict[str, tuple[int, int]] | None:
    """The Weighted Transformer's branches nearly switched off at the end of a run, from its gates analysis: per
    side ("encoder", "decoder"), how many branches have kappa_i or alpha_i below OFF_FRACTION / M, and how many
    branches the side has; None without branch weights."""
    weights = (analysis(run, "gates") or {}).get("branch_weights") or []
    counts: dict[str, list[int]] = {}
    for module in weights:
        limit = OFF_FRACTION / len(module["alpha"])
        side = counts.setdefault(module["side"], [0, 0])
        side[0] += sum(k < limit or a < limit for k, a in zip(module["kappa"], module["alpha"], strict=True))
        side[1] += len(module["alpha"])
    return {side: (off, total) for side, (off, total) in counts.items()} or None


def length_buckets(runs: dict[str, list[dict[str, Any]]], system: str) -> dict[int, dict[str, dict[str, Any]]]:
    """Each seed of `system` that has the lengths analysis: its buckets by label, in the analysis' order."""
    found = {}
    for run in runs.get(system, []):
        report = analysis(run, "lengths")
        if report and report.get("models"):
            found[run["seed"]] = {b["label"]: b for b in report["models"][0]["buckets"]}
    return found

