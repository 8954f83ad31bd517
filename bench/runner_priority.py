"""Does the background reproduction runner leave the foreground its speed?

    python bench/runner_priority.py [--repeats 2] [--work runs/reproduce-cpu] [-- WORKLOAD...]

Times one foreground workload (by default a slice of the test suite, with the suite's own two workers) with the
runner paused and with it going, alternately, and records the CPU share each side got while the workload ran.
The runner (`bench/reproduce_runner.py start`) must be going. It is paused by SIGSTOP to its process group and
continued by SIGCONT: its trainings wait and lose nothing, so a measurement costs it only the minutes paused.
Writes bench/results/runner_priority.json: the wall seconds of every repeat, their medians and the ratio
going / paused (1.00: the runner costs the foreground nothing).
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench.common import environment, save_results  # noqa: E402
from bench.reproduce_runner import WORK, group_stats, running_pid  # noqa: E402

DEFAULT_WORKLOAD = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/modules"]
TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of the processes of process group `pgid` (/proc/PID/stat)."""
    return sum(int(fields[11]) + int(fields[12]) for fields in group_stats(pgid)) / TICKS


def timed_workload(workload: list[str], runner_pgid: int) -> dict[str, float]:
    """Run the workload once; its wall seconds, and the CPU seconds it and the runner used meanwhile."""
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    runner_before = group_cpu_seconds(runner_pgid)
    start = time.perf_counter()
    completed = subprocess.run(workload, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    runner_cpu = group_cpu_seconds(runner_pgid) - runner_before
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode != 0:
        raise SystemExit(f"the workload failed (exit {completed.returncode}): {' '.join(workload)}")
    workload_cpu = (after_children.ru_utime - before_children.ru_utime) + (after_children.ru_stime
                                                                           - before_children.ru_stime)
    return {"wall_s": round(wall, 2), "workload_cpu_s": round(workload_cpu, 2), "runner_cpu_s": round(runner_cpu, 2)}


def measure(workload: list[str], runner_pgid: int, repeats: int, settle_s: float = 5.0) -> dict[str, Any]:
    """Alternate paused / going `repeats` times, the runner given `settle_s` to run again before a going round;
    it is always continued on the way out."""
    rounds: dict[str, list[dict[str, float]]] = {"paused": [], "going": []}
    try:
        for _ in range(repeats):
            os.killpg(runner_pgid, signal.SIGSTOP)
            rounds["paused"].append(timed_workload(workload, runner_pgid))
            os.killpg(runner_pgid, signal.SIGCONT)
            time.sleep(settle_s)  # the trainings running again before the round is timed
            rounds["going"].append(timed_workload(workload, runner_pgid))
    finally:
        os.killpg(runner_pgid, signal.SIGCONT)
    cores = os.cpu_count() or 1
    summary: dict[str, Any] = {}
    for state, timings in rounds.items():
        wall = statistics.median(t["wall_s"] for t in timings)
        summary[state] = {"repeats": timings, "median_wall_s": round(wall, 2),
                          "runner_share_of_cpu": round(sum(t["runner_cpu_s"] for t in timings)
                                                       / (cores * sum(t["wall_s"] for t in timings)), 3)}
    summary["going_over_paused"] = round(summary["going"]["median_wall_s"] / summary["paused"]["median_wall_s"], 3)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="paused/going pairs (default 2)")
    parser.add_argument("--work", type=Path, default=WORK, help="the runner's work folder (default %(default)s)")
    parser.add_argument("workload", nargs="*", help="the foreground command (default: pytest tests/modules)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1")
    pgid = running_pid(args.work)
    if pgid is None:
        parser.error(f"no runner is going for {args.work}: `python bench/reproduce_runner.py start` first")
    workload = args.workload or DEFAULT_WORKLOAD
    summary = measure(workload, pgid, args.repeats)
    shown = ["python", *workload[1:]] if workload[0] == sys.executable else workload
    payload = {"workload": " ".join(shown), "cores": os.cpu_count(), **summary,
               "autogroup_scheduling": Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
               if Path("/proc/sys/kernel/sched_autogroup_enabled").exists() else None,
               "environment": environment(amp="none")}
    path = save_results("runner_priority", payload)
    print(f"workload {payload['workload']}: median {summary['paused']['median_wall_s']} s with the runner paused, "
          f"{summary['going']['median_wall_s']} s with it going ({summary['going_over_paused']:.2f}x); the runner "
          f"took {summary['going']['runner_share_of_cpu']:.1%} of the CPU meanwhile -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
