"""`multibranch analyze`: analyses of a trained checkpoint, each written as a report folder
(JSON numbers, PNG plots, index.md).

    multibranch analyze heads --ckpt X.pt --data PREPARED_DIR --out REPORT_DIR [--split valid]
        [--max-examples N] [--no-normalize] [--bleu-split test] [--bleu-max-sentences N] [--beam K]
        [--step 0.1] [--recompute] [--keep-one] [--no-curve] [--no-dominant] [--force]
"""

from __future__ import annotations

import argparse

HELP = "analyses of a checkpoint written as a report folder (heads: importance, entropy, pruning curve)"


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be >= 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    about = "head importance (Michel et al.), attention entropy, pruning curve, dominant heads (SEEDS-SPEC §5.5)"
    p = sub.add_parser("heads", help=about, description=about)
    p.add_argument("--ckpt", required=True, help="checkpoint to analyse")
    p.add_argument("--data", required=True, help="the prepared data directory the model was trained on")
    p.add_argument("--out", required=True, help="report directory (must be empty or new unless --force)")
    p.add_argument("--split", default="valid", help="importance and entropy set")
    p.add_argument("--max-examples", type=positive_int, default=None, help="use only the first N examples of --split")
    p.add_argument("--max-tokens", type=positive_int, default=4096, help="padded tokens per batch")
    p.add_argument("--no-normalize", action="store_true", help="do not l2-normalise importance per module")
    p.add_argument("--bleu-split", default=None, help="split translated for BLEU (default: --split)")
    p.add_argument("--bleu-max-sentences", type=positive_int, default=None, help="translate only its first N sentences")
    p.add_argument("--beam", type=positive_int, default=None, help="beam size (default: the checkpoint's)")
    p.add_argument("--step", type=float, default=0.1, help="pruning-curve step as a fraction of all heads")
    p.add_argument("--recompute", action="store_true", help="recompute importance after every pruning step")
    p.add_argument("--keep-one", action="store_true", help="never mask the last head of a module")
    p.add_argument("--no-curve", action="store_true", help="skip the pruning curve")
    p.add_argument("--no-dominant", action="store_true",
                   help="skip the dominant-head table (one translation of the BLEU set per head)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")
    p.set_defaults(analysis_run=_heads)


def run(args: argparse.Namespace) -> int:
    return int(args.analysis_run(args) or 0)


def _heads(args: argparse.Namespace) -> int:
    from multibranch.analysis.head_report import HeadAnalysisOptions, analyze_heads
    from multibranch.cli import UserError
    from multibranch.device import resolve_device

    if not 0.0 < args.step <= 1.0:
        raise UserError(f"--step {args.step} must be in (0, 1]")
    resolve_device(args.device)  # ConfigError for a device this machine cannot use, before any work

    options = HeadAnalysisOptions(
        split=args.split, max_examples=args.max_examples, max_tokens=args.max_tokens, normalize=not args.no_normalize,
        bleu_split=args.bleu_split, bleu_max_sentences=args.bleu_max_sentences, beam=args.beam,
        curve=not args.no_curve, step=args.step, recompute=args.recompute, keep_one=args.keep_one,
        dominant=not args.no_dominant, device=args.device,
    )
    folder = analyze_heads(args.ckpt, args.data, args.out, options, force=args.force)
    print(f"wrote {folder.path}: {', '.join(folder.files)}")
    return 0
