"""`multibranch prune`: physically remove attention heads from a standard or MAT checkpoint
(translation model or classifier), and report parameters, speed and BLEU / accuracy before and after.

    multibranch prune --ckpt X.pt --out Y.pt --fraction 0.3 --data PREPARED_DIR [--split valid] [--max-examples N]
        [--per-example]
    multibranch prune --ckpt X.pt --out Y.pt --max-drop 0.5 --data PREPARED_DIR [--step 0.05] [--recompute]
        [--score-split valid] [--max-sentences N] [--beam K]
    multibranch prune --ckpt X.pt --out Y.pt --heads-json HEADS.json [--data PREPARED_DIR]
    (all: [--report Y.json] [--speed-rounds 3] [--device cpu] [--force])

--fraction removes that share of all heads, least important first (Michel et al. importance over
--split, l2-normalised per module; every module keeps at least one head). --max-drop walks the
pruning curve (steps of --step of all heads, least important first) and keeps the last step whose
BLEU (accuracy in % for a classifier) on --score-split is at most that many points below the
unpruned score, stopping at the first step that drops more. --heads-json names the heads: a JSON
list of [module name, head index] pairs, or an object with such a list under "masked" (a point of
`analyze heads`' pruning curve). The output is a normal weights-only checkpoint that translates
exactly like the input with those heads masked.

With --data, the report (printed, and written as JSON to --report, default Y.json) compares the
models on --score-split: parameters, the score and sentences/s (decoding or classifying the set with the
same settings, timed side by side in --speed-rounds alternating rounds; --no-speed skips the timing).
On a shared machine one round can be several times slower than the next, so the report gives each
model's median, fastest and slowest round and the range of the per-round speed-ups, and says when that
range spans x1 (no measurable change). Without --data it has the parameters only.

The work is the pruning package's (pruning/run.py); this module parses and checks the flags.
"""

from __future__ import annotations

import argparse

from multibranch.arguments import positive_int

HELP = "remove attention heads (least important fraction, BLEU threshold, or listed) and report before/after"


SPEED = ("speed: both models score the --score-split set in --speed-rounds alternating rounds (A B, B A, ...). "
         "On a shared machine one round can be several times slower than the next, so the report gives each "
         "model's median sentences/s with its fastest and slowest round, and the median and range of the "
         "per-round speed-ups; a range that spans x1 is reported as no measurable change. --no-speed skips "
         "the timing.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = SPEED
    parser.add_argument("--ckpt", required=True, help="standard or MAT checkpoint (translation or classification)")
    parser.add_argument("--out", required=True, help="pruned checkpoint to write")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--fraction", type=float, help="share of all heads to remove, least important first")
    which.add_argument("--max-drop", type=float, metavar="POINTS",
                       help="remove the least important heads while BLEU (accuracy %% for a classifier) on "
                       "--score-split stays within POINTS of the unpruned score")
    which.add_argument("--heads-json", metavar="FILE", help="heads to remove: [[module, head], ...]")
    parser.add_argument("--data", help="prepared data: importance set and report set (needed with --fraction, "
                        "--max-drop; default: none, the report then has the parameters only)")
    parser.add_argument("--split", default="valid", help="importance set")
    parser.add_argument("--max-examples", type=positive_int, default=None,
                        help="only the first N examples of --split (default: all)")
    parser.add_argument("--max-tokens", type=positive_int, default=4096, help="padded tokens per batch")
    parser.add_argument("--per-example", action="store_true", help="importance's absolute gradient per example (Michel et al.'s formula; the scores then do not "
                        "depend on --max-tokens) instead of per batch (their code)")
    parser.add_argument("--score-split", default=None, help="split scored for --max-drop and the report (default: --split)")
    parser.add_argument("--max-sentences", type=positive_int, default=None,
                        help="score (and time) only the first N sentences of --score-split (default: all)")
    parser.add_argument("--beam", type=positive_int, default=None, help="beam size (default: the checkpoint's)")
    parser.add_argument("--step", type=float, default=0.1, help="--max-drop: step of the walk, as a fraction of all heads")
    parser.add_argument("--recompute", action="store_true", help="--max-drop: recompute importance after every step")
    parser.add_argument("--speed-rounds", type=positive_int, default=3,
                        help="timed passes per model, alternating; the report gives the median with the spread "
                        "(min-max) of the rounds, and of their speed-ups")
    parser.add_argument("--no-speed", action="store_true",
                        help="score both models once, without timing (the report then has no speed)")
    parser.add_argument("--report", default=None, help="JSON report to write (default: --out with suffix .json)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--force", action="store_true", help="overwrite --out and --report")


def run(args: argparse.Namespace) -> int:
    from multibranch.pruning.report import summary
    from multibranch.pruning.run import PruneOptions, prune_checkpoint, report_path_of
    from multibranch.pruning.selection import read_heads

    options = PruneOptions(
        fraction=args.fraction, max_drop=args.max_drop, heads=read_heads(args.heads_json) if args.heads_json else None,
        heads_file=args.heads_json, data=args.data, split=args.split,
        max_examples=args.max_examples, max_tokens=args.max_tokens,
        per_example=args.per_example, score_split=args.score_split,
        max_sentences=args.max_sentences, beam=args.beam, step=args.step, recompute=args.recompute,
        speed=not args.no_speed, speed_rounds=args.speed_rounds, device=args.device,
    )
    options.validate()
    report_path = report_path_of(args.out, args.report)
    report = prune_checkpoint(args.ckpt, args.out, report_path, options, force=args.force)
    print(summary(report))
    print(f"wrote {args.out} and {report_path}")
    return 0
