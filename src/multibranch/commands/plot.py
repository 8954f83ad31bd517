"""`multibranch plot RUN`: a run's curves as a report folder (default RUN/plots).

    multibranch plot RUN [--out DIR] [--window 10] [--points 200] [--force]

See analysis/run_plots.py for the folder's contents (`train --plots` writes the same folder).
"""

from __future__ import annotations

import argparse

HELP = "plot a training run: loss/ppl/lr/BLEU/tokens-per-s, logged module metrics (smoothed), rate schedules"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="training run directory (metrics.jsonl, config.yaml)")
    parser.add_argument("--out", default=None, help="report directory (default RUN/plots)")
    parser.add_argument("--window", type=int, default=10, help="moving-average window of the module metrics (records)")
    parser.add_argument("--points", type=int, default=200, help="points per schedule curve")
    parser.add_argument("--force", action="store_true", help="write into a non-empty --out")


def run(args: argparse.Namespace) -> int:
    from multibranch.errors import UserError
    from multibranch.figures.run_plots import EmptyRunError, plot_run

    if args.window < 1 or args.points < 2:
        raise UserError("--window must be >= 1 and --points >= 2")
    try:
        folder = plot_run(args.run, args.out, args.window, args.points, args.force)
    except EmptyRunError as error:
        raise UserError(str(error)) from None
    print(f"wrote {folder.path}: {', '.join(folder.files)}")
    return 0
