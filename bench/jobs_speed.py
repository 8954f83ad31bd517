"""Several training runs on one device at once: aggregate updates/s with N = 1, 2, 4, 8 runs side by side.

What `bench/reproduce.py --jobs N` relies on. For each N, N copies of `multibranch train` (the same preset and
data, seeds 1..N) start together and train for `--seconds`; each run's updates/s is read from its
metrics.jsonl between its first train record after `--skip` seconds (warm-up: graph captures, cuBLAS
choices) and its last one, and the rows report their sum. Each run gets `--threads` CPU threads (default: the
machine's cores divided by N, at least 1), so N runs never ask for more threads than the machine has.

    python bench/jobs_speed.py --device cuda --amp bf16 --jobs 1 2 4 8 --seconds 45       # a GPU call
    python bench/jobs_speed.py --device cpu --preset transformer-tiny --jobs 1 2 --seconds 20 --skip 5  # dry run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import environment, multi30k_data, save_results  # noqa: E402


def updates_per_s(metrics: Path, skip: float) -> tuple[float, int]:
    """(updates/s, updates) of one run between its first train record after `skip` seconds and its last."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    train = [r for r in records if r.get("type") == "train"]
    kept = [r for r in train if r["elapsed_s"] >= skip] or train[-1:]
    if len(kept) < 2:
        return 0.0, 0
    steps, seconds = kept[-1]["step"] - kept[0]["step"], kept[-1]["elapsed_s"] - kept[0]["elapsed_s"]
    return steps / max(seconds, 1e-9), steps


def run_together(n: int, args: argparse.Namespace, data: Path, work: Path) -> dict:
    threads = args.threads or max(1, (os.cpu_count() or 1) // n)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    runs = [work / f"jobs{n}-run{i}" for i in range(n)]
    command = [sys.executable, "-m", "multibranch", "train", "--preset", args.preset, "--data", str(data),
               "--device", args.device, "--amp", args.amp, "--threads", str(threads), "--no-progress",
               "--max-minutes", str(args.seconds / 60), "--valid-every", "1000000", "--log-every", str(args.log_every),
               "--set", "train.valid_bleu=false"]
    start = time.perf_counter()
    procs = [subprocess.Popen([*command, "--out", str(run), "--seed", str(i + 1)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i, run in enumerate(runs)]
    errors = [p.communicate()[1] for p in procs]
    wall = time.perf_counter() - start
    per_run = [updates_per_s(run / "metrics.jsonl", args.skip) for run in runs]
    failed = [e.strip().splitlines()[-1] for p, e in zip(procs, errors) if p.returncode != 0 and e.strip()]
    return {"jobs": n, "threads_per_job": threads, "updates_per_s": sum(u for u, _ in per_run),
            "per_job_updates_per_s": [u for u, _ in per_run], "timed_updates": [k for _, k in per_run],
            "wall_s": wall, "failed": failed}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--amp", default="bf16", choices=["none", "bf16", "fp16"])
    p.add_argument("--preset", default="transformer", help="the runs' preset (default: the IWSLT-shape standard)")
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--seconds", type=float, default=45.0, help="training time of each run")
    p.add_argument("--skip", type=float, default=12.0, help="seconds of each run left out (warm-up)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads a run (default: cores / N)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--data", type=Path, default=None, help="prepared data (default: the benchmarks' Multi30k)")
    p.add_argument("--name", default="jobs_speed")
    args = p.parse_args(argv)
    data = args.data or multi30k_data()
    rows = []
    with tempfile.TemporaryDirectory(prefix="jobs-speed-") as tmp:
        for n in args.jobs:
            row = run_together(n, args, data, Path(tmp))
            rows.append(row)
            print(f"{n} job(s) x {row['threads_per_job']} thread(s): {row['updates_per_s']:.1f} updates/s in all "
                  f"(per job {', '.join(f'{u:.1f}' for u in row['per_job_updates_per_s'])})"
                  + (f"; failed: {row['failed']}" if row["failed"] else ""), flush=True)
    base = rows[0]["updates_per_s"] or 1e-9
    for row in rows:
        row["vs_first"] = row["updates_per_s"] / base
    import torch

    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") and torch.cuda.is_available() else None
    save_results(args.name, {"environment": environment(amp=args.amp), "gpu": gpu, "cuda": torch.version.cuda,
                             "device": args.device, "preset": args.preset,
                             "amp": args.amp, "seconds": args.seconds, "skip_s": args.skip, "rows": rows})


if __name__ == "__main__":
    main()
