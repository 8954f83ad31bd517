"""`prepare` at scale: throughput and peak memory on synthetic corpora of growing size, beside
SentencePiece's own batched encoder (the floor of the tokenisation step), and `train`'s start on the
largest one's shards.

    python bench/prepare_scale.py                        # 0.5M, 2M and 8M pairs (hours on a small machine)
    python bench/prepare_scale.py --sizes 20000,80000    # what a shared 2-core box can afford
    python bench/prepare_scale.py --tiny                 # seconds; the test suite runs this

For each size N a corpus of N pairs is generated on the fly into the scratch directory (never into the
repository; each line joins two sentences of tasks/translation/synthetic.py's grammar), then each step
runs in a fresh process that reports its wall time and its own peak RSS:

    prepare        `prepare` as the CLI runs it: scan, SentencePiece on a sample, encode, write shards
    prepare-reuse  `prepare --spm-model` with the model the first run trained: the same pipeline without
                   the training, so its pairs/s compares with the floor on equal terms
    spm-encode     sentencepiece's batched `encode(num_threads=workers)` over the same two files, read
                   in the same chunks, ids discarded: the tokenisation floor on the same cores
    train          `train` of a tiny model for 2 updates on the shards: seconds from the call until it has
                   finished (loading the shards, planning the epoch's batches, 2 updates, a validation
                   on 1000 pairs, checkpoints), and peak RSS
    train-long     the same for `--train-updates` updates (default 300; 0 skips it): peak RSS once many
                   batches have been read from all over the corpus, not just at the start

Goals checked (memory flat in corpus size, speed near SentencePiece's encoder, a fast train start): peak RSS of `prepare` at the largest size within 1.2x of the smallest and under
2 GB; prepare-reuse pairs/s >= 0.8x spm-encode; train done in < 30 s at the largest size, and train-long's
peak RSS (train's without it) within 1.2x of the smallest size's. Results go to
bench/results/NAME.json with the environment block.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "src")]

from bench.common import environment, run_isolated, save_results, work_dir  # noqa: E402

GOALS = {"rss_growth": 1.2, "rss_mb": 2048.0, "floor_ratio": 0.8, "train_start_s": 30.0}
TINY = {"sizes": [2000, 6000], "vocab_size": 200, "spm_sample": 3000, "shard_pairs": 2500, "train_updates": 4}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def worker_peak_rss_mb() -> float:
    """The largest peak RSS among prepare's finished encoding workers: forked children of this process, or
    (where it ran other threads) of the multiprocessing fork server, which count in this process's
    RUSAGE_CHILDREN once the server has been stopped and waited for."""
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # no public way to stop it; the next pool starts a new one
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


# ----------------------------------------------------------------------------- steps (one process each)


def generate(directory: Path, pairs: int, seed: int = 1) -> dict[str, Any]:
    """Write train (`pairs` lines) and valid (1000 lines) .src/.tgt files, streaming."""
    from multibranch.tasks.translation.synthetic import Grammar, build_lexicon

    directory.mkdir(parents=True, exist_ok=True)
    grammar = Grammar(build_lexicon(seed))
    rng = random.Random(f"prepare-scale:{seed}")
    start = time.perf_counter()
    for name, n in (("train", pairs), ("valid", 1000)):
        with open(directory / f"{name}.src", "w", encoding="utf-8") as src, \
                open(directory / f"{name}.tgt", "w", encoding="utf-8") as tgt:
            for _ in range(n):
                (s1, t1), (s2, t2) = grammar.sentence(rng), grammar.sentence(rng)
                src.write(f"{s1} {s2}\n")
                tgt.write(f"{t1} {t2}\n")
    return {"seconds": time.perf_counter() - start, "bytes": sum(p.stat().st_size for p in directory.iterdir())}


def run_prepare(corpus: Path, out: Path, args: argparse.Namespace, spm_model: str | None) -> dict[str, Any]:
    from multibranch.data.parallel_prepare import PrepareConfig
    from multibranch.tasks.translation.prepare import prepare

    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    meta = prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(corpus / "train"),
                                 valid=str(corpus / "valid"), out=str(out), vocab_size=args.vocab_size,
                                 spm_max_sentences=args.spm_sample, shard_pairs=args.shard_pairs,
                                 workers=args.workers, spm_model=spm_model, chunk_lines=args.chunk_lines,
                                 progress=False))
    seconds = time.perf_counter() - start
    lines = meta["splits"]["train"]["lines"] + meta["splits"]["valid"]["lines"]
    return {"seconds": seconds, "pairs_per_s": lines / seconds, "peak_rss_mb": peak_rss_mb(),
            "worker_peak_rss_mb": worker_peak_rss_mb(), "shards": len(meta["splits"]["train"]["shards"]),
            "pairs_kept": meta["splits"]["train"]["pairs"]}


def run_spm_encode(corpus: Path, model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """SentencePiece's batched encoder over the same files, chunk by chunk, in `workers` threads."""
    import itertools

    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model))
    threads = args.workers or os.cpu_count() or 1
    start = time.perf_counter()
    lines = 0
    for name in ("train", "valid"):
        for side in ("src", "tgt"):
            with open(corpus / f"{name}.{side}", encoding="utf-8") as handle:
                while chunk := list(itertools.islice(handle, args.chunk_lines)):
                    processor.encode([line.rstrip("\n") for line in chunk], num_threads=threads)
                    lines += len(chunk) if side == "src" else 0
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "pairs_per_s": lines / seconds, "peak_rss_mb": peak_rss_mb()}


