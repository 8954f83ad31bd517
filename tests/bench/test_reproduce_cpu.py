"""The CPU recipe of the reproduction and its background runner, without training: each system is its `-tiny`
preset's model on the standard recipe's training, the plan goes seed by seed (the main rows' seeds first), a run already reported is not
trained again, the run-time estimates against hand-computed numbers, the runner's process in a scheduling group
of its own at the lowest priority, and the report's CPU table (p-values from per-line statistics, the
dominant-head table, runs trained on both kinds of device)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench import reproduce, reproduce_cost, reproduce_runner
from bench.reproduce_report import docs_region
from bench.reproduce_results import merge, summaries, table_runs, training_settings
from bench.reproduce_systems import CPU_PRESETS, ONMT_LAYOUT, RECIPES, system_delta
from multibranch.config import deep_merge
from multibranch.evaluate.metrics import paired_bootstrap_replicates, paired_bootstrap_statistics
from multibranch.experiment import load_preset_dict
from tests.helpers.reproduction import compared, results, run, write

ROOT = Path(__file__).resolve().parents[2]
BASE = load_preset_dict("transformer-tiny")["model"]


@pytest.mark.parametrize("system", ["standard", "drophead", "mat", "muse", "muse-simple", "mute", "mute-bias",
                                    "mute-bias-seq"])
def test_a_cpu_system_trains_its_tiny_presets_model(system):
    """The delta merged onto transformer-tiny (as `train --config` merges it) is the preset's own model."""
    delta = system_delta(system, 3000, RECIPES["cpu"].rho, recipe="cpu")
    assert set(delta) == {"model"}  # training and decoding stay transformer-tiny's for every system
    assert deep_merge(BASE, delta["model"]) == load_preset_dict(CPU_PRESETS[system])["model"]


def test_the_recipes_schedules_plan_for_its_updates_and_the_combination_is_both():
    weighted = system_delta("weighted", 3000, recipe="cpu")["model"]
    assert weighted["encoder"]["freeze_last"] == weighted["decoder"]["freeze_last"] == 500  # the last sixth
    combined = deep_merge(BASE, system_delta("mat-drophead", 3000, RECIPES["cpu"].rho, recipe="cpu")["model"])
    mat = load_preset_dict("mat-tiny")["model"]
    assert {k: v for k, v in combined.items() if k != "drophead"} == mat  # mat-tiny's width and branches
    assert combined["drophead"] == load_preset_dict("drophead-tiny")["model"]["drophead"]  # V, 0.2
    constant = system_delta("drophead-constant", 3000, recipe="cpu")["model"]["drophead"]["rate"]
    assert constant == {"schedule": "constant", "rate": 0.2}
    source = deep_merge(BASE, system_delta("mat-source", 3000, recipe="cpu")["model"])
    assert source["d_model"] == mat["d_model"] and source["encoder"]["attention_branches"] == 1
    # the Weighted Transformer read with one full-width FFN shared by the branches: only ffn_mode differs
    shared = system_delta("weighted-shared", 3000, recipe="cpu")["model"]
    assert {side: {k: v for k, v in shared[side].items() if k != "ffn_mode"} for side in shared} == weighted
    assert shared["encoder"]["ffn_mode"] == shared["decoder"]["ffn_mode"] == "shared"
    assert load_preset_dict("weighted-tiny")["model"]["encoder"].get("ffn_mode", "split") == "split"


def test_the_weighted_readings_have_the_same_parameters():
    """`weighted` (an FFN of d_ff / M per branch) and `weighted-shared` (one FFN of d_ff for every branch) both
    keep the standard model's FFN parameters."""
    from multibranch.config import from_dict
    from multibranch.models import ModelConfig, build_model

    def parameters(system: str) -> int:
        model = {**deep_merge(BASE, system_delta(system, 3000, recipe="cpu")["model"]),
                 "src_vocab_size": 8000, "tgt_vocab_size": 8000}
        return sum(p.numel() for p in build_model(from_dict(ModelConfig, model)).parameters())

    assert parameters("weighted") == parameters("weighted-shared")


def test_the_plan_goes_seed_by_seed_main_rows_first_and_refuses_other_recipes_systems(tmp_path, capsys):
    args = ["--recipe", "cpu", "--dry-run", "--work", str(tmp_path), "--out", str(tmp_path)]
    assert reproduce.main([*args, "--seeds", "1", "2"]) == 0
    plan = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    table = RECIPES["cpu"].table_systems
    main = ["standard", "drophead", "mat", "weighted", "muse", "mute-bias-seq", "mat-drophead"]
    others = ["standard-prenorm", "muse-simple", "mute", "mute-bias", "drophead-constant"]
    assert sorted(table) == sorted(main + others)
    assert plan == [f"{s}/seed{k}" for k in (1, 2) for s in main] + [f"{s}/seed{k}" for k in (1, 2) for s in others]
    assert "mat-proximal" not in table and "weighted-shared" not in table  # only when asked for
    assert reproduce.main([*args, "--systems", "mat-proximal", "--seeds", "1"]) == 0
    assert capsys.readouterr().out.split() == ["mat-source/seed1", "mat-proximal-rho0.2/seed1", "needs",
                                               "mat-source/seed1"]
    with pytest.raises(SystemExit) as stop:
        reproduce.main([*args, "--systems", "mat3-narrow"])
    assert stop.value.code == 2 and "not in the cpu recipe" in capsys.readouterr().err


def test_a_run_reported_to_the_same_settings_is_not_trained_again(tmp_path):
    out = tmp_path / "out"
    out.mkdir()

    def harness(*more: str) -> reproduce.Harness:
        return reproduce.Harness(reproduce.parse_args(
            ["--recipe", "cpu", "--max-updates", "3000", "--results-per-run", "--out", str(out), "--work",
             str(tmp_path / "w"), *more]))

    standard = reproduce.Run("standard", 1)
    assert not harness().reported(standard)
    done = {"system": "standard", "seed": 1, "status": "done", "dir": "/elsewhere/runs/standard/seed1"}
    record = {"settings": harness().settings(), "runs": [done]}
    write(out / "reproduce_cpu_standard_seed1.json", record)
    assert harness().reported(standard) and not harness().reported(reproduce.Run("standard", 2))
    assert harness().execute(standard) == "reported before"
    # a GPU call's one file for all its runs counts too, its engine settings aside
    (out / "reproduce_cpu_standard_seed1.json").unlink()
    gpu = {"settings": {**harness().settings(), "overrides": ["train.graphs=auto", "decode.fixed_shapes=auto"]},
           "runs": [done, {**done, "seed": 2, "status": "unfinished", "dir": "/g/runs/standard/seed2"}]}
    write(out / "reproduce_cpu_h200.json", gpu)
    assert harness().reported(standard) and not harness().reported(reproduce.Run("standard", 2))
    # trained to another length, or with a setting that changes the training: not the same run
    write(out / "reproduce_cpu_h200.json", {**gpu, "settings": {**gpu["settings"], "max_updates": 999}})
    assert not harness().reported(standard)
    write(out / "reproduce_cpu_h200.json", {**gpu, "settings": {**gpu["settings"], "overrides": ["train.lr.lr=1"]}})
    assert not harness().reported(standard)



