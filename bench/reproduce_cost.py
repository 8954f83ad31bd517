"""What a run of the CPU recipe costs on this machine: CPU seconds per update of each system at one thread,
and the planning estimate of a whole run built from it.

    python bench/reproduce_cost.py [--systems SYSTEM ...] [--updates 40] [--jobs 2] [--data DIR]

trains every CPU-recipe system (bench/reproduce_systems.py, the `-tiny` presets) for --updates updates, --jobs
at a time, one thread each, and writes bench/results/reproduce_cpu_cost_<precision>.json: per system the CPU
seconds per update after the first 10 (the rate of a long run on a core of its own; CPU time, so that other
work on the machine does not enter it; the wall seconds are kept beside), the parameters, and the environment
(CPU model and flags, precision, load). bf16 is the precision where the CPU computes it natively (the recipe's
`amp: auto`), else fp32.

`Estimator` (`estimate_minutes` for one run) turns it into the wall minutes a whole run takes at a given number
of threads: a finished run of the same system, precision and threads in bench/results says it (its training wall
minutes, in proportion to the updates left, and its evaluation's); otherwise the plan (the measured rate times
the updates times OVERHEAD, plus EVALUATION_MINUTES) times the ratio of actual to planned minutes that finished
runs of other systems show, where there are any: the median of each CPU's RECENT latest runs (the code gets
faster), the slowest CPU's where there are several (`slowest_median`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench.common import cpu_model, cpu_native_bf16, environment  # noqa: E402
from bench.reproduce_systems import RECIPES, system_delta  # noqa: E402
from multibranch.json_file import write_json  # noqa: E402

RESULTS = ROOT / "bench" / "results"
RECENT = 3  # the finished runs that calibrate an estimate: the latest ones (the code gets faster, old runs lag)
OVERHEAD = 1.15  # validation every 250 updates, at the rate of the first finished runs' before they existed
EVALUATION_MINUTES = 15.0  # averaging, two test translations, the analyses (the pruning curve's ~50 decodes)
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def command_line() -> str:
    """This process's command, as run from the checkout (its paths relative to it)."""
    return " ".join(["python", *sys.argv]).replace(f"{ROOT}{os.sep}", "")


