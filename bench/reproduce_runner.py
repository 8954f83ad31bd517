"""The CPU recipe of the reproduction, built in the background at the lowest priority.

    python bench/reproduce_runner.py start [--hours H [--fill]] [--jobs 2] [--threads 1] [-- REPRODUCE_ARGS...]
    python bench/reproduce_runner.py status [--json]
    python bench/reproduce_runner.py stop

`start` returns at once, leaving a job that first measures the recipe's number of updates when bench/results has
none chosen yet (bench/reproduce_curve.py: the standard model's validation curve, at --jobs threads), then runs
`bench/reproduce.py --recipe cpu --results-per-run --out bench/results` on every run of the table that
bench/results does not yet hold, --jobs runs side by side with --threads threads each (one by default). Where
the machine, and runs/ with it, will not last until two runs side by side finish, `--jobs 1 --threads 2`
finishes one in about 60% of the time.
The job runs in a process group and scheduling group of its own (setsid) whose autogroup nice value is set to
19, then at nice 19 itself: on Linux with autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled = 1)
`nice` alone only orders processes inside one group, and a job started from another terminal would get an equal
share of the CPU whatever its nice value; with its group lowered, the commands and tests of whoever uses the
machine keep their priority. Its state stays in runs/reproduce-cpu/ (git-ignored): `runner.log`, the pid file
and every run's folder. A run whose folder is there resumes from its `last.pt`; one whose folder is gone
starts again from the beginning. Each finished run writes bench/results/reproduce_cpu_RUN_seedK.json (with
the device, CPU model and flags, autocast, commit, threads and wall minutes); an unfinished run writes
nothing. With --hours, no run starts that its estimate (bench/reproduce_cost.py) says would not finish in time,
and every training stops by then; with --fill as well, once no run fits, the next runs train part way until
then, to resume from their checkpoints the next time the runner goes (where runs/ is kept).

`status` prints the runs done, started (training now or paused until the runner resumes them; with a run's last
validation BLEU, and the finished standard model's of its seed at that update) and left, the minutes a started
run needs at the runner's threads (at its own pace here once it has trained 250 updates in its present call), and
the hours of one core the ones left need. A run another device reported that the runner trains again here
(`start ... -- --again RUN/seedK`) counts as done and is shown while it trains.
`stop` ends the job (its trainings save a checkpoint to resume from; one stopped during a validation does that
validation first when it resumes). Then `python bench/reproduce_report.py
--docs docs/reproduction.md` rebuilds the table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench.reproduce_cost import Estimator, cpu_precision, this_cpu  # noqa: E402
from bench.reproduce_results import reported_run_keys  # noqa: E402
from bench.reproduce_systems import RECIPES, chosen_cpu_updates  # noqa: E402
from multibranch.atomic import atomic_write_text  # noqa: E402

WORK = ROOT / "runs" / "reproduce-cpu"
RESULTS = ROOT / "bench" / "results"
NAME = "reproduce_cpu"
SEEDS = (1, 2, 3)


def pid_file(work: Path) -> Path:
    return work / "runner.pid"


def running_pid(work: Path) -> int | None:
    """The pid of this work folder's runner while it lives, else None."""
    try:
        pid = int(pid_file(work).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid if process_live(pid) else None  # an ended process its parent has not reaped yet is not running


def lower_priority() -> None:
    """In the new process group (after setsid): the lowest priority for its autogroup, then for the process."""
    try:
        Path("/proc/self/autogroup").write_text("19")
    except OSError:  # no autogroup scheduling here: nice alone is what there is
        pass
    os.nice(19)


def start(args: argparse.Namespace) -> int:
    work: Path = args.work
    pid = running_pid(work)
    if pid is not None:
        print(f"the runner is already going (pid {pid}); `python bench/reproduce_runner.py status` says where it is")
        return 1
    work.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--work", str(work), "--out", str(args.out), "work",
               "--jobs", str(args.jobs), "--threads", str(args.threads)]
    if args.hours is not None:
        command += ["--until", f"{time.time() + 3600 * args.hours:.0f}"] + (["--fill"] if args.fill else [])
    pid = launch(command + ["--", *args.reproduce_args], work)
    print(f"the runner is going (pid {pid}, its own scheduling group at the lowest priority); log: "
          f"{work / 'runner.log'}")
    return 0


