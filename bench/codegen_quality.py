"""Code generation (docstring -> Python function) quality: standard Transformer vs MAT at equal parameters.

The code-docstring corpus is prepared once (`prepare --task code --docstring-errors raw`, 1000 training
examples held out as the test split, seed 1). Then, for every seed, each system is trained with the same
budget (--max-steps updates, capped at --max-minutes wall-clock minutes), the held-out split is translated
with its best checkpoint (by valid corpus BLEU on 200 valid docstrings, the presets' setting) and scored
by `evaluate --task code`: PoV, mean sentence BLEU (exp smoothing) and corpus BLEU on code tokens.
Systems alternate within each seed round, so a machine that gets busier part-way hurts both alike.
Results: bench/results/<name>.json (environment and exact command included) and a table on stdout.

    python bench/codegen_quality.py --max-steps 100000 --max-minutes 10 --seeds 1 2 3
    python bench/codegen_quality.py --max-steps 20 --limit 20 --name codegen_smoke   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    ROOT,
    checkpoint_parameters,
    environment,
    preset_amp,
    run_metrics,
    save_results,
    work_dir,
)

SYSTEMS = ["codegen-tiny", "codegen-tiny-mat"]


def corpus_dir() -> Path:
    default = ROOT.parent / "shared" / "data" / "code-docstring"
    root = Path(os.environ.get("MULTIBRANCH_SHARED_DATA", default.parent))
    path = Path(os.environ.get("MULTIBRANCH_CODE_DOCSTRING", root / "code-docstring"))
    if not (path / "train.code").is_file():
        sys.exit(f"code-docstring corpus not found at {path}; set MULTIBRANCH_CODE_DOCSTRING")
    return path


def multibranch(args: list[str], log: Path) -> None:
    """Run `python -m multibranch ARGS` with this checkout's sources, appending its output to `log`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with log.open("a") as handle:
        handle.write(f"$ multibranch {' '.join(args)}\n")
        handle.flush()
        result = subprocess.run([sys.executable, "-m", "multibranch", *args], stdout=handle, stderr=subprocess.STDOUT,
                                env=env)
    if result.returncode != 0:
        raise RuntimeError(f"command failed (see {log}): multibranch {' '.join(args)}")


def prepared_data(log: Path) -> Path:
    """The corpus prepared once (reused when its data.json exists)."""
    out = work_dir() / "codegen-data"
    if not (out / "data.json").exists():
        corpus = corpus_dir()
        multibranch(["prepare", "--task", "code", "--train", str(corpus / "train"), "--valid", str(corpus / "valid"),
                     "--out", str(out), "--docstring-errors", "raw", "--holdout", "1000", "--seed", "1", "--force"],
                    log)
    return out


def run_system(system: str, seed: int, data: Path, runs: Path, args: argparse.Namespace) -> dict:
    run = runs / f"{system}-seed{seed}"
    log = runs / f"{system}-seed{seed}.log"
    log.write_text("")
    overrides = [x for o in [f"train.seed={seed}", *args.overrides] for x in ("--set", o)]
    start = time.perf_counter()
    multibranch(["train", "--preset", system, "--data", str(data), "--out", str(run), "--force", "--no-progress",
                 "--threads", str(args.threads), "--max-steps", str(args.max_steps), "--max-minutes",
                 str(args.max_minutes), *overrides], log)
    train_s = time.perf_counter() - start

    src, ref = data / "test.src.txt", data / "test.tgt.txt"
    if args.limit:
        src, ref = _head(src, run / "test.src.txt", args.limit), _head(ref, run / "test.ref.code", args.limit)
    hyp, scores = run / "test.hyp.code", run / "test.scores.json"
    start = time.perf_counter()
    multibranch(["translate", "--ckpt", str(run / "best.pt"), "-i", str(src), "-o", str(hyp), "--device", "cpu",
                 "--threads", str(args.threads), "--no-progress"], log)
    translate_s = time.perf_counter() - start
    multibranch(["evaluate", "--task", "code", "--hyp", str(hyp), "--ref", str(ref), "--json", str(scores),
                 "--force"], log)
    result = json.loads(scores.read_text())
    records = run_metrics(run)
    valid = [r for r in records if r["type"] == "valid"]
    return {
        "system": system, "seed": seed, "parameters": checkpoint_parameters(run / "best.pt"),
        "updates": max(r["step"] for r in records), "train_s": train_s, "translate_s": translate_s,
        "test_lines": result["lines"], "pov": result["pov"]["score"],
        "sentence_bleu": result["sentence_bleu"]["score"], "bleu": result["bleu"]["score"],
        "bleu_signature": result["bleu"]["signature"], "sentence_bleu_signature": result["sentence_bleu"]["signature"],
        "best_valid": max(valid, key=lambda r: r.get("bleu", float("-inf"))) if valid else None,
    }


def _head(path: Path, out: Path, n: int) -> Path:
    lines = path.read_text(encoding="utf-8").split("\n")[:n]
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return out


def summary(rows: list[dict]) -> list[str]:
    """A Markdown table: mean (and sd over seeds when there are several) per system."""
    lines = ["| system | params | seeds | updates | PoV % | sentence BLEU | corpus BLEU |", "|---|---|---|---|---|---|---|"]
    for system in dict.fromkeys(r["system"] for r in rows):
        mine = [r for r in rows if r["system"] == system]
        lines.append(f"| {system} | {mine[0]['parameters'] / 1e6:.2f}M | {len(mine)} | {_stat(mine, 'updates')} | "
                     f"{_stat(mine, 'pov', 100)} | {_stat(mine, 'sentence_bleu')} | {_stat(mine, 'bleu')} |")
    return lines


def _stat(rows: list[dict], key: str, scale: float = 1.0) -> str:
    """mean, and ± sd when there are several rows."""
    values = [scale * r[key] for r in rows]
    sd = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.2f}{sd}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, help="presets to compare")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], help="one round of every system per seed")
    parser.add_argument("--max-steps", type=int, required=True, help="update budget of every run")
    parser.add_argument("--max-minutes", type=float, default=10.0, help="wall-clock cap of every run")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for training and translation")
    parser.add_argument("--limit", type=int, default=0, help="score only the first N held-out examples (0: all)")
    parser.add_argument("--name", default="codegen_quality", help="results file bench/results/<name>.json")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra --set for every run")
    args = parser.parse_args()

    runs = work_dir() / args.name
    runs.mkdir(parents=True, exist_ok=True)
    data = prepared_data(runs / "prepare.log")
    rows: list[dict] = []
    amp = {system: preset_amp(system, args.overrides) for system in args.systems}
    env = environment(amp=amp)  # the commit the runs start from (HEAD may move while they run)
    for seed in args.seeds:
        for system in args.systems:
            row = run_system(system, seed, data, runs, args)
            rows.append(row)
            save_results(args.name, {"environment": env, "budget": {
                "max_steps": args.max_steps, "max_minutes": args.max_minutes, "threads": args.threads,
                "limit": args.limit, "overrides": args.overrides}, "data": str(data), "rows": rows,
                "summary": summary(rows)})
            print(json.dumps({k: v for k, v in row.items() if k != "best_valid"}), flush=True)
    print("\n".join(["", *summary(rows)]))


if __name__ == "__main__":
    main()
