"""Tune a classification preset on the VALIDATION split only: train candidate settings, compare best valid accuracy.

The data is the split `bench/classify_quality.py` prepares (its test split is never read here), so the presets
tuned with this script are scored once, afterwards, by classify_quality.py on the held-out test split.
A candidate is a name and `--set` overrides on top of a preset; runs go side by side (`--jobs`), each with
`--threads` torch threads, and each reports its best valid accuracy (and macro-F1), the update it was
reached at, the last valid loss and its CPU seconds.

    python bench/classify_sweep.py --dataset trec6 --preset trec6-tiny --jobs 2 --threads 1 \\
        --candidate small:model.d_model=128,model.ffn_dim=512 --candidate mean:classifier.pooling=mean
Results: bench/results/<name>.json (candidates replaced by name, so sweeps can be split).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.classify_quality import DATASETS, multibranch, prepared, timed  # noqa: E402
from bench.common import RESULTS, environment, preset_amp, run_metrics, work_dir  # noqa: E402


def parse_candidate(text: str) -> tuple[str, list[str]]:
    """`name:key=value,key=value` -> (name, [key=value, ...]); `name:` alone is the preset as it is."""
    name, _, sets = text.partition(":")
    if not name:
        raise SystemExit(f"--candidate {text!r}: expected NAME:key=value,...")
    return name, [s for s in sets.split(",") if s]


def run_candidate(name: str, sets: list[str], data: Path, runs: Path, args: argparse.Namespace) -> dict[str, Any]:
    run = runs / name
    extra = [x for s in ["train.max_minutes=null", f"train.seed={args.seed}", *sets] for x in ("--set", s)]
    cost: dict[str, Any] = {"cpu_s": None, "wall_s": None}  # --collect: not measured
    if not args.collect:
        try:
            cost = timed(multibranch("train", "--preset", args.preset, "--data", str(data), "--out", str(run),
                                     "--force", "--no-progress", "--threads", str(args.threads), *extra),
                         runs / f"{name}.log")
        except RuntimeError as error:  # one failed (or stopped) candidate does not lose the others' results
            return {"candidate": name, "sets": sets, "seed": args.seed, "error": str(error)}
    records = run_metrics(run)
    valid = [r for r in records if r["type"] == "valid"]
    best = max(valid, key=lambda r: (r["accuracy"], -r["step"]))
    return {"candidate": name, "sets": sets, "vocab": args.vocab or DATASETS[args.dataset]["vocab"], "seed": args.seed, "best_valid_accuracy": best["accuracy"],
            "best_valid_macro_f1": best["macro_f1"], "best_step": best["step"], "updates": max(r["step"] for r in records), "last_valid_loss": valid[-1]["loss"],
            "valid_curve": [(r["step"], round(r["accuracy"], 4)) for r in valid], **cost}


def _minutes(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds / 60:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, choices=list(DATASETS))
    parser.add_argument("--preset", required=True, help="the preset every candidate starts from")
    parser.add_argument("--candidate", action="append", required=True, help="NAME:key=value,key=value (repeatable)")
    parser.add_argument("--vocab", type=int, help="SentencePiece vocabulary size (default: the dataset's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="trainings side by side")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each training")
    parser.add_argument("--collect", action="store_true",
                        help="do not train: read the candidates' runs already in the work directory (CPU not measured; "
                             "for sweeps whose results file was not written)")
    parser.add_argument("--name", help="results file bench/results/<name>.json (default: sweep_<dataset>)")
    args = parser.parse_args()
    name = args.name or f"sweep_{args.dataset}"
    candidates = [parse_candidate(c) for c in args.candidate]
    amp = {cand: preset_amp(args.preset, sets) for cand, sets in candidates}  # an invalid --set stops here
    runs = work_dir() / name
    runs.mkdir(parents=True, exist_ok=True)
    data = prepared(args.dataset, runs / "prepare.log", args.vocab)
    start = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = [{**row, "amp": amp[row["candidate"]]}
                for row in pool.map(lambda c: run_candidate(*c, data, runs, args), candidates)]
    path = RESULTS / f"{name}.json"
    old = json.loads(path.read_text())["rows"] if path.exists() else []
    done = {(r["candidate"], r["seed"]) for r in rows}
    rows = [r for r in old if (r["candidate"], r["seed"]) not in done] + rows
    path.write_text(json.dumps({"environment": environment(amp=amp), "dataset": args.dataset, "preset": args.preset,
                                "split": "valid", "rows": rows}, indent=2) + "\n")
    for row in [r for r in rows if "error" in r]:
        print(f"{row['candidate']:>24} seed {row['seed']}: {row['error']}")
    for row in sorted([r for r in rows if "error" not in r], key=lambda r: -r["best_valid_accuracy"]):
        print(f"{row['candidate']:>24} seed {row['seed']}: valid acc {100 * row['best_valid_accuracy']:.1f} "
              f"(F1 {100 * row['best_valid_macro_f1']:.1f}) at {row['best_step']}, last loss "
              f"{row['last_valid_loss']:.3f}, {_minutes(row['cpu_s'])} CPU min  {' '.join(row['sets'])}")
    print(f"{time.perf_counter() - start:.0f} s; written {path}")


if __name__ == "__main__":
    main()