def launch(command: list[str], work: Path) -> int:
    """Start `command` in the background, in a process group and scheduling group of its own at the lowest
    priority, its output appended to WORK/runner.log; its pid goes to the pid file."""
    with (work / "runner.log").open("a", encoding="utf-8") as log:
        log.write(f"\n[{time.strftime('%Y-%m-%d %H:%M:%S')}] $ {' '.join(command)}\n")
        log.flush()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env, start_new_session=True, preexec_fn=lower_priority)
    atomic_write_text(pid_file(work), f"{proc.pid}\n")
    return proc.pid


def work(args: argparse.Namespace) -> int:
    """What the background job does: the update count first when it is not chosen yet (bench/reproduce_curve.py,
    the standard model's validation curve, one run at --jobs threads), then the table's runs."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if chosen_cpu_updates() is None:
        print(f"[{time.strftime('%H:%M:%S')}] the number of updates is not chosen yet: measuring the standard "
              "model's validation curve first", flush=True)
        code = subprocess.run([sys.executable, str(ROOT / "bench" / "reproduce_curve.py"), "--threads",
                               str(args.jobs), "--work", str(args.work)], env=env, cwd=ROOT).returncode
        if code != 0 or chosen_cpu_updates() is None:
            return code or 1
    command = [sys.executable, str(ROOT / "bench" / "reproduce.py"), "--recipe", "cpu", "--jobs", str(args.jobs),
               "--threads", str(args.threads), "--results-per-run", "--out", str(args.out), "--work", str(args.work),
               "--name", NAME, "--device", "cpu", "--max-updates", str(chosen_cpu_updates())]
    if args.until is None:
        return subprocess.run(command + args.reproduce_args, env=env, cwd=ROOT).returncode
    code = 0
    for whole_runs in (True, False) if args.fill else (True,):  # the runs that fit, then the next ones part way
        minutes = (args.until - time.time()) / 60
        if minutes < 1:
            print("no time left for a run", flush=True)
            return code
        if not whole_runs:
            print(f"[{time.strftime('%H:%M:%S')}] no run fits the {minutes:.0f} minutes left: the next ones train "
                  "part way until then", flush=True)
        budget = ["--budget", f"{minutes:.1f}"] + (["--whole-runs"] if whole_runs else [])
        code = subprocess.run(command + budget + args.reproduce_args, env=env, cwd=ROOT).returncode
        if code != 0:
            return code
    return code


def training_process_alive(train_dir: Path) -> bool:
    """Whether the process named in the run's lock file (`multibranch train` writes "process PID" into
    RUN/.train.lock while it trains) is alive and a training. Read, never locked: a lock taken here could refuse a training
    that starts at that moment."""
    try:
        pid = int((train_dir / ".train.lock").read_text(encoding="utf-8").split()[1])
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return False
    return process_live(pid) and b"train" in command  # not a later process that got the number


def stop(args: argparse.Namespace) -> int:
    pid = running_pid(args.work)
    if pid is None:
        print("no runner is going")
        return 0
    os.killpg(pid, signal.SIGTERM)  # the harness and its trainings: each training saves a checkpoint first
    deadline = time.monotonic() + args.wait
    while group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if group_alive(pid):  # a training that has not ended by now (a starved one, say) must not write on later
        os.killpg(pid, signal.SIGKILL)
        print(f"the runner's processes did not end within {args.wait:g} s of SIGTERM: killed")
    print(f"stopped the runner (pid {pid})")
    return 0


def stat_fields(stat: Path) -> list[str] | None:
    """The fields of a /proc/PID/stat file after the command name: state, ppid, pgrp, ..., utime (11), stime (12);
    None when the process has ended meanwhile."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_live(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (an ended one its parent has not reaped yet is a zombie)."""
    fields = stat_fields(Path(f"/proc/{pid}/stat"))
    return fields is not None and fields[0] != "Z"


