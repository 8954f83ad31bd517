"""`multibranch average`: average the weights of several checkpoints.

    multibranch average --run RUN --last 5 [--upper-bound STEP] --out avg.pt
    multibranch average --run RUN --best 5 --out avg.pt          (by validation BLEU, else accuracy, else loss)
    multibranch average --ckpts a.pt b.pt c.pt --out avg.pt

float64 accumulation; model config, tokenizer, keys and shapes must agree; the checkpoints must
share an origin (one run, or runs fine-tuned from one checkpoint) unless --force; integer buffers come from
the newest checkpoint; the result is weights-only (evaluate it before trusting it: averaging does
not always help).
"""

from __future__ import annotations

import argparse

HELP = "average checkpoints (last N / best N of a run, or an explicit list) into one weights-only checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="run directory (uses RUN/checkpoints/step_*.pt)")
    source.add_argument("--ckpts", nargs="+", metavar="CKPT", help="checkpoint files to average")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--last", type=int, metavar="N", help="the N newest checkpoints of --run")
    which.add_argument("--best", type=int, metavar="N", help="the N best checkpoints of --run (valid BLEU, else accuracy, else loss)")
    parser.add_argument("--upper-bound", type=int, metavar="STEP", help="ignore checkpoints after this step")
    parser.add_argument("--out", required=True, help="averaged checkpoint to write")
    parser.add_argument("--force", action="store_true",
                        help="overwrite --out, and average checkpoints of unrelated runs (different origin) with a warning")


def run(args: argparse.Namespace) -> int:
    from multibranch.convert.average import average_to_file

    result = average_to_file(args.out, checkpoints=args.ckpts, run=args.run, last=args.last, best=args.best,
                             upper_bound=args.upper_bound, force=args.force)
    print(f"wrote {result.path}: average of {len(result.sources)} checkpoints: "
          f"{', '.join(str(p) for p in result.sources)}")
    return 0