def run_train(data: Path, run: Path, updates: int) -> dict[str, Any]:
    from multibranch.config import from_dict
    from multibranch.experiment import ExperimentConfig
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions

    shutil.rmtree(run, ignore_errors=True)
    model = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 1, "decoder_layers": 1}
    cfg = from_dict(ExperimentConfig, {"model": model, "train": {
        "max_tokens": 4096, "max_steps": updates, "valid_every": 1000, "log_every": 1, "valid_bleu": False}})
    start = time.perf_counter()
    train(cfg, RunOptions(data, run, device="cpu", progress=False))
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": peak_rss_mb()}


# ------------------------------------------------------------------------------------------ driver


def step(kind: str, args: argparse.Namespace, **paths: str) -> dict[str, Any]:
    """Run one step in a fresh process (its own peak RSS)."""
    argv = [str(Path(__file__)), "--step", kind, "--vocab-size", str(args.vocab_size), "--spm-sample",
            str(args.spm_sample), "--shard-pairs", str(args.shard_pairs), "--workers", str(args.workers),
            "--chunk-lines", str(args.chunk_lines), "--train-updates", str(args.train_updates)]
    for key, value in paths.items():
        argv += [f"--{key}", value]
    return run_isolated(argv)


def best_of(kind: str, args: argparse.Namespace, **paths: str) -> dict[str, Any]:
    """The fastest of `args.repeat` runs of a step (a shared machine adds noise, never speed)."""
    return min((step(kind, args, **paths) for _ in range(args.repeat)), key=lambda row: row["seconds"])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.dir) if args.dir else work_dir() / "prepare-scale"
    rows = []
    for size in args.sizes:
        corpus, out = root / f"corpus-{size}", root / f"data-{size}"
        if not (corpus / "valid.tgt").is_file():
            generate_result = step("generate", args, corpus=str(corpus), pairs=str(size))
            print(f"generated {size} pairs in {generate_result['seconds']:.1f}s", file=sys.stderr)
        row: dict[str, Any] = {"pairs": size, "prepare": best_of("prepare", args, corpus=str(corpus), out=str(out))}
        row["prepare_reuse"] = best_of("prepare-reuse", args, corpus=str(corpus), out=str(root / f"reuse-{size}"),
                                       model=str(out / "spm.model"))
        row["spm_encode"] = best_of("spm-encode", args, corpus=str(corpus), model=str(out / "spm.model"))
        row["reuse_vs_floor"] = row["prepare_reuse"]["pairs_per_s"] / row["spm_encode"]["pairs_per_s"]
        row["train"] = step("train", args, out=str(out), run=str(root / f"run-{size}"))
        if args.train_updates:
            row["train_long"] = step("train-long", args, out=str(out), run=str(root / f"run-{size}"))
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    train_row = rows[-1]["train"]
    rss_key = "train_long" if args.train_updates else "train"  # RSS after many batches, where measured
    train_growth = rows[-1][rss_key]["peak_rss_mb"] / rows[0][rss_key]["peak_rss_mb"]
    smallest, biggest = rows[0]["prepare"]["peak_rss_mb"], rows[-1]["prepare"]["peak_rss_mb"]
    first_worker = rows[0]["prepare"]["worker_peak_rss_mb"]  # 0: encoded in the main process (--workers 1)
    worker_growth = rows[-1]["prepare"]["worker_peak_rss_mb"] / first_worker if first_worker else None
    goals = {
        "rss_growth": {"value": biggest / smallest, "goal": f"<= {GOALS['rss_growth']}",
                       "met": biggest / smallest <= GOALS["rss_growth"]},
        "worker_rss_growth": {"value": worker_growth, "goal": f"<= {GOALS['rss_growth']}",
                              "met": None if worker_growth is None else worker_growth <= GOALS["rss_growth"]},
        "rss_mb": {"value": biggest, "goal": f"< {GOALS['rss_mb']}", "met": biggest < GOALS["rss_mb"]},
        "floor_ratio": {"value": min(r["reuse_vs_floor"] for r in rows), "goal": f">= {GOALS['floor_ratio']}",
                        "met": min(r["reuse_vs_floor"] for r in rows) >= GOALS["floor_ratio"]},
        "train_start_s": {"value": train_row["seconds"], "goal": f"< {GOALS['train_start_s']}",
                          "met": train_row["seconds"] < GOALS["train_start_s"]},
        "train_rss_growth": {"value": train_growth, "goal": f"<= {GOALS['rss_growth']}",
                             "met": train_growth <= GOALS["rss_growth"]},
    }
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return {"environment": environment(amp="none"), "workers": args.workers or os.cpu_count(),
            "settings": {k: getattr(args, k) for k in ("vocab_size", "spm_sample", "shard_pairs", "chunk_lines",
                                                       "repeat", "train_updates")},
            "sizes": rows, "goals": goals}