def cpu_flags() -> list[str]:
    """The CPU's flags that decide its training speed and precision (/proc/cpuinfo), in CPU_FLAGS order."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [flag for flag in CPU_FLAGS if flag in flags]


def cpu_precision(amp: str = "auto") -> str:
    """The precision a CPU run of autocast setting `amp` trains in here: "bf16" or "fp32"."""
    return "bf16" if amp == "bf16" or (amp == "auto" and cpu_native_bf16()) else "fp32"


def cost_file(precision: str, folder: Path = RESULTS) -> Path:
    return folder / f"reproduce_cpu_cost_{precision}.json"


def load_rates(precision: str, folder: Path = RESULTS) -> dict[str, float]:
    """Seconds per update per system at `precision` (the fp32 file where none was measured at bf16: slower, so
    the plan errs on the safe side)."""
    for candidate in (precision, "fp32"):
        path = cost_file(candidate, folder)
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            return {row["system"]: row["seconds_per_update"] for row in data["rows"]}
    return {}


def finished_runs(precision: str, max_updates: int, folder: Path = RESULTS) -> list[dict[str, Any]]:
    """The finished CPU-recipe runs in `folder` trained at `precision` to `max_updates` by the harness itself (not
    the validation curve's run it took over): their records, what its run-time estimates learn from."""
    runs = []
    for path in sorted(folder.glob("reproduce_cpu_*.json")):
        if path.name.endswith("_hyps.json") or path.name.startswith("reproduce_cpu_cost"):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        settings = data.get("settings") or {}
        if settings.get("recipe") != "cpu" or settings.get("tiny") or settings.get("max_updates") != max_updates:
            continue
        environment = data.get("environment") or {}
        threads, cpu = run_threads(environment) or 1, recorded_cpu(environment)
        runs += [{**r, "threads": threads, "cpu": cpu, "finished": finished_at(r)} for r in data.get("runs", [])
                 if r.get("status") == "done" and r.get("precision") == precision
                 and not r.get("trained_by")]  # the validation curve's run trained at its own threads
    return sorted(runs, key=lambda r: r["finished"])


def finished_at(run: dict[str, Any]) -> float:
    """When a run's training ended (its last segment's start plus its wall seconds, on the clock of the machine
    that ran it), as POSIX seconds; 0 where its segments do not say."""
    segments = run.get("segments") or []
    try:
        last = segments[-1]
        return datetime.fromisoformat(last["started"]).timestamp() + float(last.get("wall_s") or 0.0)
    except (IndexError, KeyError, TypeError, ValueError):
        return 0.0


def recorded_cpu(environment: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    """The CPU a results file's runs trained on, as this_cpu() names one: its model and its flags of CPU_FLAGS."""
    return environment.get("cpu"), tuple(environment.get("cpu_flags") or ())


def run_threads(environment: dict[str, Any]) -> int | None:
    """The threads each run of a results file trained with (its environment's `threads`), None where unset."""
    try:
        return max(1, int(environment.get("threads")))
    except (TypeError, ValueError):
        return None


def at_threads(minutes: float, ran_at: int, threads: int) -> float:
    """Wall minutes a finished run at `ran_at` threads took, as a run at `threads` threads would take them, at most:
    as many where it ran at no more threads (more threads are not slower), times ran_at / `threads` where it ran at
    more (fewer threads are at most that many times slower). At one thread, its core-minutes: so that runs at two
    threads do not shrink the plan of one-thread runs."""
    return minutes * max(1.0, ran_at / threads)


def split_minutes(run: dict[str, Any]) -> tuple[float, float]:
    """A finished run's wall minutes as (training, scoring and analyses); all training where it has no split."""
    training = run.get("train_minutes") or run["wall_minutes"]
    return training, run["wall_minutes"] - training


def this_cpu() -> tuple[str, tuple[str, ...]]:
    """This machine's CPU as results files record it: its model name and the flags of CPU_FLAGS it has."""
    return cpu_model(), tuple(cpu_flags())


def planned_minutes(rate: float, updates: int) -> float:
    """The plan of a run from its measured one-thread seconds per update, before any run has finished."""
    return updates * rate * OVERHEAD / 60 + EVALUATION_MINUTES


class Estimator:
    """Run-time estimates at `precision` for runs of `max_updates` updates, from the rates and finished runs in
    `folder`, read once (a plan asks for every run of the table)."""

    def __init__(self, precision: str, max_updates: int, folder: Path = RESULTS):
        self.max_updates = max_updates
        self.finished = finished_runs(precision, max_updates, folder)
        self.rates = load_rates(precision, folder)

    def minutes(self, system: str, updates: int, cpu: tuple[str, tuple[str, ...]] | None = None,
                threads: int = 1) -> float | None:
        """Wall minutes a run of `system` at `threads` threads needs for `updates` more updates and its evaluation,
        or None when nothing was measured for it. With `cpu` (`this_cpu()`), the runs finished on that CPU alone
        calibrate the estimate where there are any (CPUs differ in speed by more than twice), and of those the runs
        at `threads` threads where there are any. The system's own runs count where they finished no earlier than
        their CPU's RECENT latest runs (older ones may have run slower code), else the measured rate scaled by how
        those latest runs compare with theirs. What they say is taken by `slowest_median`."""
        done = self.calibrating(cpu, threads)
        if updates <= 0:
            return self.evaluation_minutes(system, cpu, threads)
        timed = [r for r in done if r.get("wall_minutes")]
        since = {r["cpu"]: r["finished"] for r in reversed(latest(timed))}  # oldest of each CPU's latest: last write
        mine = latest([r for r in timed if r["system"] == system and r["finished"] >= since[r["cpu"]]])
        if mine:  # its own finished runs: their training minutes for the part left, then their evaluation
            fraction = min(1.0, updates / self.max_updates)
            estimates = []
            for run in mine:
                training, evaluation = split_minutes(run)
                estimates.append((run["cpu"], at_threads(training * fraction + evaluation, run["threads"], threads)))
            return slowest_median(estimates)
        if system not in self.rates:
            return None
        rated = latest([r for r in timed if r["system"] in self.rates])
        ratios = [(r["cpu"], at_threads(r["wall_minutes"], r["threads"], threads)
                   / planned_minutes(self.rates[r["system"]], self.max_updates)) for r in rated]
        return (slowest_median(ratios) if ratios else 1.0) * planned_minutes(self.rates[system], updates)

    def evaluation_minutes(self, system: str, cpu: tuple[str, tuple[str, ...]] | None = None, threads: int = 1) -> float:
        """Wall minutes of a run's scoring and analyses after its training (they differ by system: the pruning
        curve's decodes take the longest): the most the calibrating runs of `system` took, else of any system,
        else EVALUATION_MINUTES."""
        done = [r for r in self.calibrating(cpu, threads) if r.get("wall_minutes") and r.get("train_minutes")]
        done = latest([r for r in done if r["system"] == system] or done)
        return max((at_threads(split_minutes(r)[1], r["threads"], threads) for r in done), default=EVALUATION_MINUTES)

    def calibrating(self, cpu: tuple[str, tuple[str, ...]] | None, threads: int) -> list[dict[str, Any]]:
        """The finished runs that calibrate estimates for `cpu` at `threads`, oldest first: those on that CPU where
        there are any, and of those the ones at `threads` threads where there are any."""
        done = [r for r in self.finished if r["cpu"] == cpu] or self.finished
        return [r for r in done if r["threads"] == threads] or done


def latest(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of finished runs (oldest first), each CPU's RECENT latest."""
    per_cpu: dict[Any, list[dict[str, Any]]] = {}
    for run in runs:
        per_cpu.setdefault(run["cpu"], []).append(run)
    return [run for group in per_cpu.values() for run in group[-RECENT:]]


def slowest_median(values: list[tuple[Any, float]]) -> float:
    """The largest of the medians of (cpu, value) pairs per CPU: one run slowed by other work on its machine does
    not lengthen every estimate, and a plan for no CPU in particular holds on the slowest one seen."""
    per_cpu: dict[Any, list[float]] = {}
    for cpu, value in values:
        per_cpu.setdefault(cpu, []).append(value)
    return max(statistics.median(group) for group in per_cpu.values())


def estimate_minutes(system: str, updates: int, precision: str, max_updates: int, folder: Path = RESULTS,
                     cpu: tuple[str, tuple[str, ...]] | None = None, threads: int = 1) -> float | None:
    """`Estimator.minutes` of one run."""
    return Estimator(precision, max_updates, folder).minutes(system, updates, cpu, threads)


# ---- the measurement -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(system: str, data: Path, updates: int, work: Path) -> dict[str, Any]:
    """Train `system` for `updates` updates at one thread: the CPU seconds per update after the first 10 (CPU
    time, not wall time, so that other work on the machine does not enter the number; one thread on an idle core
    takes as long)."""
    recipe = RECIPES["cpu"]
    config = {"train": {"max_steps": updates, "max_minutes": None, "valid_every": 10 * updates, "log_every": 10,
                        "amp": recipe.defaults["amp"], "seed": 1},
              # the schedules plan for the recipe's length (any length while it is not chosen: the speed is alike)
              **system_delta(system, recipe.defaults["max_updates"] or 10 * updates, recipe.rho, recipe="cpu")}
    folder = work / system
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(json.dumps(config) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "multibranch", "train", "--preset", recipe.base_preset, "--config",
               str(folder / "config.yaml"), "--data", str(data), "--out", str(folder / "train"), "--threads", "1",
               "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    metrics = folder / "train" / "metrics.jsonl"
    marks: dict[int, tuple[float, float]] = {}  # step -> (CPU seconds, wall seconds) when its record appeared
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT) as proc:
        while proc.poll() is None:
            steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()
                     if '"train"' in line] if metrics.is_file() else []
            for step in steps:
                if step not in marks:
                    try:
                        marks[step] = (cpu_seconds(proc.pid), time.monotonic())
                    except OSError:  # the process ended meanwhile
                        break
            time.sleep(0.2)
        if proc.returncode != 0:
            raise RuntimeError(f"{system}: train failed: {proc.stderr.read().decode()[-2000:]}")
    timed = sorted(step for step in marks if step >= 10)
    first, last = timed[0], timed[-1]
    seconds = (marks[last][0] - marks[first][0]) / (last - first)
    info = subprocess.run([sys.executable, "-m", "multibranch", "info", "--ckpt", str(folder / "train" / "last.pt"),
                           "--no-config", "--json"], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return {"system": system, "seconds_per_update": seconds, "minutes_per_1000_updates": seconds * 1000 / 60,
            "wall_seconds_per_update": (marks[last][1] - marks[first][1]) / (last - first),
            "updates_timed": last - first, "parameters": int(json.loads(info.stdout)["total"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", default=list(RECIPES["cpu"].systems), choices=RECIPES["cpu"].systems)
    p.add_argument("--updates", type=int, default=40, help="updates per system (the first 10 are not timed)")
    p.add_argument("--jobs", type=int, default=2, help="systems trained at the same time, one thread each")
    p.add_argument("--data", type=Path, default=ROOT / "runs" / "reproduce-cpu" / "data",
                   help="prepared Multi30k (default: the CPU recipe's, `bench/reproduce.py --recipe cpu "
                   "--prepare-only`)")
    args = p.parse_args(argv)
    if not (args.data / "data.json").is_file():
        sys.exit(f"--data {args.data}: no prepared data (run `python bench/reproduce.py --recipe cpu --prepare-only`)")
    from concurrent.futures import ThreadPoolExecutor

    began = time.time()
    load = os.getloadavg()[0]
    precision = cpu_precision(RECIPES["cpu"].defaults["amp"])
    path = cost_file(precision)
    rows: list[dict[str, Any]] = []

    def save() -> None:  # after every system: a measurement stopped part way keeps what it measured
        standard = next((r["seconds_per_update"] for r in rows if r["system"] == "standard"), None)
        for row in rows:
            row["relative_to_standard"] = row["seconds_per_update"] / standard if standard else None
        write_json(path, {"environment": {**environment(amp=f"auto: {'bf16' if precision == 'bf16' else 'none'}"),
                                          "cpu": cpu_model(), "cpu_flags": cpu_flags(), "cpu_count": os.cpu_count(),
                                          "precision": precision, "threads_per_run": 1, "jobs": args.jobs,
                                          "load_average_at_start": load, "command": command_line(),
                                          "date": time.strftime("%Y-%m-%d"),
                                          "wall_minutes": (time.time() - began) / 60},
                          "rows": sorted(rows, key=lambda r: args.systems.index(r["system"]))})

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(lambda s: measure(s, args.data, args.updates, Path(tmp)), args.systems):
            rows.append(row)
            save()
    for row in rows:
        print(f"{row['system']:18s} {row['minutes_per_1000_updates']:6.1f} min / 1000 updates "
              f"({row['relative_to_standard'] or 0:.2f}x standard), {row['parameters'] / 1e6:.2f}M parameters")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