def test_again_trains_a_run_another_device_reported_and_never_replaces_a_results_file(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    args = ["--recipe", "cpu", "--max-updates", "3000", "--out", str(out), "--work", str(tmp_path / "w")]

    def harness(*more: str) -> reproduce.Harness:
        return reproduce.Harness(reproduce.parse_args([*args, "--results-per-run", *more]))

    done = {"system": "mat", "seed": 2, "status": "done", "dir": "/g/runs/mat/seed2"}
    gpu = {"settings": {**harness().settings(), "overrides": ["train.graphs=auto"]}, "runs": [done]}
    write(out / "reproduce_cpu_h200_1.json", gpu)
    mat = reproduce.Run("mat", 2)
    assert harness().reported(mat)
    assert not harness("--again", "mat/seed2").reported(mat)
    assert harness("--again", "mat/seed2").reported(reproduce.Run("mat", 1)) is False  # never reported at all
    write(out / "reproduce_cpu_h200_1.json", {**gpu, "runs": [done, {**done, "seed": 1, "dir": "/g/runs/mat/seed1"}]})
    assert harness("--again", "mat/seed2").reported(reproduce.Run("mat", 1))  # only the runs named
    # refused before anything is written: a run the call does not plan, a results file of its own already there,
    # and --again without the options that skip reported runs
    for more, message in [(["--again", "mat/seed9"], "not a run of this call"),
                          (["--again", "mat/seed2", "--work", str(tmp_path / "w2")], None)]:
        if message is None:
            write(out / "reproduce_cpu_mat_seed2.json", gpu)
            message = "holds it already"
        with pytest.raises(SystemExit) as stop:
            reproduce.main([*args, "--results-per-run", "--systems", "mat", "--seeds", "2", *more])
        assert message in str(stop.value.code)
        assert not (tmp_path / "w").exists() and not (tmp_path / "w2").exists()
    with pytest.raises(SystemExit) as stop:
        reproduce.main([*args, "--again", "mat/seed2"])
    assert stop.value.code == 2 and "needs --results-per-run" in capsys.readouterr().err

def cost_files(folder: Path) -> None:
    write(folder / "reproduce_cpu_cost_fp32.json", {"rows": [{"system": "standard", "seconds_per_update": 3.0},
                                                             {"system": "mute", "seconds_per_update": 6.0}]})


def test_estimates_from_the_measured_rate_then_from_finished_runs(tmp_path):
    cost_files(tmp_path)
    updates = 1000
    # nothing finished: rate x updates x OVERHEAD, plus the evaluation (standard: 57.5 + 15; mute: 115 + 15)
    assert reproduce_cost.OVERHEAD == 1.15 and reproduce_cost.EVALUATION_MINUTES == 15.0
    assert reproduce_cost.estimate_minutes("mute", 1000, "fp32", updates, tmp_path) == pytest.approx(130.0)
    assert reproduce_cost.estimate_minutes("weighted", 1000, "fp32", updates, tmp_path) is None
    # bf16 never measured: the fp32 rates
    assert reproduce_cost.estimate_minutes("mute", 1000, "bf16", updates, tmp_path) == pytest.approx(130.0)
    # a finished standard run took 145 minutes where 72.5 were planned: twice the plan for the others too
    finished = run("standard", 1, 30.0, minutes=144.0) | {"precision": "fp32"}
    write(tmp_path / "reproduce_cpu_standard_seed1.json",
          {"settings": {"recipe": "cpu", "max_updates": updates}, "runs": [finished]})
    assert reproduce_cost.estimate_minutes("standard", 1000, "fp32", updates, tmp_path) == pytest.approx(145.0)
    assert reproduce_cost.estimate_minutes("mute", 1000, "fp32", updates, tmp_path) == pytest.approx(260.0)
    assert reproduce_cost.estimate_minutes("mute", 500, "fp32", updates, tmp_path) == pytest.approx(2 * 72.5)


def test_a_finished_run_at_two_threads_counts_its_minutes_on_both_cores(tmp_path):
    cost_files(tmp_path)
    finished = run("standard", 1, 30.0, minutes=71.5) | {"precision": "fp32"}  # 72.5 wall minutes
    write(tmp_path / "reproduce_cpu_standard_seed1.json", {"settings": {"recipe": "cpu", "max_updates": 1000},
                                                          "environment": {"threads": 2}, "runs": [finished]})
    # at one thread: twice its wall minutes (a one-thread run is at most that much slower)
    assert reproduce_cost.estimate_minutes("standard", 1000, "fp32", 1000, tmp_path) == pytest.approx(145.0)
    assert reproduce_cost.estimate_minutes("mute", 1000, "fp32", 1000, tmp_path) == pytest.approx(260.0)
    # at two threads, as it ran
    assert reproduce_cost.estimate_minutes("standard", 1000, "fp32", 1000, tmp_path, threads=2) == pytest.approx(72.5)
    assert reproduce_cost.estimate_minutes("mute", 1000, "fp32", 1000, tmp_path, threads=2) == pytest.approx(130.0)
    write(tmp_path / "reproduce_cpu_standard_seed1.json", {"settings": {"recipe": "cpu", "max_updates": 1000},
                                                          "environment": {"threads": "1"}, "runs": [finished]})
    assert reproduce_cost.estimate_minutes("standard", 1000, "fp32", 1000, tmp_path) == pytest.approx(72.5)
    # a one-thread run does not promise a two-thread run to be faster
    assert reproduce_cost.estimate_minutes("standard", 1000, "fp32", 1000, tmp_path, threads=2) == pytest.approx(72.5)


def cpu_settings(updates: int) -> dict[str, Any]:
    """The settings block of the runner's own calls (the CPU recipe's defaults) at `updates`."""
    return training_settings(vars(reproduce.parse_args(["--recipe", "cpu", "--max-updates", str(updates)])))


def finished_on(folder: Path, seed: int, cpu: tuple[str, tuple[str, ...]], threads: int, wall_minutes: float,
                system: str = "standard", evaluation: float = 1.0, started: str | None = None) -> None:
    """A finished run of `system` and `seed` (1,000 updates) on `cpu` at `threads` threads that took `wall_minutes`,
    the last `evaluation` of them to score and analyse it (its last segment `started` then, where given)."""
    record = run(system, seed, 30.0, minutes=wall_minutes - evaluation) | {"precision": "fp32",
                                                                            "wall_minutes": wall_minutes}
    if started is not None:
        record["segments"] = [{"started": started, "wall_s": 60.0 * (wall_minutes - evaluation), "jobs": 1}]
    write(folder / f"reproduce_cpu_{system}_seed{seed}.json",
          {"settings": cpu_settings(1000),
           "environment": {"threads": threads, "cpu": cpu[0], "cpu_flags": list(cpu[1])}, "runs": [record]})


def test_the_runs_finished_on_this_cpu_calibrate_its_estimates(tmp_path):
    cost_files(tmp_path)
    amd, intel = ("AMD EPYC", ("avx2",)), ("Intel Xeon", ("avx2", "avx512f"))
    finished_on(tmp_path, 1, amd, 1, 145.0)  # 72.5 minutes planned for standard: the AMD took twice that,
    finished_on(tmp_path, 2, intel, 1, 36.25)  # the Intel half
    assert reproduce_cost.estimate_minutes("mute", 1000, "fp32", 1000, tmp_path) == pytest.approx(260.0)
    assert reproduce_cost.estimate_minutes("mute", 1000, "fp32", 1000, tmp_path, amd) == pytest.approx(260.0)
    assert reproduce_cost.estimate_minutes("mute", 1000, "fp32", 1000, tmp_path, intel) == pytest.approx(65.0)
    assert reproduce_cost.estimate_minutes("standard", 1000, "fp32", 1000, tmp_path, intel) == pytest.approx(36.25)
    other = ("Intel Xeon", ("avx2",))  # no run finished on it: every run counts
    assert reproduce_cost.estimate_minutes("standard", 1000, "fp32", 1000, tmp_path, other) == pytest.approx(145.0)


def test_the_plan_gives_the_hours_left_at_each_cpus_pace_where_runs_finished_on_several(tmp_path):
    from bench.reproduce_report import per_cpu_hours

    cost_files(tmp_path)
    write(tmp_path / "reproduce_cpu_curve.json", {"chosen_updates": 1000})
    amd, intel = ("AMD EPYC", ("avx2",)), ("Intel Xeon", ("avx2", "avx512f"))
    finished_on(tmp_path, 1, amd, 1, 145.0)  # twice standard's plan of 72.5 minutes
    assert per_cpu_hours("fp32", 1000, tmp_path) == ""  # one CPU: the plan itself says it
    finished_on(tmp_path, 2, intel, 1, 36.25)  # half of it
    # left with a rate: standard/seed3 and mute seeds 1-3 (130 minutes planned each); the AMD at its own
    # standard's 145 and twice mute's plan, the Intel at 36.25 and half of it
    assert per_cpu_hours("fp32", 1000, tmp_path) == (
        f" At the pace of each CPU's own finished runs, the runs left need about {(145 + 3 * 260) / 60:.0f} on "
        f"AMD EPYC (avx2), about {(36.25 + 3 * 65) / 60:.0f} on Intel Xeon (avx2, avx512f) (core-hours at fp32).")


def test_the_runs_at_the_same_threads_calibrate_the_estimates_at_those_threads(tmp_path):
    cost_files(tmp_path)
    intel = ("Intel Xeon", ("avx2", "avx512f"))
    finished_on(tmp_path, 1, intel, 2, 43.5)  # 0.6 of the one-thread plan
    finished_on(tmp_path, 2, intel, 1, 72.5)  # the plan
    assert reproduce_cost.estimate_minutes("mute", 1000, "fp32", 1000, tmp_path, intel, threads=2) == pytest.approx(78.0)
    assert reproduce_cost.estimate_minutes("mute", 1000, "fp32", 1000, tmp_path, intel, threads=1) == pytest.approx(130.0)
    assert reproduce_cost.estimate_minutes("standard", 1000, "fp32", 1000, tmp_path, intel, threads=2) == pytest.approx(
        43.5)


def test_one_run_slowed_by_other_work_does_not_lengthen_every_estimate(tmp_path):
    cost_files(tmp_path)
    intel = ("Intel Xeon", ("avx2", "avx512f"))
    for seed, minutes in ((1, 36.25), (2, 43.5), (3, 87.0)):  # 0.5, 0.6 and 1.2 of standard's 72.5 planned
        finished_on(tmp_path, seed, intel, 2, minutes)
    estimator = reproduce_cost.Estimator("fp32", 1000, tmp_path)
    assert estimator.minutes("mute", 1000, intel, 2) == pytest.approx(0.6 * 130.0)  # the median ratio
    assert estimator.minutes("standard", 1000, intel, 2) == pytest.approx(43.5)  # its own runs' median
    assert estimator.minutes("standard", 500, intel, 2) == pytest.approx(42.5 / 2 + 1.0)


def test_the_latest_finished_runs_calibrate_the_estimates_when_the_code_got_faster(tmp_path):
    cost_files(tmp_path)
    assert reproduce_cost.RECENT == 3
    intel, amd = ("Intel Xeon", ("avx2", "avx512f")), ("AMD EPYC", ("avx2",))
    # three slow runs (1.2 of standard's 72.5 planned), then three fast ones (0.5), finished in the order of their
    # start dates, not of their file names
    for seed, (minutes, started) in enumerate([(87.0, "2026-11-29T10:00:00"), (87.0, "2026-11-29T12:00:00"),
                                               (36.25, "2026-11-30T08:00:00"), (87.0, "2026-11-29T14:00:00"),
                                               (36.25, "2026-11-30T10:00:00"), (36.25, "2026-11-30T12:00:00")], 1):
        finished_on(tmp_path, seed, intel, 2, minutes, started=started)
    finished_on(tmp_path, 7, amd, 2, 145.0, started="2026-11-28T10:00:00")  # another CPU, older
    # mute's own run, slow and older than the CPU's three latest runs: not what mute takes now
    finished_on(tmp_path, 1, intel, 2, 300.0, system="mute", started="2026-11-29T16:00:00")
    estimator = reproduce_cost.Estimator("fp32", 1000, tmp_path)
    assert estimator.minutes("standard", 1000, intel, 2) == pytest.approx(36.25)  # its own three latest runs
    assert estimator.minutes("mute", 1000, intel, 2) == pytest.approx(0.5 * 130.0)  # their median ratio
    # once it finished among them, its own run says what mute takes
    finished_on(tmp_path, 1, intel, 2, 70.0, system="mute", started="2026-11-30T11:00:00")
    assert reproduce_cost.Estimator("fp32", 1000, tmp_path).minutes("mute", 1000, intel, 2) == pytest.approx(70.0)
    # with no run on the CPU asked about, each CPU's latest three count, and the slowest CPU's median is taken
    assert estimator.minutes("mute", 1000, ("Other", ()), 2) == pytest.approx(2.0 * 130.0)
    assert estimator.minutes("standard", 1000, ("Other", ()), 2) == pytest.approx(145.0)
    # the runs by when they finished, not by their file names
    assert [r["seed"] for r in estimator.calibrating(intel, 2) if r["system"] == "standard"] == [1, 2, 4, 3, 5, 6]


def test_a_runs_scoring_and_analyses_are_estimated_from_the_finished_runs_of_its_system(tmp_path):
    cost_files(tmp_path)
    intel = ("Intel Xeon", ("avx2", "avx512f"))
    assert reproduce_cost.Estimator("fp32", 1000, tmp_path).evaluation_minutes("standard", intel, 2) == 15.0
    finished_on(tmp_path, 1, intel, 2, 43.5, evaluation=1.0)
    finished_on(tmp_path, 1, intel, 2, 50.0, system="drophead", evaluation=6.0)  # the pruning curve's decodes
    estimator = reproduce_cost.Estimator("fp32", 1000, tmp_path)
    assert estimator.evaluation_minutes("standard", intel, 2) == pytest.approx(1.0)
    assert estimator.evaluation_minutes("drophead", intel, 2) == pytest.approx(6.0)
    assert estimator.evaluation_minutes("mute", intel, 2) == pytest.approx(6.0)  # none of its own: the most of any
    assert estimator.evaluation_minutes("drophead", intel, 1) == pytest.approx(12.0)  # on one core, at most twice
    assert estimator.minutes("drophead", 0, intel, 2) == pytest.approx(6.0)  # trained: only its scoring is left
    # a run resumed part way: its system's training minutes for the updates left, then the same scoring; never
    # more than the whole run
    assert estimator.minutes("drophead", 1000, intel, 2) == pytest.approx(50.0)
    assert estimator.minutes("drophead", 250, intel, 2) == pytest.approx(44.0 / 4 + 6.0)


def train_records(steps: range, seconds: dict[int, float]) -> list[dict]:
    """Train records at `steps` whose trainer clock advances by seconds[step] at each (a validation or a slower
    call in between), with a validation record every 250 updates."""
    records, clock = [], 0.0
    for step in steps:
        clock += seconds.get(step, 50.0)
        records.append({"type": "train", "step": step, "elapsed_s": clock})
        if step % 250 == 0:
            records.append({"type": "valid", "step": step, "bleu": 10.0})
    return records


def test_a_trainings_pace_is_its_present_calls_over_its_last_updates():
    # 1 s an update (50 s per 50) and a validation's 30 s after 750; the call that ended at update 600 ran at 3 s
    records = train_records(range(50, 1001, 50), {**{s: 150.0 for s in range(50, 601, 50)}, 800: 80.0})
    assert reproduce_runner.seconds_per_update(records, since=600) == pytest.approx((7 * 50 + 30) / 350)
    assert reproduce_runner.seconds_per_update(records, since=0) == pytest.approx((2 * 150 + 8 * 50 + 30) / 500)
    assert reproduce_runner.seconds_per_update(records, since=800) is None  # 200 updates: no validation yet
    assert reproduce_runner.seconds_per_update(records[:5], since=0) is None  # updates 50 to 250
    assert reproduce_runner.seconds_per_update([], since=0) is None


def test_status_tells_a_training_run_at_its_pace_from_a_paused_one(tmp_path, a_training_process, capsys):
    cost_files(tmp_path)
    write(tmp_path / "reproduce_cpu_curve.json", {"chosen_updates": 3000})
    work = tmp_path / "w"
    records = train_records(range(50, 1001, 50), {})  # 1 s an update
    training_folder(work, "weighted/seed1", records, a_training_process)
    (work / "runs" / "weighted" / "seed1" / "segments.jsonl").write_text(json.dumps({"to_step": 297}) + "\n")
    training_folder(work, "mute/seed1", records, 2 ** 22 + 7)  # its training ended with the runner
    rows = {r["run"]: r for r in reproduce_runner.plan_status(tmp_path, work, seeds=(1,), precision="fp32")["runs"]}
    assert rows["weighted/seed1"]["training"] and not rows["mute/seed1"]["training"]
    assert rows["weighted/seed1"]["minutes_left"] == pytest.approx(2000 / 60 + reproduce_cost.EVALUATION_MINUTES)
    assert rows["mute/seed1"]["minutes_left"] == pytest.approx(
        reproduce_cost.estimate_minutes("mute", 2000, "fp32", 3000, tmp_path))
    before = time.time()
    assert reproduce_runner.main(["--work", str(work), "--out", str(tmp_path), "status"]) == 0
    after = time.time()
    out = capsys.readouterr().out
    assert "  running weighted/seed1: update 1000" in out and "  paused mute/seed1: update 1000" in out
    running, paused = (next(line for line in out.splitlines() if f" {run}: " in line)
                       for run in ("weighted/seed1", "mute/seed1"))
    left = rows["weighted/seed1"]["minutes_left"]
    later = {time.strftime("%H:%M", time.localtime(now + 60 * left)) for now in (before, after)}
    assert running.rsplit("(done about ", 1)[1].rstrip(")") in later and "done about" not in paused



def test_status_shows_a_reported_run_trained_here_again_and_counts_it_done(tmp_path, a_training_process, capsys):
    cost_files(tmp_path)
    write(tmp_path / "reproduce_cpu_curve.json", {"chosen_updates": 3000})
    done = {"system": "mute", "seed": 1, "status": "done", "dir": "/g/runs/mute/seed1"}
    write(tmp_path / "reproduce_cpu_h200_1.json", {"settings": cpu_settings(3000), "runs": [
        done, {**done, "system": "muse", "dir": "/g/runs/muse/seed1"}]})
    work = tmp_path / "w"
    records = train_records(range(50, 1001, 50), {})
    training_folder(work, "mute/seed1", records, a_training_process)  # `--again mute/seed1` training it
    training_folder(work, "muse/seed1", records, None)
    plan = reproduce_runner.plan_status(tmp_path, work, seeds=(1,), precision="fp32")
    rows = {r["run"]: r for r in plan["runs"]}
    assert rows["mute/seed1"]["state"] == "again" and rows["mute/seed1"]["training"]
    assert rows["muse/seed1"]["state"] == "done"  # its folder is the GPU call's leftover: nothing trains it
    assert plan["done"] == 2 and "mute/seed1" not in plan["not_estimated"]
    assert plan["core_hours_left"] == pytest.approx(sum(r["core_minutes_left"] or 0 for r in plan["runs"]
                                                        if r["state"] not in ("done", "again")) / 60)
    assert reproduce_runner.main(["--work", str(work), "--out", str(tmp_path), "status"]) == 0
    out = capsys.readouterr().out
    assert "  running mute/seed1 again (its results came from another device): update 1000" in out
    assert "muse/seed1" not in out

def test_status_gives_a_started_runs_minutes_at_the_runners_threads(tmp_path, capsys):
    cost_files(tmp_path)
    write(tmp_path / "reproduce_cpu_curve.json", {"chosen_updates": 1000})
    finished_on(tmp_path, 2, reproduce_cost.this_cpu(), 2, 43.5)  # at two threads: 0.6 of the one-thread plan
    work = tmp_path / "w"
    training_folder(work, "mute/seed1", train_records(range(50, 501, 50), {}), None)  # paused at update 500
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "work", "--jobs", "1",
                               "--threads", "2"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while b"--threads" not in Path(f"/proc/{runner.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        (work / "runner.pid").write_text(f"{runner.pid}\n")
        assert reproduce_runner.runner_threads(runner.pid) == 2
        assert reproduce_runner.main(["--work", str(work), "--out", str(tmp_path), "status", "--json"]) == 0
        rows = {r["run"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
        # 500 mute updates: 57.5 + 15 planned at one thread, 0.6 of it at two, and twice that on one core
        assert rows["mute/seed1"]["minutes_left"] == pytest.approx(43.5)
        assert rows["mute/seed1"]["core_minutes_left"] == pytest.approx(87.0)
        assert reproduce_runner.main(["--work", str(work), "--out", str(tmp_path), "status"]) == 0
        assert "  paused mute/seed1: update 500, validation BLEU 10.00 at 500, about 44 minutes left at 2 threads" in (
            capsys.readouterr().out)
    finally:
        runner.kill()
        runner.wait()
    assert reproduce_runner.runner_threads(runner.pid) == 1  # gone


def test_start_gives_the_background_job_its_jobs_and_threads(tmp_path, monkeypatch):
    launched = []
    monkeypatch.setattr(reproduce_runner, "launch", lambda command, work: launched.append(command) or 1)
    assert reproduce_runner.main(["--work", str(tmp_path), "start", "--jobs", "1", "--threads", "2"]) == 0
    job = launched[0][launched[0].index("work"):]
    assert job[:5] == ["work", "--jobs", "1", "--threads", "2"]
    args = reproduce_runner.main.__globals__["argparse"].Namespace(jobs=1, threads=2, until=None, work=tmp_path,
                                                                     out=tmp_path, reproduce_args=[])
    ran = []
    monkeypatch.setattr(reproduce_runner, "chosen_cpu_updates", lambda *a: 6250)
    monkeypatch.setattr(reproduce_runner.subprocess, "run",
                        lambda command, **kw: ran.append(command) or subprocess.CompletedProcess(command, 0))
    assert reproduce_runner.work(args) == 0
    command = ran[0]
    assert command[command.index("--jobs") + 1] == "1" and command[command.index("--threads") + 1] == "2"


def test_fill_trains_the_next_runs_part_way_once_no_run_fits(tmp_path, monkeypatch):
    launched = []
    monkeypatch.setattr(reproduce_runner, "launch", lambda command, work: launched.append(command) or 1)
    assert reproduce_runner.main(["--work", str(tmp_path), "start", "--hours", "2", "--fill"]) == 0
    assert "--fill" in launched[0] and "--until" in launched[0]
    with pytest.raises(SystemExit):  # nothing to fill without a deadline
        reproduce_runner.main(["--work", str(tmp_path), "start", "--fill"])
    monkeypatch.setattr(reproduce_runner, "chosen_cpu_updates", lambda *a: 6250)
    namespace = reproduce_runner.main.__globals__["argparse"].Namespace

    def calls(fill: bool, code: int = 0) -> list[list[str]]:
        ran = []
        monkeypatch.setattr(reproduce_runner.subprocess, "run",
                            lambda command, **kw: ran.append(command) or subprocess.CompletedProcess(command, code))
        args = namespace(jobs=1, threads=2, until=time.time() + 3600, fill=fill, work=tmp_path, out=tmp_path,
                         reproduce_args=[])
        assert reproduce_runner.work(args) == code
        return ran

    whole, part = calls(fill=True)  # the runs that fit, then the next ones until the deadline
    assert "--whole-runs" in whole and "--whole-runs" not in part
    assert 59 < float(part[part.index("--budget") + 1]) <= 60
    assert ["--whole-runs" in command for command in calls(fill=False)] == [True]
    assert len(calls(fill=True, code=3)) == 1  # a failed call is not followed by another


def test_status_says_until_when_a_runner_started_with_hours_goes(tmp_path, capsys):
    until = time.mktime((2026, 11, 30, 5, 29, 0, 0, 0, -1))
    for extra, said in (([], "until 05:29\n"), (["--fill"], "until 05:29 (then the next runs part way)\n")):
        runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "work", "--jobs", "1",
                                   "--until", f"{until:.0f}", *extra, "--"], start_new_session=True)
        try:
            deadline = time.monotonic() + 10
            while b"--until" not in Path(f"/proc/{runner.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert reproduce_runner.runner_deadline(runner.pid).endswith(said.strip())
            (tmp_path / "runner.pid").write_text(f"{runner.pid}\n")
            assert reproduce_runner.main(["--work", str(tmp_path), "--out", str(tmp_path), "status"]) == 0
            assert capsys.readouterr().out.startswith(f"runner: going, pid {runner.pid}, {said}")
        finally:
            runner.kill()
            runner.wait()
    assert reproduce_runner.runner_deadline(runner.pid) == ""  # gone


def test_plan_status_counts_runs_done_running_and_left(tmp_path):
    cost_files(tmp_path)
    updates = 3000
    write(tmp_path / "reproduce_cpu_curve.json", {"chosen_updates": updates})
    settings = cpu_settings(updates)
    done = {"system": "standard", "seed": 1, "status": "done", "dir": "/w/runs/standard/seed1"}
    write(tmp_path / "reproduce_cpu_standard_seed1.json", {"settings": settings, "runs": [done]})
    # a GPU call's one file: its finished runs count, its unfinished ones do not; a file of other settings does not
    write(tmp_path / "reproduce_cpu_h200_1.json", {
        "settings": {**settings, "overrides": ["train.graphs=auto"]},
        "runs": [{**done, "system": "muse", "dir": "/g/runs/muse/seed1"},
                 {**done, "system": "weighted", "dir": "/g/runs/weighted/seed1", "status": "unfinished"}]})
    write(tmp_path / "reproduce_cpu_longer.json", {"settings": {**settings, "max_updates": updates + 1},
                                                   "runs": [{**done, "system": "mat", "dir": "/l/runs/mat/seed1"}]})
    metrics = tmp_path / "w" / "runs" / "mute" / "seed1" / "train" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    metrics.write_text('{"type": "train", "step": 100}\n{"type": "valid", "step": 250}\n')
    plan = reproduce_runner.plan_status(tmp_path, tmp_path / "w", seeds=(1,), precision="fp32")
    states = {r["run"]: r for r in plan["runs"]}
    assert states["standard/seed1"]["state"] == "done" and states["mute/seed1"]["state"] == "running"
    assert states["muse/seed1"]["state"] == "done"
    assert states["weighted/seed1"]["state"] == states["mat/seed1"]["state"] == "left"
    assert states["mute/seed1"]["update"] == 250 and not states["mute/seed1"]["scoring"]
    assert plan["done"] == 2 and plan["left"] == len(RECIPES["cpu"].table_systems) - 2
    mute_left = (updates - 250) * 6.0 * reproduce_cost.OVERHEAD / 60 + reproduce_cost.EVALUATION_MINUTES
    assert states["mute/seed1"]["minutes_left"] == pytest.approx(mute_left)
    assert "weighted/seed1" in plan["not_estimated"] and "standard/seed1" not in plan["not_estimated"]
    (tmp_path / "w" / "runs" / "mat" / "seed1" / "train").mkdir(parents=True)  # started, no update logged yet
    write(tmp_path / "w" / "runs" / "mute" / "seed1" / "trained.json", {"stop": "max_steps", "step": updates})
    states = {r["run"]: r for r in reproduce_runner.plan_status(tmp_path, tmp_path / "w", seeds=(1,),
                                                                  precision="fp32")["runs"]}
    assert (states["mat/seed1"]["state"], states["mat/seed1"]["update"]) == ("running", None)
    assert states["mute/seed1"]["scoring"] and states["drophead/seed1"]["state"] == "left"
    # the validation curve's run is the standard run of its seed: trained, only its scoring is left
    write(tmp_path / "reproduce_cpu_curve.json", {"chosen_updates": updates, "system": "standard", "seed": 2})
    plan = reproduce_runner.plan_status(tmp_path, tmp_path / "w", seeds=(1, 2), precision="fp32")
    states = {r["run"]: r for r in plan["runs"]}
    assert states["standard/seed2"]["state"] == "trained" and states["drophead/seed2"]["state"] == "left"
    assert states["standard/seed2"]["minutes_left"] == pytest.approx(reproduce_cost.EVALUATION_MINUTES)


def test_status_shows_a_running_runs_validation_beside_the_standard_model_at_that_update(tmp_path, capsys):
    cost_files(tmp_path)
    write(tmp_path / "reproduce_cpu_curve.json", {"chosen_updates": 3000})
    standard = run("standard", 1, 30.0) | {"curve": {"valid": [{"step": 250, "bleu": 20.0},
                                                                {"step": 500, "bleu": 25.5}]}}
    write(tmp_path / "reproduce_cpu_standard_seed1.json", {"settings": {"recipe": "cpu"}, "runs": [standard]})
    train = tmp_path / "w" / "runs" / "mute" / "seed1" / "train"
    train.mkdir(parents=True)
    (train / "metrics.jsonl").write_text('{"type": "valid", "step": 250, "bleu": 18.0}\n'
                                         '{"type": "valid", "step": 500, "bleu": 24.25}\n'
                                         '{"type": "train", "step": 600, "loss": 3.0}\n')
    row = next(r for r in reproduce_runner.plan_status(tmp_path, tmp_path / "w", seeds=(1,), precision="fp32")["runs"]
               if r["run"] == "mute/seed1")
    assert row["update"] == 600 and row["valid"] == {"step": 500, "bleu": 24.25, "standard_bleu": 25.5}
    assert reproduce_runner.main(["--work", str(tmp_path / "w"), "--out", str(tmp_path), "status"]) == 0
    assert "paused mute/seed1: update 600, validation BLEU 24.25 at 500 (standard, seed 1: 25.50)" in \
        capsys.readouterr().out
    (train / "metrics.jsonl").write_text('{"type": "train", "step": 100, "loss": 5.0}\n')  # before its first validation
    row = next(r for r in reproduce_runner.plan_status(tmp_path, tmp_path / "w", seeds=(1,), precision="fp32")["runs"]
               if r["run"] == "mute/seed1")
    assert row["valid"] is None


def training_folder(work: Path, run: str, records: list[dict], pid: int | None) -> Path:
    """WORK/runs/RUN/train with a metrics log, a config validating every 250 updates and a lock file naming `pid`."""
    train = work / "runs" / run / "train"
    train.mkdir(parents=True)
    (train / "config.yaml").write_text("train:\n  valid_every: 250\n")
    (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if pid is not None:
        (train / ".train.lock").write_text(f"process {pid}\n")
    return train


@pytest.fixture
def a_training_process():
    """A live process whose command line names `train`, as `multibranch train`'s does."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "train"], start_new_session=True)
    deadline = time.monotonic() + 10
    while b"train" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)  # Popen can return before the new command line is in place
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroup scheduling on this kernel")
def test_the_runner_runs_in_a_group_of_its_own_at_the_lowest_priority(tmp_path):
    # A process in the kernel's default group reads an empty file here; one in a session's group reads its nice value.
    callers_group = Path("/proc/self/autogroup").read_text()
    pid = reproduce_runner.launch([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path)
    try:
        assert reproduce_runner.running_pid(tmp_path) == pid
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # setsid: its own process group and session
        assert Path(f"/proc/{pid}/autogroup").read_text().split()[-1] == "19"
        assert os.getpriority(os.PRIO_PROCESS, pid) == 19
        assert Path("/proc/self/autogroup").read_text() == callers_group  # the caller's group is untouched
        assert reproduce_runner.main(["--work", str(tmp_path), "stop"]) == 0
        assert reproduce_runner.running_pid(tmp_path) is None and not reproduce_runner.group_alive(pid)
    finally:
        try:
            os.killpg(pid, 9)
        except OSError:
            pass


def stats(correct: int, lines: int = 40) -> list[list[float]]:
    """Per-line BLEU statistics of a system whose first `correct` lines are right (4-word lines)."""
    right, wrong = [4, 4, 4, 3, 2, 1, 4, 3, 2, 1], [4, 4, 1, 0, 0, 0, 4, 3, 2, 1]
    return [list(map(float, right if i < correct else wrong)) for i in range(lines)]


def cpu_results(records: list[dict], device: str = "cpu") -> dict:
    data = results(records)
    data["settings"]["recipe"] = "cpu"
    data["environment"] = {"gpu": None, "device": device, "commit": "0123456789abcdef"}
    if device == "cuda":
        data["environment"]["gpu"] = "NVIDIA H200"
    return data


def test_the_cpu_table_takes_p_values_from_line_statistics_and_shows_dominant_heads_and_devices(tmp_path):
    base, better = stats(10), stats(30)
    standard = run("standard", 1, 30.0, analyses={"pruning": {"dominant_heads": {"mean_dominant_delta": {
        "encoder_self": -2.0, "decoder_self": -1.0, "cross": -4.0}}}})
    standard["test"]["avg"]["bleu_sentence_stats"] = base
    drophead = run("drophead", 1, 31.0, analyses={"pruning": {"dominant_heads": {"mean_dominant_delta": {
        "encoder_self": -0.5, "decoder_self": -0.25, "cross": -1.0}}}})
    drophead["test"]["avg"]["bleu_sentence_stats"] = better
    first = write(tmp_path / "reproduce_cpu_a.json", cpu_results([standard, drophead]))
    gpu_standard = run("standard", 1, 30.6)
    second = write(tmp_path / "reproduce_cpu_b.json", cpu_results([gpu_standard], device="cuda"))
    from bench.reproduce_results import load_results

    merged = merge([load_results(first), load_results(second)])
    assert merged.recipe == "cpu" and list(merged.other_device) == ["standard/seed1"]
    assert merged.runs["standard/seed1"]["test"]["avg"]["bleu"] == 30.0  # the table keeps the first device's
    rows = summaries(merged, None)
    (p,) = next(r for r in rows if r["system"] == "drophead")["p_values"]
    assert p["from"] == "computed"
    assert p["p_value"] == pytest.approx(paired_bootstrap_statistics(base, better)["p_value"])
    region = docs_region(merged.files, rows, [], merged)
    assert "| standard | 1 | -2.00 | -1.00 | -4.00 |" in region
    assert "| drophead | 1 | -0.50 | -0.25 | -1.00 |" in region
    assert "| standard/seed1 | 30.00 (CPU) | 30.60 (GPU) | +0.60 | – |" in region  # one seed: no spread yet
    assert set(table_runs(merged)) == {"standard", "drophead"}
    assert "Trained by another script" not in region
    standard.update(trained_by="bench/reproduce_curve.py (the standard model's validation curve)", train_threads=2)
    first = write(tmp_path / "reproduce_cpu_a.json", cpu_results([standard, drophead]))
    merged = merge([load_results(first)])
    region = docs_region(merged.files, summaries(merged, None), [], merged)
    assert "`standard/seed1` (bench/reproduce_curve.py (the standard model's validation curve), 2 threads)" in \
        " ".join(region.split())


def test_the_report_rewrites_each_recipes_region_and_the_plan(tmp_path):
    doc = tmp_path / "reproduction.md"
    doc.write_text("<!-- reproduce-plan:start -->\n<!-- reproduce-plan:end -->\n"
                   "<!-- reproduce-report:start -->\n<!-- reproduce-report:end -->\n"
                   "<!-- reproduce-report:cpu:start -->\nold\n<!-- reproduce-report:cpu:end -->\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "bench/reproduce_report.py", "--docs", str(doc), "--images",
                           str(tmp_path / "img"), str(write(tmp_path / "reproduce_cpu_x.json",
                                                            cpu_results([run("standard", 1, 30.0)])))],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = doc.read_text()
    cpu = text.split("<!-- reproduce-report:cpu:start -->")[1].split("<!-- reproduce-report:cpu:end -->")[0]
    assert "| standard |" in cpu and "old" not in cpu and "../img/cpu_valid_curves.png" not in cpu
    assert "img/cpu_valid_curves.png" in cpu and (tmp_path / "img" / "cpu_valid_curves.png").is_file()
    iwslt = text.split("<!-- reproduce-report:start -->")[1].split("<!-- reproduce-report:end -->")[0]
    assert "No GPU call has finished a run yet" in iwslt
    plan = text.split("<!-- reproduce-plan:start -->")[1].split("<!-- reproduce-plan:end -->")[0]
    assert plan.strip().startswith("CPU recipe")  # its numbers are bench/results' (the page's own check)
    # the standard model's validation curve (bench/results/reproduce_cpu_curve.json) is drawn beside the plan
    assert "](img/cpu_validation_curve.png)" in plan and (tmp_path / "img" / "cpu_validation_curve.png").is_file()


def summary(system: str, deltas: list[float], ps: list[float | None]) -> dict:
    return {"system": system, "p_values": [{"seed": i + 1, "p_value": p} for i, p in enumerate(ps)],
            "delta_bleu_to_standard": {"mean": sum(deltas) / len(deltas), "sd": None, "values": deltas,
                                       "seeds": list(range(1, len(deltas) + 1))},
            "paper_claim": {"claim": "+0.7 BLEU"}}


def test_verdicts_need_significance_on_every_seed_in_one_direction():
    from bench.reproduce_report import verdict, verdict_line

    assert verdict(summary("drophead", [0.5, 0.7, 0.6], [0.01, 0.02, 0.001])) == "reproduced"
    assert verdict(summary("drophead", [0.5, 0.7, 0.6], [0.01, 0.2, 0.001])) == "not visible at this shape"
    assert verdict(summary("drophead", [0.5, -0.1, 0.6], [0.01, 0.02, 0.001])) == "not visible at this shape"
    assert verdict(summary("mute", [-1.0, -0.8, -1.2], [0.001, 0.01, 0.003])) == "the opposite"
    assert verdict(summary("mute", [-1.0], [None])) == "not visible at this shape"
    assert verdict(summary("standard", [0.0], [1.0])) is None
    line = verdict_line(summary("drophead", [0.5, 0.7], [0.01, 0.02]))
    assert line == ("- `drophead`: Δ +0.60 BLEU (p 0.010, 0.020): **reproduced** so far (2 of 3 seeds). "
                    "The paper: +0.7 BLEU.")


def test_a_p_value_over_the_seeds_together_decides_the_verdict_where_there_is_one():
    from bench.reproduce_report import verdict, verdict_line

    weak = summary("drophead", [0.5, 0.7, 0.6], [0.2, 0.3, 0.1])
    assert verdict(weak) == "not visible at this shape"  # no seed significant on its own
    weak["pooled_p_value"] = {"p_value": 0.01, "seeds": [1, 2, 3]}
    assert verdict(weak) == "reproduced"
    assert verdict_line(weak) == ("- `drophead`: Δ +0.60 BLEU (p 0.010 over the seeds, 0.200, 0.300, 0.100 per seed): "
                                  "**reproduced**. The paper: +0.7 BLEU.")
    strong = summary("drophead", [0.5, 0.7, 0.6], [0.01, 0.02, 0.001])
    strong["pooled_p_value"] = {"p_value": 0.2, "seeds": [1, 2, 3]}
    assert verdict(strong) == "not visible at this shape"  # the test over the seeds together decides
    mixed = summary("mute", [-1.0, 0.2, -1.2], [0.001, 0.5, 0.003])
    mixed["pooled_p_value"] = {"p_value": 0.001, "seeds": [1, 2, 3]}
    assert verdict(mixed) == "not visible at this shape"  # significant, but the seeds disagree on the sign


def test_the_p_value_over_the_seeds_comes_from_every_seeds_line_statistics(tmp_path):
    from bench.reproduce_report import p_cell
    from bench.reproduce_results import BOOTSTRAP_SAMPLES, load_results

    records, base_stats, mine_stats = [], [], []
    for seed, (base_right, mine_right) in enumerate([(10, 14), (12, 13), (11, 16)], start=1):
        standard, drophead = run("standard", seed, 30.0), run("drophead", seed, 30.5)
        standard["test"]["avg"]["bleu_sentence_stats"] = stats(base_right)
        drophead["test"]["avg"]["bleu_sentence_stats"] = stats(mine_right)
        records += [standard, drophead]
        base_stats.append(stats(base_right))
        mine_stats.append(stats(mine_right))
    merged = merge([load_results(write(tmp_path / "reproduce_cpu_a.json", cpu_results(records)))])
    row = next(r for r in summaries(merged, None) if r["system"] == "drophead")
    expected = paired_bootstrap_replicates(base_stats, mine_stats, samples=BOOTSTRAP_SAMPLES)["p_value"]
    assert row["pooled_p_value"] == {"p_value": pytest.approx(expected), "seeds": [1, 2, 3]}
    per_seed = [paired_bootstrap_statistics(b, m, samples=BOOTSTRAP_SAMPLES)["p_value"]
                for b, m in zip(base_stats, mine_stats, strict=True)]
    assert p_cell(row) == f"{expected:.3f}; " + ", ".join(f"{p:.3f}" for p in per_seed)

    del records[-1]["test"]["avg"]["bleu_sentence_stats"]  # one run without statistics: no test over the seeds
    records[-1]["compare_to_standard"] = compared(30.0, 30.5, 0.04)
    merged = merge([load_results(write(tmp_path / "reproduce_cpu_a.json", cpu_results(records)))])
    row = next(r for r in summaries(merged, None) if r["system"] == "drophead")
    assert row["pooled_p_value"] is None and p_cell(row).endswith(", 0.040")
    one_seed = merge([load_results(write(tmp_path / "reproduce_cpu_a.json", cpu_results(records[:2])))])
    assert next(r for r in summaries(one_seed, None) if r["system"] == "drophead")["pooled_p_value"] is None


def test_mute_is_also_compared_with_the_paper_baseline_layout(tmp_path):
    """The MUTE paper measures its gain against OpenNMT-py's layout, which its MUTE models share (pre-norm, ReLU
    dropout): `standard-prenorm` has it, and the report gives the mute rows' Δ against it beside the table's."""
    from bench.reproduce_report import verdict_line
    from bench.reproduce_results import BOOTSTRAP_SAMPLES, load_results

    for preset in ("mute-tiny", "mute-bias-tiny", "mute-bias-seq-tiny"):
        model = load_preset_dict(preset)["model"]
        assert {key: model[key] for key in ONMT_LAYOUT} == ONMT_LAYOUT
    assert deep_merge(BASE, system_delta("standard-prenorm", 3000, recipe="cpu")["model"]) == {**BASE, **ONMT_LAYOUT}
    records, base_stats, mine_stats = [], [], []
    for seed, (base_right, mine_right) in enumerate([(10, 14), (12, 13)], start=1):
        standard, prenorm, mute = run("standard", seed, 30.0), run("standard-prenorm", seed, 29.0), \
            run("mute-bias-seq", seed, 30.5 + seed)
        prenorm["test"]["avg"]["bleu_sentence_stats"] = stats(base_right)
        mute["test"]["avg"]["bleu_sentence_stats"] = stats(mine_right)
        records += [standard, prenorm, mute]
        base_stats.append(stats(base_right))
        mine_stats.append(stats(mine_right))
    merged = merge([load_results(write(tmp_path / "reproduce_cpu_a.json", cpu_results(records)))])
    rows = {r["system"]: r for r in summaries(merged, None)}
    other = rows["mute-bias-seq"]["second_baseline"]
    expected = paired_bootstrap_replicates(base_stats, mine_stats, samples=BOOTSTRAP_SAMPLES)["p_value"]
    assert other["system"] == "standard-prenorm" and other["delta_bleu"]["values"] == [2.5, 3.5]
    assert other["p_value"] == {"p_value": pytest.approx(expected), "seeds": [1, 2]}
    assert rows["mute-bias-seq"]["delta_bleu_to_standard"]["values"] == [1.5, 2.5]
    assert rows["standard-prenorm"]["second_baseline"] is None and rows["standard"]["second_baseline"] is None
    line = verdict_line(rows["mute-bias-seq"])
    assert line.endswith(f"Against `standard-prenorm`, the baseline layout of the paper's own comparison: Δ +3.00 ± 0.71 "
                         f"BLEU (p {expected:.3f}, seeds together; seeds 1, 2).")


def test_a_delta_over_fewer_seeds_than_its_row_says_which(tmp_path):
    """A seed whose standard model has not finished has no Δ yet: the row's Δ names the seeds it covers."""
    from bench.reproduce_report import table_cells
    from bench.reproduce_results import load_results

    records = [run("standard", 1, 30.0), run("weighted", 1, 28.0), run("weighted", 2, 29.0)]
    merged = merge([load_results(write(tmp_path / "reproduce_cpu_a.json", cpu_results(records)))])
    rows = {r["system"]: r for r in summaries(merged, None)}
    assert table_cells(rows["weighted"])[6] == "-2.00 (seed 1)"
    records.append(run("standard", 2, 30.0))
    merged = merge([load_results(write(tmp_path / "reproduce_cpu_a.json", cpu_results(records)))])
    rows = {r["system"]: r for r in summaries(merged, None)}
    assert table_cells(rows["weighted"])[6] == "-1.50 ± 0.71"


def test_the_combination_is_also_compared_with_mat_alone(tmp_path):
    """MAT + DropHead against `mat` of the same seed: what Scheduled DropHead adds to MAT, beside its Δ to
    `standard`; a system without a second baseline row gets none."""
    from bench.reproduce_report import verdict_line
    from bench.reproduce_results import BOOTSTRAP_SAMPLES, load_results

    standard, mat, combined = run("standard", 1, 30.0), run("mat", 1, 31.0), run("mat-drophead", 1, 31.75)
    mat["test"]["avg"]["bleu_sentence_stats"] = stats(10)
    combined["test"]["avg"]["bleu_sentence_stats"] = stats(16)
    merged = merge([load_results(write(tmp_path / "reproduce_cpu_a.json", cpu_results([standard, mat, combined])))])
    rows = {r["system"]: r for r in summaries(merged, None)}
    other = rows["mat-drophead"]["second_baseline"]
    expected = paired_bootstrap_replicates([stats(10)], [stats(16)], samples=BOOTSTRAP_SAMPLES)["p_value"]
    assert other["system"] == "mat" and other["delta_bleu"]["values"] == [0.75]
    assert other["p_value"] == {"p_value": pytest.approx(expected), "seeds": [1]}
    assert rows["mat-drophead"]["delta_bleu_to_standard"]["values"] == [1.75]
    assert rows["mat"]["second_baseline"] is None
    assert verdict_line(rows["mat-drophead"]).endswith(
        f"Against `mat`, MAT alone, to which it adds Scheduled DropHead: Δ +0.75 BLEU (p {expected:.3f}; seeds 1).")


def test_the_standard_models_training_does_not_read_the_update_cap(tiny_data, tmp_path):
    """The premise of taking the validation curve's run over as the table's standard run: capped at 20 updates and
    paused at 8, the recipe's schedule (inverse square root) gives the same updates as a run of 8."""
    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions
    from tests.helpers.configs import tiny_experiment

    lr = load_preset_dict(RECIPES["cpu"].base_preset)["train"]["lr"]
    assert lr["schedule"] == "inverse_sqrt"
    settings = {"lr": {**lr, "warmup": 3}, "valid_every": 4, "deterministic": True}
    train(tiny_experiment(max_steps=8, **settings), RunOptions(tiny_data, tmp_path / "eight", device="cpu"))
    train(tiny_experiment(max_steps=20, **settings),
          RunOptions(tiny_data, tmp_path / "capped", device="cpu", stop_at_step=8))
    eight, capped = (load_checkpoint(tmp_path / name / "last.pt")["model"] for name in ("eight", "capped"))
    assert all(eight[k].equal(capped[k]) for k in eight)


def _curve_run(work: Path, steps: list[int], *, seed: int = 1) -> Path:
    """A validation-curve folder as bench/reproduce_curve.py leaves it (placeholder checkpoint files)."""
    from bench.reproduce_curve import curve_config

    train = work / "curve" / "train"
    (train / "checkpoints").mkdir(parents=True)
    (work / "curve" / "config.yaml").write_text(json.dumps(curve_config(8000, seed)), encoding="utf-8")
    for step in steps:
        (train / "checkpoints" / f"step_{step:08d}.pt").write_text(str(step), encoding="utf-8")
    (train / "last.pt").write_text("last", encoding="utf-8")
    (train / ".last.pt.x1.tmp").write_text("a temporary", encoding="utf-8")
    records = [{"type": "train", "step": s, "elapsed_s": 6.0 * s} for s in range(50, steps[-1] + 1, 50)]
    (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return train


def _harness(tmp_path: Path, *more: str) -> reproduce.Harness:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return reproduce.Harness(reproduce.parse_args(["--recipe", "cpu", "--max-updates", "1500", "--results-per-run",
                                                   "--out", str(out), "--work", str(tmp_path / "w"), *more]))


def test_the_validation_curves_run_is_taken_over_as_the_standard_run_of_its_seed(tmp_path):
    curve = _curve_run(tmp_path / "w", [500, 750, 1000, 1250, 1500])
    (tmp_path / "out").mkdir()
    write(tmp_path / "out" / "reproduce_cpu_curve.json", {"environment": {"threads": 2}, "chosen_updates": 1500})
    harness = _harness(tmp_path, "--set", "train.graphs=auto")  # how a run is computed: still the same training
    run_ = reproduce.Run("standard", 1)
    folder = harness.run_dir(run_)
    assert harness.train(run_, folder, folder / "harness.log") == "trained"  # no training started (no CLI call)
    train = folder / "train"
    assert sorted(p.name for p in (train / "checkpoints").iterdir()) == [
        f"step_{s:08d}.pt" for s in (500, 750, 1000, 1250, 1500)]
    assert (train / "last.pt").samefile(curve / "last.pt") and not list(train.glob(".*"))
    trained = json.loads((folder / "trained.json").read_text())
    assert trained["step"] == 1500 and trained["train_threads"] == 2 and "reproduce_curve" in trained["trained_by"]
    record = harness.run_record(run_)
    assert record["trained_by"] == trained["trained_by"] and record["segments"][0]["wall_s"] == 9000.0


@pytest.mark.parametrize("system", ["mat", "mat-drophead"])
def test_the_cpu_recipes_mat_systems_train_at_the_rho_asked_for(tmp_path, system):
    """MAT from scratch is outside the IWSLT grid's MAT_SYSTEMS: --rho still sets its drop-branch rate."""
    run_ = reproduce.Run(system, 1)
    for rho, args in ((RECIPES["cpu"].rho, ()), (0.3, ("--rho", "0.3"))):
        model = _harness(tmp_path, *args).run_config(run_)["config"]["model"]
        assert model["encoder"]["drop_branch"] == model["decoder"]["drop_branch"] == rho
        assert model["encoder"]["attention_branches"] == 2


@pytest.mark.parametrize(("case", "steps", "args", "seed"), [
    ("another seed", [500, 750, 1000, 1250, 1500], (), 2),
    ("trained past the table's updates", [750, 1000, 1250, 1500, 1750], (), 1),
    ("short of them", [250, 500, 750, 1000, 1250], (), 1),
    ("a checkpoint off the validations", [750, 1000, 1250, 1311, 1500], (), 1),
    ("another setting", [500, 750, 1000, 1250, 1500], ("--set", "train.lr.lr=0.002"), 1),
])
def test_a_curve_run_that_is_not_the_same_training_is_left_alone(tmp_path, case, steps, args, seed):
    _curve_run(tmp_path / "w", steps, seed=seed)
    harness = _harness(tmp_path, *args)
    run_ = reproduce.Run("standard", 1)
    train = harness.run_dir(run_) / "train"
    assert not harness.adopt_curve_run(run_, harness.run_config(run_), train), case
    assert not train.exists()
    drophead = reproduce.Run("drophead", 1)
    assert not harness.adopt_curve_run(drophead, harness.run_config(drophead), harness.run_dir(drophead) / "train")


def test_the_current_update_counts_pauses_and_interrupts_that_saved_last_pt_alone(tmp_path):
    train = tmp_path / "train"
    (train / "checkpoints").mkdir(parents=True)
    assert reproduce.Harness.current_step(train) == 0
    for step in (250, 500):
        (train / "checkpoints" / f"step_{step:08d}.pt").write_bytes(b"")
    assert reproduce.Harness.current_step(train) == 500
    (train / "train.log").write_text(
        "x | INFO | training stopped at update 520: paused at update 520 (--stop-at-step); continue with --resume\n"
        "x | INFO | training interrupted at update 611; last.pt saved\n", encoding="utf-8")
    assert reproduce.Harness.current_step(train) == 611
    (train / "train.log").write_text("x | INFO | training stopped at update 400: reached max_minutes=3\n")
    assert reproduce.Harness.current_step(train) == 500  # an end validates, so its step checkpoint is there


def test_a_training_call_stopped_by_a_signal_is_recorded_and_its_minutes_counted(tmp_path, monkeypatch):
    """The runner's stop ends a training mid-run: its segment is still written, and the run's wall minutes come
    from the trainer's own clock (kept across resumes), not from the segments that ended on their own."""
    harness = _harness(tmp_path)
    run_ = reproduce.Run("standard", 2)
    folder = harness.run_dir(run_)
    folder.mkdir(parents=True)
    train = folder / "train"
    calls = []

    def fake_cli(args, log, *, check=True):  # a training of 1,500 updates, stopped at 600 the first time
        calls.append(args)
        (train / "checkpoints").mkdir(parents=True, exist_ok=True)
        first = len(calls) == 1
        end = 600 if first else 1500
        records = [{"type": "train", "step": s, "elapsed_s": 4.0 * s} for s in range(100, end + 1, 100)]
        (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        (train / "last.pt").write_text("last", encoding="utf-8")
        if not first:  # the last update validates and keeps its step checkpoint
            (train / "checkpoints" / f"step_{end:08d}.pt").write_text("step", encoding="utf-8")
        with (train / "train.log").open("a", encoding="utf-8") as handle:
            handle.write(f"training interrupted at update {end}; last.pt saved\n" if first
                         else f"training stopped at update {end}: reached max_steps=1500\n")
        if first:
            raise RuntimeError("`multibranch train ...` failed (143)")

    monkeypatch.setattr(harness, "cli", fake_cli)
    with pytest.raises(RuntimeError):
        harness.train(run_, folder, folder / "harness.log")
    assert harness.train(run_, folder, folder / "harness.log") == "trained"
    assert "--resume" in calls[1] and "--resume" not in calls[0]
    segments = [json.loads(line) for line in (folder / "segments.jsonl").read_text().splitlines()]
    assert [(s["from_step"], s["to_step"], s["resume"], s["stop"]) for s in segments] == [
        (0, 600, False, "interrupted or failed"), (600, 1500, True, "reached max_steps=1500")]
    record = harness.run_record(run_)
    assert record["train_minutes"] == pytest.approx(4.0 * 1500 / 60)
    assert record["wall_minutes"] == pytest.approx(4.0 * 1500 / 60)  # not the segments' few milliseconds


def test_sigterm_ends_the_harness_through_its_cleanup(tmp_path):
    """SIGTERM reaches the harness as SystemExit, so that `finally` blocks (a run's segment record) run."""
    script = tmp_path / "term.py"
    script.write_text(
        "import os, signal, sys, time\n"
        f"sys.path.insert(0, {str(reproduce.ROOT)!r})\n"
        "from bench import reproduce\n"
        "signal.signal(signal.SIGTERM, reproduce.stop_on_sigterm)\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(5)\n"
        "finally:\n"
        "    print('cleaned up')\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + signal.SIGTERM and "cleaned up" in done.stdout


def test_an_analysis_added_later_goes_into_the_runs_results_file_which_keeps_its_training_record(tmp_path, monkeypatch):
    harness = _harness(tmp_path)
    monkeypatch.setattr(harness, "run_environment", lambda: {"commit": "analysed-by"})
    run_ = reproduce.Run("weighted", 1)
    folder = harness.run_dir(run_)
    folder.mkdir(parents=True)
    gates = {"branch_weights": [{"kappa": [0.5, 0.5], "alpha": [0.5, 0.5]}], "wall_s": 2.0}
    replacement = {"learned": {"bleu": 30.0}, "uniform": {"bleu": 29.0}, "wall_s": 60.0}
    write(folder / "analyses.json", {"gates": gates, "replacement": replacement})
    path = tmp_path / "out" / f"{harness.run_results_name(run_)}.json"
    record = {"system": "weighted", "seed": 1, "dir": str(folder), "status": "done", "wall_minutes": 70.0,
              "analyses": {"gates": gates}}
    write(path, {"environment": {"commit": "trained-by", "threads": 2}, "runs": [record]})
    assert harness.add_analyses(run_, folder)
    data = json.loads(path.read_text())
    assert data["environment"] == {"commit": "trained-by", "threads": 2}  # the training's, as written
    (after,) = data["runs"]
    assert after["wall_minutes"] == 70.0 and after["analyses"]["gates"] == gates  # no commit on what it had
    assert after["analyses"]["replacement"] == {**replacement, "commit": "analysed-by"}
    other = reproduce.Run("weighted", 2)  # no results file of its own: the caller writes one
    assert not harness.add_analyses(other, harness.run_dir(other))
