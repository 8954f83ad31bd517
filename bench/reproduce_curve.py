"""How many updates the CPU recipe trains every system: the standard model's validation curve, measured.

    python bench/reproduce_curve.py [--threads 2] [--cap 8000] [--gain 0.2] [--window 1000] [--device cpu]

trains the CPU recipe's standard model (transformer-tiny, seed 1, the recipe's training settings) in segments of
--valid-every updates (`train --stop-at-step`, then `--resume`: the same updates as one run), validating after each
(BLEU on all of val, beam 5), and stops at the first validation where the best validation BLEU so far has risen by
no more than --gain over the last --window updates: that update is the recipe's number of updates. It writes
bench/results/reproduce_cpu_curve.json after every segment: the curve, the rule, the update chosen (null while the
curve still rises), the environment. A run stopped before the rule is met leaves its curve there too, marked
unfinished; its folder (runs/reproduce-cpu/curve, git-ignored) resumes it when still there.

bench/reproduce_systems.py reads the chosen number from that file (the CPU recipe's `max_updates`): it is chosen
once, on val, and every system then trains that many updates, so that DropHead's V schedule and the Weighted
Transformer's kappa/alpha freeze plan for the real end of training.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench.common import cpu_model, environment  # noqa: E402
from bench.reproduce_cost import command_line, cpu_flags, cpu_precision  # noqa: E402
from bench.reproduce_systems import CURVE_FILE, RECIPES  # noqa: E402
from multibranch.json_file import write_json  # noqa: E402

WORK = ROOT / "runs" / "reproduce-cpu"


def flat_at(curve: list[tuple[int, float]], gain: float, window: int) -> int | None:
    """The first validation step s (at least `window` updates after the first validation) where the best BLEU up
    to s exceeds the best BLEU up to s - window by no more than `gain`; None while the curve still rises."""
    for i, (step, _) in enumerate(curve):
        before = [bleu for s, bleu in curve[: i + 1] if s <= step - window]
        if not before:
            continue
        best_now = max(bleu for _, bleu in curve[: i + 1])
        if best_now - max(before) <= gain:
            return step
    return None


def curve_config(cap: int, seed: int = 1) -> dict[str, Any]:
    """The curve run's config over the recipe's base preset: the table's standard run of `seed`, capped at `cap`
    updates (the harness takes this run over as that table run: bench/reproduce.py, `adopt_curve_run`)."""
    defaults = RECIPES["cpu"].defaults
    return {"train": {"seed": seed, "max_steps": cap, "max_minutes": None, "valid_every": defaults["valid_every"],
                      "keep_last": defaults["average_last"], "log_every": defaults["log_every"], "best_metric": "bleu",
                      "amp": defaults["amp"], "patience": None}}


def valid_curve(train_dir: Path) -> list[tuple[int, float]]:
    """(update, validation BLEU) of every validation in the run's metrics.jsonl."""
    path = train_dir / "metrics.jsonl"
    points = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
            continue
        if record.get("type") == "valid" and record.get("bleu") is not None:
            points[record["step"]] = record["bleu"]
    return sorted(points.items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="CPU threads of the training (default: 2)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--cap", type=int, default=8000, help="give up at this many updates (default: 8000)")
    p.add_argument("--gain", type=float, default=0.2, help="BLEU a window must add for the curve to still rise")
    p.add_argument("--window", type=int, default=1000, help="updates of the window (default: 1000)")
    p.add_argument("--work", type=Path, default=WORK, help=f"prepared data and the run (default: {WORK})")
    p.add_argument("--data", type=Path, default=None, help="an already prepared Multi30k (default: WORK/data, "
                   "prepared as `bench/reproduce.py --recipe cpu` prepares it)")
    p.add_argument("--out", type=Path, default=CURVE_FILE, help=f"the results file (default: {CURVE_FILE})")
    args = p.parse_args(argv)
    recipe = RECIPES["cpu"]
    data = args.data or args.work / "data"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(args.threads)}
    if args.data is None and not (data / "data.json").is_file():  # the recipe's own preparation
        subprocess.run([sys.executable, str(ROOT / "bench" / "reproduce.py"), "--recipe", "cpu", "--prepare-only",
                        "--work", str(args.work)], check=True, env=env, cwd=ROOT)
    folder = args.work / "curve"
    folder.mkdir(parents=True, exist_ok=True)
    every = recipe.defaults["valid_every"]
    (folder / "config.yaml").write_text(json.dumps(curve_config(args.cap), indent=1) + "\n", encoding="utf-8")
    train_dir = folder / "train"
    began = time.time()
    chosen = None
    while True:
        curve = valid_curve(train_dir)
        step = curve[-1][0] if curve else 0
        chosen = flat_at(curve, args.gain, args.window)
        write_results(args, curve, chosen, began)
        if chosen is not None or step >= args.cap:
            break
        command = [sys.executable, "-m", "multibranch", "train", "--preset", recipe.base_preset, "--config",
                   str(folder / "config.yaml"), "--data", str(data), "--out", str(train_dir), "--device", args.device,
                   "--threads", str(args.threads), "--no-progress", "--stop-at-step", str(step + every)]
        if (train_dir / "last.pt").is_file():
            command.append("--resume")
        elif train_dir.exists():
            command.append("--force")  # killed before its first checkpoint
        with (folder / "curve.log").open("a", encoding="utf-8") as log:
            result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        if result.returncode != 0:
            print(f"train failed ({result.returncode}); see {folder / 'curve.log'}", file=sys.stderr)
            return 1
    print(f"updates chosen: {chosen}" if chosen else f"no flattening by update {args.cap}")
    return 0


def write_results(args: argparse.Namespace, curve: list[tuple[int, float]], chosen: int | None,
                  began: float) -> None:
    previous: dict[str, Any] = {}
    if args.out.is_file():
        previous = json.loads(args.out.read_text(encoding="utf-8"))
    if previous.get("chosen_updates") is not None and chosen is None:
        return  # a finished measurement is never replaced by an unfinished one
    amp = RECIPES["cpu"].defaults["amp"]
    precision = cpu_precision(amp) if args.device == "cpu" else "auto (GPU)"
    write_json(args.out, {
        "environment": {**environment(amp=f"{amp}: {precision}"), "cpu": cpu_model(), "cpu_flags": cpu_flags(),
                        "threads": args.threads, "device": args.device, "date": time.strftime("%Y-%m-%d"),
                        "command": command_line()},
        "recipe": "cpu", "system": "standard", "seed": 1,
        "rule": {"gain": args.gain, "window": args.window, "cap": args.cap,
                 "text": f"the first validation where the best validation BLEU so far rose by at most {args.gain} "
                         f"over the last {args.window} updates"},
        "status": "done" if chosen is not None else ("gave up at the cap" if curve and curve[-1][0] >= args.cap
                                                     else "unfinished"),
        "chosen_updates": chosen,
        "curve": [{"step": step, "bleu": bleu} for step, bleu in curve],
        "wall_minutes_this_call": (time.time() - began) / 60,
    })


if __name__ == "__main__":
    sys.exit(main())
