"""Multi30k En->De quality at a fixed CPU budget: every preset trained for the same wall-clock minutes.

For each system: `multibranch train` (fresh process, 2 threads) for --minutes, then translate
test_2016_flickr with the best checkpoint (by validation loss) and with the average of the last 3
step checkpoints, and score with sacreBLEU (signature recorded). `mat-proximal` spends half the
budget on a standard model of the MAT's width and half on the MAT initialised from it
(`multibranch convert proximal`). `hf-marian` trains Hugging Face MarianMTModel of the
transformer-tiny size with the same batches, schedule and budget (bench/hf_marian_train.py).
Run on an otherwise idle machine: the budget is wall-clock time.

    python bench/quality.py --minutes 20 --systems transformer-tiny mat-tiny mat-proximal ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    RESULTS,
    checkpoint_parameters,
    cpu_model,
    environment,
    multi30k_data,
    preset_amp,
    run_metrics,
    work_dir,
)

PROXIMAL_SOURCE = ["--set", "model.encoder.attention_branches=1", "--set", "model.decoder.attention_branches=1",
                   "--set", "model.encoder.drop_branch=0.0", "--set", "model.decoder.drop_branch=0.0"]


def sh(args: list[str], log: Path) -> None:
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(args)}\n")
        handle.flush()
        result = subprocess.run(args, stdout=handle, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise RuntimeError(f"command failed (see {log}): {' '.join(args)}")


def train(preset: str, data: Path, run: Path, minutes: float, log: Path, extra: list[str]) -> None:
    sh(["multibranch", "train", "--preset", preset, "--data", str(data), "--out", str(run), "--force",
        "--no-progress", "--max-minutes", str(minutes), *extra], log)


def score(ckpt: Path, data: Path, log: Path) -> dict:
    src, ref = data / "test.src.txt", data / "test.tgt.txt"
    hyp = ckpt.with_suffix(".test.hyp")
    start = time.perf_counter()
    sh(["multibranch", "translate", "--ckpt", str(ckpt), "-i", str(src), "-o", str(hyp), "--device", "cpu"], log)
    seconds = time.perf_counter() - start
    out = ckpt.with_suffix(".test.json")
    sh(["multibranch", "evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json", str(out)], log)
    scores = json.loads(out.read_text())
    return {"bleu": scores["bleu"]["score"], "chrf": scores["chrf"]["score"],
            "signature": scores["bleu"]["signature"], "translate_s": seconds}


def summarize_run(run: Path) -> dict:
    records = run_metrics(run)
    train_records = [r for r in records if r["type"] == "train"]
    valid = [r for r in records if r["type"] == "valid"]
    if not train_records:
        raise RuntimeError(f"{run}/metrics.jsonl has no train records (lower train.log_every)")
    last = train_records[-1]
    seconds = sum(r["tokens"] / r["tokens_per_s"] for r in train_records)
    return {"updates": max(r["step"] for r in records), "epochs_started": last["epoch"],
            "train_minutes": last["elapsed_s"] / 60, "tokens_per_s": sum(r["tokens"] for r in train_records) / seconds,
            "best_valid_loss": min((r["loss"] for r in valid if r["loss"] is not None), default=None)}


def run_system(system: str, data: Path, runs: Path, minutes: float, extra: list[str]) -> dict:
    run = runs / system
    run.mkdir(parents=True, exist_ok=True)
    log = runs / f"{system}.log"
    log.write_text("")
    if system == "hf-marian":
        sh([sys.executable, str(Path(__file__).parent / "hf_marian_train.py"), "--data", str(data), "--out", str(run),
            "--minutes", str(minutes)], log)
        result = json.loads((run / "result.json").read_text())
        return {"system": system, **result}
    if system == "mat-proximal":
        source = runs / "mat-proximal-source"
        train("mat-tiny", data, source, minutes / 2, log, PROXIMAL_SOURCE + extra)
        init = run / "proximal-init.pt"
        sh(["multibranch", "convert", "proximal", "--ckpt", str(source / "best.pt"), "--out", str(init), "--force",
            "--branches", "2", "--drop-branch", "0.1"], log)
        train("mat-tiny", data, run, minutes / 2, log, ["--init-from", str(init), *extra])
    else:
        train(system, data, run, minutes, log, extra)
    kept = sorted((run / "checkpoints").glob("step_*.pt"))[-3:]
    avg = run / "avg_last3.pt"
    sh(["multibranch", "average", "--ckpts", *map(str, kept), "--out", str(avg), "--force"], log)
    return {"system": system, "parameters": checkpoint_parameters(run / "best.pt"), **summarize_run(run),
            "best": score(run / "best.pt", data, log), "avg_last3": score(avg, data, log)}


def system_amp(system: str, overrides: list[str]) -> str:
    """The autocast a system trains with here: hf-marian fp32 (bench/hf_marian_train.py), mat-proximal
    mat-tiny's, a preset its `train.amp` after the --set overrides."""
    if system == "hf-marian":
        return "none"
    return preset_amp("mat-tiny" if system == "mat-proximal" else system, overrides)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", required=True)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--name", default="quality", help="results file bench/results/<name>.json; runs in <bench work dir>/<name>/")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra --set for every run")
    args = parser.parse_args()
    data = multi30k_data()
    runs = work_dir() / args.name
    extra = [x for o in args.overrides for x in ("--set", o)]
    path = RESULTS / f"{args.name}.json"
    results = json.loads(path.read_text())["rows"] if path.exists() else []
    amp = {system: system_amp(system, args.overrides) for system in args.systems}
    for system in args.systems:
        row = run_system(system, data, runs, args.minutes, extra)
        row["minutes_budget"] = args.minutes
        row["cpu_model"], row["amp"] = cpu_model(), amp[system]
        results = [r for r in results if r["system"] != system] + [row]
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"environment": environment(amp=amp), "rows": results}, indent=2) + "\n")
        print(json.dumps(row), flush=True)
    print("\n| system | params | updates | tok/s | test BLEU (best) | test BLEU (avg last 3) | chrF |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        avg = r.get("avg_last3", {}).get("bleu")
        print(f"| {r['system']} | {r.get('parameters', 0) / 1e6:.2f}M | {r.get('updates')} | {r.get('tokens_per_s', 0):.0f} | "
              f"{r['best']['bleu']:.2f} | {avg if avg is None else f'{avg:.2f}'} | {r['best']['chrf']:.2f} |")


if __name__ == "__main__":
    main()
