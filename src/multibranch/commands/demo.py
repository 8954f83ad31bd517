"""`multibranch demo`: the whole pipeline on the built-in synthetic task, offline, in a few minutes."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "generate the built-in synthetic task, prepare it, train a small MAT for a few minutes, report BLEU"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("multibranch-demo"),
                        help="working directory")
    parser.add_argument("--minutes", type=float, default=3.5, help="training budget in minutes")
    parser.add_argument("--preset", default="demo", help="model preset (demo: a small MAT)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the task generator, SentencePiece and training")
    parser.add_argument("--force", action="store_true", help="replace an existing --out directory")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="preset override, e.g. train.max_steps=500 (repeatable)")


def run(args: argparse.Namespace) -> int:
    import shutil
    import time

    from multibranch.errors import UserError
    from multibranch.experiment import resolve_config
    from multibranch.tasks import train
    from multibranch.tasks.translation.heldout import translate_split
    from multibranch.tasks.translation.prepare import PrepareConfig, prepare
    from multibranch.tasks.translation.synthetic import generate_synthetic_task
    from multibranch.tasks.translation.translator import show_progress
    from multibranch.train.trainer import RunOptions

    out: Path = args.out
    if out.exists() and any(out.iterdir()):
        if not args.force:
            raise UserError(f"{out} already exists; pass --force to replace it or --out to choose another directory")
        shutil.rmtree(out)
    started = time.perf_counter()
    print(f"[1/4] generating the synthetic task in {out / 'raw'}", flush=True)
    task = generate_synthetic_task(out / "raw", seed=args.seed)
    print(f"      {task['sizes']['train']} training pairs, lexicon of {task['lexicon']['lemmas']} lemmas "
          f"({task['lexicon']['src_forms']} source / {task['lexicon']['tgt_forms']} target word forms)", flush=True)

    print("[2/4] preparing: SentencePiece + binarised data", flush=True)
    prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(out / "raw" / "train"),
                          valid=str(out / "raw" / "valid"), test=[str(out / "raw" / "test")],
                          out=str(out / "data"), vocab_size=1000, seed=args.seed))

    cfg = resolve_config(args.preset, None, [f"train.max_minutes={args.minutes}", f"train.seed={args.seed}",
                                             *args.overrides])
    print(f"[3/4] training preset {args.preset!r} for up to {cfg.train.max_minutes} minutes "
          f"(log: {out / 'run' / 'train.log'})", flush=True)
    state = train(cfg, RunOptions(data_dir=out / "data", run_dir=out / "run", progress=None))

    print("[4/4] translating the test set with the best checkpoint (by validation loss)", flush=True)
    result = translate_split(out / "run" / "best.pt", out / "data", "test", hyp_file=out / "run" / "test.hyp.txt",
                             progress=show_progress())  # a bar on a terminal
    scores = result.scores
    print()
    for src, hyp, ref in list(zip(result.sources, result.hypotheses, result.references))[:5]:
        print(f"  source:      {src}\n  translation: {hyp}\n  reference:   {ref}\n")
    print(f"test BLEU = {scores['bleu']['score']:.2f}   {scores['bleu']['signature']}")
    print(f"test chrF = {scores['chrf']['score']:.2f}   {scores['chrf']['signature']}")
    print(f"{state.step} updates in {state.elapsed / 60:.1f} min; everything took {(time.perf_counter() - started) / 60:.1f} min")
    print(f"run directory: {out / 'run'} (config.yaml, best.pt, last.pt, metrics.jsonl, train.log, test.hyp.txt)")
    return 0
