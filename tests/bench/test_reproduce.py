"""bench/reproduce.py end to end at its --tiny CPU size, so the harness cannot rot where CI has
no GPU: prepare a few hundred Multi30k pairs, train the standard model, MAT by proximal initialisation
and DropHead for a few dozen updates, average, translate, score with sacreBLEU, paired bootstrap against
the standard model; a run paused by --segment-updates resumes from its last.pt, and a second call skips
every finished run. The harness is driven as a command (a subprocess), as on the GPU machine; tiny models
learn nothing in 30 updates (BLEU near 0), so only the plumbing is checked, not the quality."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.reproduce_analyses import ANALYSES, AnalysisSettings, run_analyses
from multibranch.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "reproduce.py"
MAT_SOURCE = {"mat2": "standard", "mat3": "standard", "mat2-narrow": "standard-narrow", "mat3-narrow": "standard-narrow"}
SIGNATURE = re.compile(r"^nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:[\d.]+$")


def reproduce(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)
    assert proc.returncode == 0, f"bench/reproduce.py {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def by_key(result: dict) -> dict[str, dict]:
    return {f"{Path(r['dir']).parent.name}/seed{r['seed']}": r for r in result["runs"]}


def test_plan_orders_dependencies(tmp_path):
    """--dry-run needs no data: MAT seeds wait for the standard model of their seed and for the rho grid."""
    out = reproduce("--tiny", "--dry-run", "--work", str(tmp_path / "w"), "--out", str(tmp_path),
                    "--systems", "mat2", "weighted", "--seeds", "1", "2", "--rho-grid", "0.1,0.3").stdout.splitlines()
    plan = {line.split()[0]: line for line in out}
    assert list(plan)[:2] == ["standard/seed1", "standard/seed2"]  # MAT needs them, though not asked for
    assert "needs standard/seed1" in plan["mat2-rho0.1/seed1"] and "grid" in plan["mat2-rho0.3/seed1"]
    assert "mat2/seed2" in plan and all(k in plan["mat2/seed2"] for k in
                                        ("standard/seed2", "mat2-rho0.1/seed1", "mat2-rho0.3/seed1"))
    assert {"weighted/seed1", "weighted/seed2"} <= set(plan) and "needs" not in plan["weighted/seed1"]
    assert not (tmp_path / "w" / "data").exists()


def test_plan_combination_takes_rho_from_its_mat_grid(tmp_path):
    """MAT + DropHead has no rho grid of its own: every seed, the grid seed included, waits for mat3-narrow's."""
    out = reproduce("--tiny", "--dry-run", "--work", str(tmp_path / "w"), "--out", str(tmp_path),
                    "--systems", "mat3-narrow-drophead", "--seeds", "1", "2", "--rho-grid", "0.1,0.3").stdout
    plan = {line.split()[0]: line for line in out.splitlines()}
    grid = ["mat3-narrow-rho0.1/seed1", "mat3-narrow-rho0.3/seed1"]
    assert list(plan) == ["standard-narrow/seed1", "standard-narrow/seed2", *grid,
                          "mat3-narrow-drophead/seed1", "mat3-narrow-drophead/seed2"]
    for seed in (1, 2):
        assert all(k in plan[f"mat3-narrow-drophead/seed{seed}"] for k in (f"standard-narrow/seed{seed}", *grid))


def test_analyses_recorded_per_system_failures_kept_apart(tiny_checkpoint, tiny_data, tmp_path):
    """A system's analyses (bench/reproduce_analyses.py) land in analyses.json; one that fails is recorded
    with its error and does not stop the others; a finished analysis is not run again."""
    calls: list[list[str]] = []

    def cli(args: list[str], log: Path) -> None:
        calls.append(args)
        if main(args) != 0:
            raise RuntimeError(f"multibranch {' '.join(args[:2])} failed")

    settings = AnalysisSettings(score_sentences=8, step=0.5)
    standard = run_analyses("standard", tiny_checkpoint, tiny_data, tmp_path / "standard", settings, cli)
    assert list(standard) == list(ANALYSES["standard"]) == ["pruning", "lengths"]
    curve = standard["pruning"]["pruning_curve"]["points"]
    assert [p["fraction"] for p in curve] == [0.0, 0.5, 1.0] and all("masked" not in p for p in curve)
    assert standard["pruning"]["score"]["sentences"] == 8 and curve[0]["masked_heads"] == 0
    assert sum(b["sentences"] for b in standard["lengths"]["models"][0]["buckets"]) == 24  # the whole test split
    saved = json.loads((tmp_path / "standard" / "analyses.json").read_text())
    assert saved == json.loads(json.dumps(standard))
    assert "checkpoint" not in saved["pruning"] and "checkpoint" not in saved["lengths"]["models"][0]

    calls.clear()  # again: nothing left to do
    assert run_analyses("standard", tiny_checkpoint, tiny_data, tmp_path / "standard", settings, cli) == standard
    assert calls == []

    # MUSE's analyses on a checkpoint without convolutions: gates fails, lengths still runs
    muse = run_analyses("muse", tiny_checkpoint, tiny_data, tmp_path / "muse", settings, cli)
    assert "error" in muse["gates"] and "buckets" in muse["lengths"]