def table(result: dict[str, Any]) -> str:
    lines = ["| pairs | prepare pairs/s | prepare peak RSS MB (worker) | prepare --spm-model pairs/s "
             "| spm encode pairs/s | reuse / floor | shards | train s | train peak RSS MB "
             "| train-long updates | train-long peak RSS MB |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["sizes"]:
        p, r, f, t = row["prepare"], row["prepare_reuse"], row["spm_encode"], row["train"]
        long = row.get("train_long")
        long_updates = result["settings"].get("train_updates", "–") if long else "–"
        long_rss = f"{long['peak_rss_mb']:.0f}" if long else "–"
        lines.append(f"| {row['pairs']} | {p['pairs_per_s']:.0f} | {p['peak_rss_mb']:.0f} "
                     f"({p['worker_peak_rss_mb']:.0f}) | {r['pairs_per_s']:.0f} "
                     f"| {f['pairs_per_s']:.0f} | {row['reuse_vs_floor']:.2f} | {p['shards']} | {t['seconds']:.1f} "
                     f"| {t['peak_rss_mb']:.0f} | {long_updates} | {long_rss} |")
    for name, goal in result["goals"].items():
        if goal["value"] is None:
            lines.append(f"- {name}: n/a (no encoding workers)")
            continue
        lines.append(f"- {name}: {goal['value']:.2f} (goal {goal['goal']}): {'met' if goal['met'] else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500000,2000000,8000000", help="comma-separated corpus sizes (pairs)")
    parser.add_argument("--tiny", action="store_true", help="seconds-long run on tiny corpora (the test)")
    parser.add_argument("--workers", type=int, default=0,
                        help="prepare's encoding processes and the floor's encoder threads (0: all cores)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--spm-sample", type=int, default=1_000_000)
    parser.add_argument("--shard-pairs", type=int, default=500_000)
    parser.add_argument("--chunk-lines", type=int, default=10_000, help="pairs read and encoded together")
    parser.add_argument("--repeat", type=int, default=1, help="run each timed step N times, keep the fastest")
    parser.add_argument("--train-updates", type=int, default=300,
                        help="updates of the train-long step, whose peak RSS is the train goal's (0: skip it)")
    parser.add_argument("--dir", help="scratch directory (default: runs/bench/prepare-scale)")
    parser.add_argument("--keep", action="store_true", help="keep the generated corpora and data directories")
    parser.add_argument("--name", default="prepare_scale", help="results file bench/results/NAME.json")
    parser.add_argument("--no-save", action="store_true", help="print the results, write no results file")
    internal = parser.add_argument_group("one step in this process (used by the driver)")
    internal.add_argument("--step", choices=["generate", "prepare", "prepare-reuse", "spm-encode", "train",
                                             "train-long"])
    for name in ("corpus", "out", "model", "run", "pairs"):
        internal.add_argument(f"--{name}")
    args = parser.parse_args(argv)
    if args.tiny:
        args.sizes = ",".join(map(str, TINY["sizes"]))
        args.vocab_size, args.spm_sample, args.shard_pairs = TINY["vocab_size"], TINY["spm_sample"], TINY["shard_pairs"]
        args.train_updates = TINY["train_updates"]
    args.sizes = [int(s) for s in str(args.sizes).split(",")]
    if args.step is not None:
        result = {
            "generate": lambda: generate(Path(args.corpus), int(args.pairs or 0)),
            "prepare": lambda: run_prepare(Path(args.corpus), Path(args.out), args, None),
            "prepare-reuse": lambda: run_prepare(Path(args.corpus), Path(args.out), args, args.model),
            "spm-encode": lambda: run_spm_encode(Path(args.corpus), Path(args.model), args),
            "train": lambda: run_train(Path(args.out), Path(args.run), 2),
            "train-long": lambda: run_train(Path(args.out), Path(args.run), args.train_updates),
        }[args.step]()
        print(json.dumps(result))
        return 0
    result = measure(args)
    print(table(result))
    if not args.no_save:
        print(f"saved {save_results(args.name, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