def group_stats(pgid: int) -> list[list[str]]:
    """The stat fields of every process of process group `pgid`, zombies included."""
    found = (stat_fields(stat) for stat in Path("/proc").glob("[0-9]*/stat"))
    return [fields for fields in found if fields is not None and int(fields[2]) == pgid]


def group_alive(pgid: int) -> bool:
    """Whether a live process of process group `pgid` (the runner's, which its trainings share) is still there."""
    return any(fields[0] != "Z" for fields in group_stats(pgid))


def metrics_records(train_dir: Path) -> list[dict[str, Any]] | None:
    """The records of a training folder's metrics.jsonl, None when it has none; a line cut by a write under way
    is left out."""
    try:
        lines = (train_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def progress(train_dir: Path, records: list[dict[str, Any]] | None = None) -> int | None:
    """The last update a training folder logged (from `records` when read already), None when it has no metrics."""
    records = metrics_records(train_dir) if records is None else records
    return None if records is None else max((r.get("step", 0) for r in records), default=0)


def last_validation(records: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The last validation record ({"step", "bleu", ...}) among a training's `records`, None before its first."""
    valid = [r for r in records or [] if r.get("type") == "valid" and r.get("bleu") is not None]
    return valid[-1] if valid else None


def standard_valid_bleu(results: Path, seed: int, step: int) -> float | None:
    """The validation BLEU of the finished standard run of `seed` at `step` (its results file), else None."""
    try:
        runs = json.loads((results / f"{NAME}_standard_seed{seed}.json").read_text(encoding="utf-8"))["runs"]
    except (OSError, ValueError, KeyError):
        return None
    for run in runs:
        for point in (run.get("curve") or {}).get("valid") or []:
            if run.get("system") == "standard" and point.get("step") == step:
                return point.get("bleu")
    return None


DONE = ("done", "again")  # a run trained here again (`--again`) has its results already


def reported_cpu_runs(results: Path, updates: int) -> set[str]:
    """The runs of the CPU recipe that `results` holds finished, trained to the settings the runner trains to: in a
    file of their own or in a GPU call's one file (what `bench/reproduce.py --results-per-run` does not train again)."""
    from bench.reproduce import parse_args  # imported here: it loads the analyses

    return reported_run_keys([results], vars(parse_args(["--recipe", "cpu", "--max-updates", str(updates)])))


def plan_status(results: Path = RESULTS, work: Path | None = None, seeds: tuple[int, ...] = SEEDS,
                precision: str | None = None, threads: int = 1,
                cpu: tuple[str, tuple[str, ...]] | None = None) -> dict[str, Any]:
    """Every run of the CPU recipe's table: done (its results file is in `results`), running (started: its training
    folder is in `work`; `scoring` once its training has finished) or left, the wall minutes each one left needs at
    `precision` (this CPU's) and `threads` threads, and the hours of one core they need together. The estimates
    are calibrated on `cpu`'s finished runs where given, else on this machine's for its own status (`work`), else
    on the slowest CPU's (the docs' plan, the same anywhere)."""
    recipe = RECIPES["cpu"]
    updates = chosen_cpu_updates(results / "reproduce_cpu_curve.json")
    precision = precision or cpu_precision(recipe.defaults["amp"])
    curve_seed = curve_run_seed(results / "reproduce_cpu_curve.json") if updates else None
    cpu = cpu or (this_cpu() if work is not None else None)
    estimator = Estimator(precision, updates, results) if updates is not None else None
    reported = reported_cpu_runs(results, updates) if updates is not None else set()
    rows = []
    for seed in seeds:
        for system in recipe.table_systems:
            folder = work / "runs" / system / f"seed{seed}" if work else None
            records = metrics_records(folder / "train") if folder else None
            step = progress(folder / "train", records) if folder else None
            if f"{system}/seed{seed}" in reported and folder is not None and \
                    training_process_alive(folder / "train"):  # reported, and trained here again (--again)
                state = "again"
            elif f"{system}/seed{seed}" in reported:
                state, step = "done", updates
            elif system == "standard" and seed == curve_seed:  # the validation curve's run: trained, to be scored
                state, step = "trained", updates
            else:
                state = "running" if step or (folder is not None and (folder / "train").is_dir()) else "left"
            minutes = core_minutes = None
            if estimator is not None and state not in DONE:
                minutes, core_minutes = (estimator.minutes(system, updates - (step or 0), cpu, t) for t in (threads, 1))
            started = state in ("running", "again")
            scoring = started and (folder / "trained.json").is_file()  # trained; scored and analysed now
            training = started and not scoring and training_process_alive(folder / "train")
            pace = seconds_per_update(records, call_began_at(folder)) if training else None
            if pace is not None and estimator is not None:  # its own pace here, at its threads, validations included
                minutes = (updates - (step or 0)) * pace / 60 + estimator.evaluation_minutes(system, cpu, threads)
                core_minutes = minutes * threads
            row = {"run": f"{system}/seed{seed}", "state": state, "update": step, "minutes_left": minutes,
                   "core_minutes_left": core_minutes, "scoring": scoring, "training": training, "valid": None}
            valid = last_validation(records) if started else None
            if valid is not None:
                row["valid"] = {"step": valid["step"], "bleu": valid["bleu"],
                                "standard_bleu": standard_valid_bleu(results, seed, valid["step"])}
            rows.append(row)
    left = [r for r in rows if r["state"] not in DONE]
    unknown = [r["run"] for r in left if r["minutes_left"] is None]
    return {"updates": updates, "precision": precision, "runs": rows,
            "done": len(rows) - len(left), "left": len(left),
            "core_hours_left": sum(r["core_minutes_left"] or 0 for r in left) / 60, "not_estimated": unknown}


def seconds_per_update(records: list[dict[str, Any]] | None, since: int = 0, span: int = 500) -> float | None:
    """Wall seconds per update over the last `span` updates (fewer, down to 250, so that one validation is counted)
    that a training logged after update `since` (where its present call began: the pace of an earlier call, maybe
    on another machine or at other threads, is not this one's), from its train records' `elapsed_s` (the trainer's
    clock); None before it has logged 250 updates past `since`."""
    points = [(r["step"], r["elapsed_s"]) for r in records or [] if r.get("type") == "train"
              and (r.get("step") or 0) > since and r.get("elapsed_s") is not None]
    if not points:
        return None
    last_step, last_elapsed = points[-1]
    first = next(((step, elapsed) for step, elapsed in points if last_step - step <= span), points[-1])
    if last_step - first[0] < 250:
        return None
    return (last_elapsed - first[1]) / (last_step - first[0])


def call_began_at(run_folder: Path) -> int:
    """The update the present training call of a run began at: where its last recorded call (segments.jsonl,
    written by the harness as each call ends) stopped; 0 before any has ended."""
    try:
        lines = (run_folder / "segments.jsonl").read_text(encoding="utf-8").splitlines()
        return int(json.loads(lines[-1])["to_step"]) if lines else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def curve_run_seed(path: Path) -> int | None:
    """The seed of the standard model whose validation curve chose the update count (the harness takes that run
    over as the table's standard run of its seed: bench/reproduce.py, `adopt_curve_run`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("seed", 1) if data.get("system", "standard") == "standard" else None


def runner_command(pid: int | None) -> list[str]:
    """The command line of the runner `pid` ([] where it is not going)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def runner_threads(pid: int | None) -> int:
    """The --threads of each run of the runner `pid` (its command line's; 1 where it has none or is not going)."""
    command = runner_command(pid)
    try:
        return max(1, int(command[command.index("--threads") + 1]))
    except (ValueError, IndexError):
        return 1


def runner_deadline(pid: int | None) -> str:
    """', until HH:MM' (and what it does once no run fits, with --fill) for a runner started with --hours, else ''."""
    command = runner_command(pid)
    try:
        until = float(command[command.index("--until") + 1])
    except (ValueError, IndexError):
        return ""
    options = command[:command.index("--")] if "--" in command else command  # not bench/reproduce.py's
    fill = " (then the next runs part way)" if "--fill" in options else ""
    return f", until {time.strftime('%H:%M', time.localtime(until))}{fill}"


def clock_after(minutes: float) -> str:
    """The local time `minutes` from now, HH:MM."""
    return time.strftime("%H:%M", time.localtime(time.time() + 60 * minutes))


def status(args: argparse.Namespace) -> int:
    pid = running_pid(args.work)
    threads = runner_threads(pid) if pid else 1
    plan = plan_status(args.out, args.work, threads=threads)
    if args.json:
        print(json.dumps({**plan, "runner_pid": pid}, indent=1))
        return 0
    print(f"runner: {f'going, pid {pid}{runner_deadline(pid)}' if pid else 'not going'}")
    if plan["updates"] is None:
        curve = progress(args.work / "curve" / "train")
        print(f"CPU recipe: the number of updates is not chosen yet; the runner measures the standard model's "
              f"validation curve first (bench/reproduce_curve.py{f', at update {curve}' if curve else ''}), then "
              f"trains the {len(plan['runs'])} runs of the table")
        return 0
    print(f"CPU recipe, {plan['updates']} updates a run: {plan['done']} of {len(plan['runs'])} runs done, "
          f"{plan['left']} left, about {plan['core_hours_left']:.1f} core-hours left at {plan['precision']} here"
          + (f" (not estimated: {', '.join(plan['not_estimated'])})" if plan["not_estimated"] else ""))
    for row in plan["runs"]:
        if row["state"] in ("running", "again"):
            how = "running" if row["training"] or row["scoring"] else "paused"
            again = " again (its results came from another device)" if row["state"] == "again" else ""
            doing = "scoring and analyses" if row["scoring"] else f"update {row['update'] or 0}"
            valid = row["valid"]
            if valid is not None and not row["scoring"]:
                seed = row["run"].rsplit("seed", 1)[1]
                doing += f", validation BLEU {valid['bleu']:.2f} at {valid['step']}" + (
                    f" (standard, seed {seed}: {valid['standard_bleu']:.2f})" if valid["standard_bleu"] is not None
                    and not row["run"].startswith("standard/") else "")
            print(f"  {how} {row['run']}{again}: {doing}, about {row['minutes_left'] or 0:.0f} minutes left"
                  + (f" at {threads} threads" if threads > 1 else "")
                  + (f" (done about {clock_after(row['minutes_left'])})" if row["training"] and row["minutes_left"]
                     else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=WORK, help=f"the runs and the runner's state (default: {WORK})")
    p.add_argument("--out", type=Path, default=RESULTS, help="where finished runs' results go (default: bench/results)")
    sub = p.add_subparsers(dest="command", required=True)
    go = sub.add_parser("start", help="start the background runner")
    go.add_argument("--hours", type=float, default=None, help="start no run that would not finish within H hours, "
                    "and stop every training by then (default: run until the table is complete)")
    go.add_argument("--fill", action="store_true", help="with --hours: once no run fits the time left, train the "
                    "next ones part way until then (they resume from their checkpoints next time)")
    go.add_argument("--jobs", type=int, default=2, help="runs side by side (default: 2)")
    go.add_argument("--threads", type=int, default=1, help="threads of each run (default: 1)")
    go.add_argument("reproduce_args", nargs="*", help="after --: more bench/reproduce.py options")
    show = sub.add_parser("status", help="runs done, running and left")
    show.add_argument("--json", action="store_true")
    halt = sub.add_parser("stop", help="stop the runner")
    halt.add_argument("--wait", type=float, default=120.0, help="seconds its trainings get to save a checkpoint "
                      "and end before they are killed (default: 120)")
    job = sub.add_parser("work", help="what the background job runs (in the foreground; `start` runs it)")
    job.add_argument("--jobs", type=int, default=2)
    job.add_argument("--threads", type=int, default=1)
    job.add_argument("--until", type=float, default=None, help="the time (seconds since the epoch) to be done by")
    job.add_argument("--fill", action="store_true")
    job.add_argument("reproduce_args", nargs="*")
    args = p.parse_args(argv)
    if getattr(args, "fill", False) and args.command == "start" and args.hours is None:
        p.error("--fill needs --hours")
    args.work, args.out = args.work.resolve(), args.out.resolve()
    return {"start": start, "status": status, "stop": stop, "work": work}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