def test_the_weighted_transformers_analyses_keep_its_weights_and_their_replacement_apart(
        weighted_checkpoint, tiny_data, tmp_path):
    """The Weighted Transformer's gates analysis keeps its kappa/alpha; its replacement analysis, the test split
    scored with them learned, uniform and random (Table 3), without the data's path."""
    def cli(args: list[str], log: Path) -> None:
        if main(args) != 0:
            raise RuntimeError(f"multibranch {' '.join(args[:2])} failed")

    done = run_analyses("weighted", weighted_checkpoint, tiny_data, tmp_path, AnalysisSettings(), cli)
    assert list(done) == ["gates", "replacement"] and done["gates"]["branch_weights"]
    replaced = done["replacement"]
    assert replaced["split"] == "test" and replaced["sentences"] == 24 and "data" not in replaced
    assert [r["seed"] for r in replaced["random"]] == [1, 2, 3] and "branch_weights" not in replaced
    assert set(replaced["learned"]) == set(replaced["uniform"]) == {"bleu", "chrf"}
    assert [m["name"] for m in replaced["uniform_per_module"]] == [m["name"] for m in done["gates"]["branch_weights"]]


@pytest.mark.slow  # 70 s on 2 cores: the harness end to end (prepare, train, resume, skip); `.ci/run-slow` runs it
@pytest.mark.multi30k
def test_tiny_end_to_end_resume_and_skip(multi30k, tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    common = ["--tiny", "--work", str(work), "--out", str(out), "--multi30k", str(multi30k), "--seeds", "1",
              "--device", "cpu"]
    results = out / "reproduce_tiny.json"

    # 1. the standard model, paused after 20 of its 30 updates: recorded as unfinished, not evaluated
    reproduce(*common, "--systems", "standard", "--segment-updates", "20")
    first = json.loads(results.read_text())
    std = by_key(first)["standard/seed1"]
    assert std["status"] == "unfinished" and "paused at update 20" in std["stop"] and "test" not in std
    assert (work / "runs" / "standard" / "seed1" / "train" / "last.pt").is_file()

    # 2. all three systems: the standard model resumes from last.pt, MAT starts from it (proximal)
    reproduce(*common, "--systems", "standard", "mat2", "drophead", "--rho-grid", "0.2", "--jobs", "2")
    result = json.loads(results.read_text())
    env = result["environment"]
    assert env["torch"] and env["cpu"] and env["amp"] == "none" and env["device"] == "cpu" and "gpu" in env
    assert "bench/reproduce.py" in env["command"] and "commit" in env  # None outside a git checkout
    assert result["settings"]["tiny"] and result["settings"]["data"]["pairs"] == {"train": 300, "valid": 40, "test": 40}
    runs = by_key(result)
    assert set(runs) == {"standard/seed1", "mat2-rho0.2/seed1", "drophead/seed1"}
    segments = runs["standard/seed1"]["segments"]
    assert [(s["from_step"], s["to_step"], s["resume"]) for s in segments] == [(0, 20, False), (20, 30, True)]
    for key, run in runs.items():
        assert run["status"] == "done", key
        assert run["stop"].startswith(("reached max_steps", "no improvement")), run["stop"]
        steps = [r["step"] for r in run["curve"]["valid"]]
        assert steps == sorted(set(steps)) and steps[-1] == run["updates"] and len(steps) >= 2, steps
        assert all(isinstance(r["bleu"], float) and isinstance(r["loss"], float) for r in run["curve"]["valid"])
        assert run["curve"]["train"] and run["best_valid_step"] in steps
        for label in ("avg", "best"):
            test = run["test"][label]
            assert SIGNATURE.match(test["bleu_signature"]), test["bleu_signature"]
            assert test["chrf_signature"].startswith("nrefs:1|") and 0.0 <= test["bleu"] <= 100.0
        assert run["test"]["avg"]["checkpoints"] == ["step_00000010.pt", "step_00000020.pt", "step_00000030.pt"]
    mat_dir = work / "runs" / "mat2-rho0.2" / "seed1"
    assert "convert proximal --ckpt " + str(work / "runs" / "standard" / "seed1" / "train" / "best.pt") in \
        (mat_dir / "harness.log").read_text()
    assert not (mat_dir / "train" / "last.pt").exists() and (mat_dir / "train" / "best.pt").is_file()  # pruned
    for key in ("mat2-rho0.2/seed1", "drophead/seed1"):
        compare = runs[key]["compare_to_standard"]
        assert compare["lines"] == 40 and compare["samples"] == 1000
        assert 0.0 <= compare["bleu"]["p_value"] <= 1.0 and "bs:1000" in compare["bleu"]["signature"]
        assert compare["bleu"]["baseline"] == pytest.approx(runs["standard/seed1"]["test"]["avg"]["bleu"])
        assert compare["bleu"]["system"] == pytest.approx(runs[key]["test"]["avg"]["bleu"])
    rows = {row["system"]: row for row in result["rows"]}
    assert list(rows) == ["standard", "mat2", "drophead"]
    assert rows["mat2"]["rho"] == 0.2 and rows["mat2"]["rho_grid_valid_bleu"].keys() == {"0.2"}
    assert rows["mat2"]["parameters"] > rows["standard"]["parameters"] > 0  # two branches per attention
    assert rows["drophead"]["parameters"] == rows["standard"]["parameters"]
    for row in rows.values():
        assert row["seeds"] == [1] and row["test_bleu"]["n"] == 1 and row["updates"]["values"] == [30]
    assert rows["mat2"]["delta_bleu_to_standard"]["values"] == [
        pytest.approx(runs["mat2-rho0.2/seed1"]["test"]["avg"]["bleu"] - runs["standard/seed1"]["test"]["avg"]["bleu"])]
    p_value = rows["drophead"]["p_values"]
    assert p_value == [{"seed": 1, "p_value": runs["drophead/seed1"]["compare_to_standard"]["bleu"]["p_value"],
                        "from": "results"}]
    assert result["bleu_signatures"] and all(SIGNATURE.match(s) for s in result["bleu_signatures"])
    assert set(runs["standard/seed1"]["analyses"]) == {"pruning", "lengths"}  # on the averaged checkpoint
    assert set(runs["mat2-rho0.2/seed1"]["analyses"]) == {"importance"}
    points = runs["drophead/seed1"]["analyses"]["pruning"]["pruning_curve"]["points"]
    assert points[0]["fraction"] == 0.0 and points[-1]["fraction"] == 1.0 and len(points) == 11

    # 3. the same call again: every run is skipped, nothing is retrained or rescored
    done_files = sorted(work.glob("runs/*/seed1/done.json"))
    stamps = [p.stat().st_mtime_ns for p in done_files]
    reproduce(*common, "--systems", "standard", "mat2", "drophead", "--rho-grid", "0.2")
    again = json.loads(results.read_text())
    assert {a["status"] for a in again["this_call"]["actions"]} == {"skipped (done before)"}
    assert len(again["this_call"]["actions"]) == 3
    assert [p.stat().st_mtime_ns for p in done_files] == stamps
    assert [r["test"] for r in again["runs"]] == [r["test"] for r in result["runs"]]


@pytest.mark.multi30k
def test_budget_spent_starts_nothing(multi30k, tmp_path):
    """With no --budget left no training starts; the runs are reported as not started, and nothing fails."""
    out = tmp_path / "out"
    reproduce("--tiny", "--work", str(tmp_path / "work"), "--out", str(out), "--multi30k", str(multi30k),
              "--systems", "standard", "--seeds", "1", "--budget", "0.001", "--device", "cpu")
    result = json.loads((out / "reproduce_tiny.json").read_text())
    assert result["this_call"]["actions"] == [{"run": "standard/seed1", "status": "not started (budget)"}]
    assert result["runs"][0]["status"] == "not started" and result["rows"][0]["test_bleu"]["n"] == 0


@pytest.mark.slow
@pytest.mark.multi30k
@pytest.mark.timeout(2400)
def test_tiny_all_systems_two_seeds(multi30k, tmp_path):
    """Every system, two seeds, MAT's rho chosen on valid from a two-value grid, two runs at a time."""
    out = tmp_path / "out"
    reproduce("--tiny", "--work", str(tmp_path / "work"), "--out", str(out), "--multi30k", str(multi30k),
              "--seeds", "1", "2", "--rho-grid", "0.1,0.3", "--jobs", "2", "--device", "cpu", timeout=2300)
    result = json.loads((out / "reproduce_tiny.json").read_text())
    rows = {row["system"]: row for row in result["rows"]}
    assert list(rows) == ["standard", "mat2", "mat3", "standard-narrow", "mat2-narrow", "mat3-narrow", "weighted",
                          "mute", "mute-bias", "mute-bias-seq", "muse", "muse-simple", "drophead",
                          "mat3-narrow-drophead"]
    runs = by_key(result)
    for system, row in rows.items():
        assert row["seeds"] == [1, 2] and row["test_bleu"]["sd"] is not None, system
        if system != "standard":
            assert row["delta_bleu_to_standard"]["n"] == 2 and [p["seed"] for p in row["p_values"]] == [1, 2]
    assert rows["mat3-narrow-drophead"]["rho"] == rows["mat3-narrow"]["rho"]  # the combination has no grid
    for run in result["runs"]:  # every finished run carries its system's analyses, none failed
        if run["status"] == "done" and not run["grid"]:
            assert set(run.get("analyses", {})) == set(ANALYSES.get(run["system"], ())), run["system"]
            assert not [name for name, value in run.get("analyses", {}).items() if "error" in value], run["system"]
    assert all(run["curve"].get("kappa_alpha") for run in result["runs"] if run["system"] == "weighted")
    for system in ("mat2", "mat3", "mat2-narrow", "mat3-narrow"):
        grid = rows[system]["rho_grid_valid_bleu"]
        assert set(grid) == {"0.1", "0.3"}
        chosen = rows[system]["rho"]
        assert grid[f"{chosen:g}"] == max(grid.values())
        assert runs[f"{system}-rho{chosen:g}/seed2"]["status"] == "done"  # seed 2 with the chosen rho only
        other = 0.3 if chosen == 0.1 else 0.1
        assert f"{system}-rho{other:g}/seed2" not in runs and runs[f"{system}-rho{other:g}/seed1"]["grid"]
        source = MAT_SOURCE[system]
        for seed in (1, 2):
            log = (Path(runs[f"{system}-rho{chosen:g}/seed{seed}"]["dir"]) / "harness.log").read_text()
            assert f"convert proximal --ckpt {Path(runs[f'{source}/seed{seed}']['dir']) / 'train' / 'best.pt'}" in log


@pytest.mark.slow
def test_cpu_recipe_tiny_writes_one_file_per_finished_run_and_skips_it_later(multi30k, tmp_path):
    """The CPU recipe end to end at the plumbing size: each finished run has its own results file, with the
    precision it trained in and per-line BLEU statistics that give the report's paired bootstrap; a later call
    trains nothing that has its file."""
    from bench.reproduce_results import load_results, merge, summaries
    from multibranch.evaluate.metrics import paired_bootstrap_statistics

    out = tmp_path / "out"
    common = ["--recipe", "cpu", "--tiny", "--work", str(tmp_path / "work"), "--out", str(out), "--multi30k",
              str(multi30k), "--seeds", "1", "--device", "cpu", "--results-per-run", "--systems", "standard",
              "drophead"]
    first = reproduce(*common).stdout
    files = sorted(p.name for p in out.glob("*.json"))
    assert files == ["reproduce_cpu_tiny_drophead_seed1.json", "reproduce_cpu_tiny_standard_seed1.json"]
    runs = {}
    for name in files:
        data = json.loads((out / name).read_text())
        assert data["settings"]["recipe"] == "cpu" and data["environment"]["cpu_flags"] is not None
        (record,) = data["runs"]
        assert record["status"] == "done" and record["precision"] in ("fp32", "bf16")
        assert len(record["test"]["avg"]["bleu_sentence_stats"]) == 40  # one row per test line
        runs[record["system"]] = record
    assert set(runs["standard"]["analyses"]) == {"pruning", "lengths"}
    assert "dominant_heads" in runs["drophead"]["analyses"]["pruning"]  # the CPU recipe masks dominant heads too
    merged = merge([load_results(out / name) for name in files])
    (p,) = next(r for r in summaries(merged, None) if r["system"] == "drophead")["p_values"]
    assert p["p_value"] == pytest.approx(runs["drophead"]["compare_to_standard"]["bleu"]["p_value"])
    assert p["p_value"] == pytest.approx(paired_bootstrap_statistics(
        runs["standard"]["test"]["avg"]["bleu_sentence_stats"],
        runs["drophead"]["test"]["avg"]["bleu_sentence_stats"])["p_value"])
    assert "done" in first
    second = reproduce(*[a if a != str(tmp_path / "work") else str(tmp_path / "fresh") for a in common]).stdout
    assert second.count("reported before") == 2 and "train from update" not in second
    written = {name: (out / name).read_bytes() for name in files}
    third = reproduce(*common).stdout  # the first call's work folder: its runs are done there
    assert third.count("skipped (done before)") == 2
    assert {name: (out / name).read_bytes() for name in files} == written  # commit and wall time as first written
