"""Every analysis of the papers' results sections (head importance and pruning, MUTE diversity, MUSE gates,
BLEU by length) on the trained Multi30k checkpoints, as report folders.

    python bench/analysis_multi30k.py [--runs DIR] [--data DIR] [--out DIR] [--threads 1]
        [--importance-examples 500] [--score-sentences 200] [--length-sentences 1000] [--length-buckets 8,12,16,20,25] [--beam K] [--step 0.1]

Inputs: RUNS/{transformer,drophead,muse,mute,mute-bias,mute-bias-seq}/best.pt (--runs, env
MULTIBRANCH_M30K_RUNS, default ../runs/m30k next to the clone, like bench/common.py's data) and the prepared data they were trained on (--data,
env MULTIBRANCH_M30K_DATA, default RUNS/data). A missing checkpoint skips the analyses that need it.

It runs, each as the `multibranch analyze ...` command it prints (all logged in OUT/commands.md):
  heads-transformer, heads-drophead  importance on the first --importance-examples of valid; pruning curve
                                     (--step) and dominant heads, BLEU on the first --score-sentences of test
  heads-compare                      both pruning curves on one figure + the dominant-head drops
  diversity-{mute,mute-bias,mute-bias-seq}, diversity-compare   MUTE eq. 21 on --importance-examples of valid
  gates-muse                         MUSE kernel-gate ratios (no data)
  lengths                            BLEU by source length, standard vs MUSE, first --length-sentences of test
  prune-select                       `prune --max-drop` of the standard model: heads removed while BLEU on the
                                     first --score-sentences of VALID stays within --max-drop (the choice)
  prune-transformer                  the heads prune-select removed, removed again and scored on the first
                                     --score-sentences of test: before/after parameters, sentences/s, BLEU
                                     (the threshold is chosen on valid, the reported score is on test)
A finished step (its index.md exists) is not redone unless --force. Then OUT/summary.json (the numbers
the doc quotes), bench/results/analysis_multi30k.json (the same) and the PNGs the doc shows copied into
docs/images/analysis/ (--images).

CPU cost is dominated by the translations: per head report, (1 + 1/step) curve points + one per head
(36 for the tiny presets), each translating --score-sentences sentences with the checkpoint's beam;
--beam 1 or fewer sentences make it proportionally cheaper. With the defaults (beam 5, 200 test sentences,
step 0.1) that is 2 x (11 + 36) + up to 11 + 6 (prune-select, on valid) + 6 (prune-transformer, on test)
+ 2 x 5 translations of 200 sentences: roughly 30-50 minutes at --threads 1 on a quiet 2-core machine
(checked, before the prune step was split in two, on the transformer checkpoint with small settings:
--importance-examples 100 --score-sentences 40 --beam 2 --step 0.25 took 7 min for heads-transformer
and 2.5 min for prune-transformer on a machine loaded ~8x, 75 s of CPU time together).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import environment, save_results  # noqa: E402

MODELS = ("transformer", "drophead", "muse", "mute", "mute-bias", "mute-bias-seq")
IMAGES = {  # report file -> name under docs/images/analysis
    "heads-compare/pruning_curves.png": "pruning_curves.png",
    "heads-compare/dominant_heads.png": "dominant_heads.png",
    "heads-transformer/importance.png": "importance_transformer.png",
    "diversity-compare/diversity.png": "mute_diversity.png",
    "gates-muse/kernel_gate_ratio.png": "muse_gate_ratio.png",
    "lengths/lengths.png": "bleu_by_length.png",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    runs = Path(os.environ.get("MULTIBRANCH_M30K_RUNS", ROOT.parent / "runs" / "m30k"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, default=runs, help="directory holding NAME/best.pt (default %(default)s)")
    p.add_argument("--data", type=Path, default=None, help="prepared data (default: $MULTIBRANCH_M30K_DATA or RUNS/data)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("MULTIBRANCH_ANALYSIS_OUT", ROOT / "runs" / "analysis")),
                   help="results directory for the report folders (default %(default)s)")
    p.add_argument("--images", type=Path, default=ROOT / "docs" / "images" / "analysis",
                   help="where the doc's PNGs are copied (default %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of every analysis (OMP_NUM_THREADS)")
    p.add_argument("--importance-examples", type=int, default=500, help="valid examples for importance/diversity")
    p.add_argument("--score-sentences", type=int, default=200, help="test sentences translated per BLEU score")
    p.add_argument("--length-sentences", type=int, default=1000, help="test sentences for BLEU by length")
    p.add_argument("--length-buckets", default="8,12,16,20,25",
                   help="inclusive upper edges of the source-length buckets (subword tokens; Multi30k sentences are short)")
    p.add_argument("--beam", type=int, default=None, help="beam size (default: each checkpoint's)")
    p.add_argument("--step", type=float, default=0.1, help="pruning-curve step (fraction of all heads)")
    p.add_argument("--max-drop", type=float, default=0.5, help="BLEU drop allowed by the prune step (points)")
    p.add_argument("--only", default=None, help="comma-separated steps to run (e.g. heads-transformer,gates-muse)")
    p.add_argument("--force", action="store_true", help="redo finished steps")
    args = p.parse_args(argv)
    if args.data is None:
        args.data = Path(os.environ.get("MULTIBRANCH_M30K_DATA", args.runs / "data"))
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, list[str], list[str]]]:
    """(step name, `multibranch` arguments, checkpoints it needs) in running order; a step is done when
    OUT/<step name>/ has an index.md (or, for prune, its report JSON)."""
    ckpt = {name: str(args.runs / name / "best.pt") for name in MODELS}
    out = args.out
    beam = ["--beam", str(args.beam)] if args.beam else []
    data = ["--data", str(args.data)]
    steps: list[tuple[str, list[str], list[str]]] = []
    for name in ("transformer", "drophead"):
        steps.append((f"heads-{name}", ["analyze", "heads", "--ckpt", ckpt[name], *data, "--out", str(out / f"heads-{name}"),
                                        "--split", "valid", "--max-examples", str(args.importance_examples),
                                        "--bleu-split", "test", "--bleu-max-sentences", str(args.score_sentences),
                                        "--step", str(args.step), *beam], [name]))
    steps.append(("heads-compare", ["analyze", "compare", "--report", str(out / "heads-transformer"), "--label", "standard",
                                     "--report", str(out / "heads-drophead"), "--label", "drophead",
                                     "--out", str(out / "heads-compare")], ["transformer", "drophead"]))
    for name in ("mute", "mute-bias", "mute-bias-seq"):
        steps.append((f"diversity-{name}", ["analyze", "diversity", "--ckpt", ckpt[name], *data, "--split", "valid",
                                            "--max-examples", str(args.importance_examples),
                                            "--out", str(out / f"diversity-{name}")], [name]))
    mutes = ("mute", "mute-bias", "mute-bias-seq")
    steps.append(("diversity-compare", ["analyze", "compare",
                                        *[x for n in mutes for x in ("--report", str(out / f"diversity-{n}"), "--label", n)],
                                        "--out", str(out / "diversity-compare")], list(mutes)))
    steps.append(("gates-muse", ["analyze", "gates", "--ckpt", ckpt["muse"], "--out", str(out / "gates-muse")], ["muse"]))
    steps.append(("lengths", ["analyze", "lengths", "--ckpt", ckpt["transformer"], "--label", "standard",
                              "--ckpt", ckpt["muse"], "--label", "muse", *data, "--split", "test",
                              "--max-sentences", str(args.length_sentences), "--buckets", args.length_buckets, *beam,
                              "--out", str(out / "lengths")],
                  ["transformer", "muse"]))
    select, prune = out / "prune-select", out / "prune-transformer"
    steps.append(("prune-select", ["prune", "--ckpt", ckpt["transformer"], *data, "--max-drop", str(args.max_drop),
                                   "--split", "valid", "--max-examples", str(args.importance_examples),
                                   "--score-split", "valid", "--max-sentences", str(args.score_sentences),
                                   "--step", str(args.step), *beam, "--out", str(select / "pruned.pt"),
                                   "--report", str(select / "index.json")], ["transformer"]))
    steps.append(("prune-transformer", ["prune", "--ckpt", ckpt["transformer"], *data,
                                        "--heads-json", str(select / "heads.json"),
                                        "--score-split", "test", "--max-sentences", str(args.score_sentences), *beam,
                                        "--out", str(prune / "pruned.pt"), "--report", str(prune / "index.json")],
                  ["transformer"]))
    return steps


def write_selected_heads(out: Path) -> bool:
    """OUT/prune-select/heads.json: the heads the valid-split walk removed, for `prune --heads-json`."""
    report = out / "prune-select" / "index.json"
    if not report.is_file():
        return False
    removed = json.loads(report.read_text(encoding="utf-8"))["removed"]
    (out / "prune-select" / "heads.json").write_text(json.dumps(removed) + "\n", encoding="utf-8")
    return True


def finished(folder: Path) -> bool:
    return (folder / "index.md").is_file() or (folder / "index.json").is_file()


def summarize(out: Path) -> dict[str, Any]:
    """The numbers the doc quotes, read from the report folders that exist."""
    def read(path: str) -> Any:
        file = out / path
        return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None

    summary: dict[str, Any] = {}
    prune, select = read("prune-transformer/index.json"), read("prune-select/index.json")
    if prune:
        summary["prune"] = {k: prune.get(k) for k in ("parameters", "before", "after", "score_change",
                                                      "speedup", "identical_outputs")}
        summary["prune"]["removed_heads"] = len(prune["removed"])
        summary["prune"]["score_split"] = "test"
        if select:  # the choice, made on valid
            summary["prune"]["selection"] = {**select["selection"], "score_split": "valid",
                                             "valid_before": select["before"]["score"],
                                             "valid_after": select["after"]["score"]}
    heads = read("heads-compare/compare.json")
    if heads:
        summary["pruning"] = {m["label"]: {"baseline": m["baseline"],
                                           "curve": [[p["fraction"], p["score"]] for p in m["curve"]],
                                           "mean_dominant_delta": m["mean_dominant_delta"]} for m in heads["models"]}
    diversity = read("diversity-compare/compare.json")
    if diversity:
        summary["mute_diversity"] = {m["label"]: m["mean"] for m in diversity["models"]}
    gates = read("gates-muse/gates.json")
    if gates:
        summary["muse_gate_ratio"] = [{"name": g["name"], "ratio": g["ratio"], "weights": g["weights"],
                                       "kernel_sizes": g["kernel_sizes"]} for g in gates["kernel_gates"]]
    lengths = read("lengths/lengths.json")
    if lengths:
        summary["bleu_by_length"] = {m["label"]: {"bleu": m["bleu"], "buckets": [[b["label"], b["sentences"], b["bleu"]]
                                                                                for b in m["buckets"]]}
                                     for m in lengths["models"]}
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.data / "data.json").is_file():
        sys.exit(f"no prepared data at {args.data} (give --data or MULTIBRANCH_M30K_DATA)")
    only = set(args.only.split(",")) if args.only else None
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    args.out.mkdir(parents=True, exist_ok=True)
    log: list[dict[str, Any]] = []
    for name, cli, needs in plan(args):
        if only is not None and name not in only:
            continue
        missing = [n for n in needs if not (args.runs / n / "best.pt").is_file()]
        folder = args.out / name
        command = [sys.executable, "-m", "multibranch", *cli, "--force"]
        entry: dict[str, Any] = {"step": name, "command": " ".join(["multibranch", *cli])}
        if missing:
            entry["skipped"] = f"no checkpoint for {', '.join(missing)}"
        elif finished(folder) and not args.force:
            entry["skipped"] = "done before (use --force to redo)"
        elif name == "prune-transformer" and not write_selected_heads(args.out):
            entry["skipped"] = "no prune-select report to take the heads from"
        else:
            print(f"[{time.strftime('%H:%M:%S')}] {name}: {entry['command']}", flush=True)
            start = time.perf_counter()
            result = subprocess.run(command, env=env, cwd=ROOT)
            entry["seconds"] = round(time.perf_counter() - start, 1)
            if result.returncode != 0:
                entry["failed"] = result.returncode
        print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in entry.items() if k not in ("step", "command")), flush=True)
        log.append(entry)

    lines = ["# Commands of bench/analysis_multi30k.py", "", f"threads={args.threads}", ""]
    lines += [f"- `{e['step']}`: `{e['command']}`" + (f" ({e['seconds']} s)" if "seconds" in e else "") for e in log]
    (args.out / "commands.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = {"environment": environment(amp="none"),  # analyses and prune run without autocast
               "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "steps": log, **summarize(args.out)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    save_results("analysis_multi30k", summary)
    args.images.mkdir(parents=True, exist_ok=True)
    for source, target in IMAGES.items():
        if (args.out / source).is_file():
            shutil.copyfile(args.out / source, args.images / target)
    print(f"wrote {args.out / 'summary.json'}, {args.out / 'commands.md'}; images in {args.images}")
    return 1 if any("failed" in e for e in log) else 0


if __name__ == "__main__":
    sys.exit(main())
