"""`multibranch analyze`: analyses of a trained checkpoint, each written as a report folder
(JSON numbers, PNG plots, index.md).

    multibranch analyze heads --ckpt X.pt --data PREPARED_DIR --out REPORT_DIR [--split valid]
        [--max-examples N] [--no-normalize] [--per-example] [--bleu-split test] [--bleu-max-sentences N] [--beam K]
        [--step 0.1] [--recompute] [--keep-one] [--no-curve] [--no-dominant] [--force]
    multibranch analyze lengths --ckpt A.pt [B.pt ...] [--label A B ...] --data PREPARED_DIR
        --out REPORT_DIR [--split test] [--buckets 15,30,45,60,75,90,105] [--max-sentences N] [--beam K] [--force]
    multibranch analyze gates --ckpt X.pt --out REPORT_DIR [--ratio 3,15] [--data PREPARED_DIR [--split test]
        [--max-sentences N] [--random-draws 3] [--per-module] [--beam K] [--device D]] [--force]
    multibranch analyze attention --ckpt X.pt --out REPORT_DIR (--sentences 0,5 --data PREPARED_DIR [--split valid]
        | --text "raw source" ...) [--type cross] [--layers 0,5] [--heads 0,3 | --branch B] [--beam K] [--force]
    multibranch analyze diversity --ckpt X.pt --data PREPARED_DIR --out REPORT_DIR [--split valid]
        [--max-examples N] [--max-tokens N] [--force]
    multibranch analyze compare --report R1 --report R2 [--label A --label B] --out REPORT_DIR [--force]
"""

from __future__ import annotations

import argparse

from multibranch.arguments import positive_int

HELP = "analyses of a checkpoint written as a report folder (heads, lengths, ...)"


def _report_folder(p: argparse.ArgumentParser) -> None:
    """--out and --force: every analysis writes a report folder."""
    p.add_argument("--out", required=True, help="report directory (must be empty or new unless --force)")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")


def _examples(p: argparse.ArgumentParser, help_split: str) -> None:
    """--data, --split and its batching, for analyses that run the model over a prepared split."""
    p.add_argument("--data", required=True, help="the prepared data directory the model was trained on")
    p.add_argument("--split", default="valid", help=help_split)
    p.add_argument("--max-examples", type=positive_int, default=None,
                   help="use only the first N examples of --split (default: all)")
    p.add_argument("--max-tokens", type=positive_int, default=4096, help="padded tokens per batch")


def _device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")


def _beam(p: argparse.ArgumentParser, help_text: str = "beam size (default: the checkpoint's)") -> None:
    p.add_argument("--beam", type=positive_int, default=None, help=help_text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    about = ("head importance (Michel et al., 2019: how much the loss depends on each head), attention entropy, "
             "pruning curve (the score as the least important heads are masked), dominant heads (the score change "
             "when each single head is masked); translation models (BLEU) and classifiers (accuracy)")
    p = sub.add_parser("heads", help=about, description=about)
    p.add_argument("--ckpt", required=True, help="checkpoint to analyse")
    _examples(p, "importance and entropy set")
    _report_folder(p)
    p.add_argument("--no-normalize", action="store_true", help="do not l2-normalise importance per module")
    p.add_argument("--per-example", action="store_true", help="importance's absolute gradient per example (Michel et al.'s formula; the scores then do not "
                   "depend on --max-tokens) instead of per batch (their code)")
    p.add_argument("--bleu-split", default=None,
                   help="split scored: BLEU, or accuracy for a classifier (default: --split)")
    p.add_argument("--bleu-max-sentences", type=positive_int, default=None,
                   help="score only its first N sentences (default: all)")
    _beam(p)
    p.add_argument("--step", type=float, default=0.1, help="pruning-curve step as a fraction of all heads")
    p.add_argument("--recompute", action="store_true", help="recompute importance after every pruning step")
    p.add_argument("--keep-one", action="store_true", help="never mask the last head of a module")
    p.add_argument("--no-curve", action="store_true", help="skip the pruning curve")
    p.add_argument("--no-dominant", action="store_true",
                   help="skip the dominant-head table (one translation of the BLEU set per head)")
    _device(p)
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (shown on stderr only when it is a terminal)")
    p.set_defaults(analysis_run=_heads)

    about = ("BLEU and sentence counts by source-length bucket (as in MUSE, Zhao et al., 2019, Fig. 3), one or "
             "more checkpoints")
    p = sub.add_parser("lengths", help=about, description=about)
    p.add_argument("--ckpt", required=True, action="extend", nargs="+", metavar="PATH",
                   help="checkpoint; several compare them (--ckpt A B, as translate takes them; --ckpt A --ckpt B "
                        "works too)")
    p.add_argument("--label", action="extend", nargs="+", default=None,
                   help="plot label per --ckpt, in their order (default: file names)")
    p.add_argument("--data", required=True, help="the prepared data directory the models were trained on")
    _report_folder(p)
    p.add_argument("--split", default="test", help="split to translate")
    p.add_argument("--buckets", default="15,30,45,60,75,90,105",
                   help="inclusive upper edges in subword tokens (last bucket: above the last edge)")
    p.add_argument("--max-sentences", type=positive_int, default=None,
                   help="translate only the first N sentences (default: all)")
    _beam(p)
    _device(p)
    p.set_defaults(analysis_run=_lengths)

    about = ("learned mixing weights: the MUSE kernel-gate ratio (Zhao et al., 2019), the Weighted Transformer's "
             "kappa/alpha (Ahmed et al., 2017), MUTE unit weights (Yan et al., 2020)")
    p = sub.add_parser("gates", help=about, description=about)
    p.add_argument("--ckpt", required=True, help="checkpoint to analyse")
    _report_folder(p)
    p.add_argument("--ratio", default="3,15", help="kernel sizes SMALL,LARGE of the gate ratio")
    replaced = p.add_argument_group(
        "test-time replacement (Weighted Transformer, Ahmed et al., 2017, Table 3)",
        "with --data, a Weighted Transformer's split is translated with its learned kappa/alpha, with 1/M each and "
        "with random points of the simplex, and each is scored (BLEU, chrF)")
    replaced.add_argument("--data", default=None, help="the prepared data directory the model was trained on")
    replaced.add_argument("--split", default="test", help="split translated")
    replaced.add_argument("--max-sentences", type=positive_int, default=None,
                          help="translate only the first N sentences (default: all)")
    replaced.add_argument("--random-draws", type=int, default=3,
                          help="random replacements, seeds 1..N (0: none)")
    replaced.add_argument("--per-module", action="store_true",
                          help="also 1/M in one module at a time, the others learned (one translation per module)")
    _beam(replaced)
    _device(replaced)
    p.set_defaults(analysis_run=_gates)

    about = ("MUTE unit diversity (Yan et al., 2020: Att Pos., Att Sub., FFN Sub.) per encoder layer, and the unit "
             "weights")
    p = sub.add_parser("diversity", help=about, description=about)
    p.add_argument("--ckpt", required=True, help="MUTE checkpoint to analyse")
    _examples(p, "split scored (eval mode)")
    _report_folder(p)
    _device(p)
    p.set_defaults(analysis_run=_diversity)

    about = "attention maps (PNG heatmaps with token labels) of chosen sentences, layers, heads or MAT branches"
    p = sub.add_parser("attention", help=about, description=about)
    p.add_argument("--ckpt", required=True, help="checkpoint to analyse")
    _report_folder(p)
    p.add_argument("--data", default=None, help="prepared data directory (needed for --sentences)")
    p.add_argument("--split", default="valid", help="split that --sentences indexes")
    p.add_argument("--sentences", default=None, help="comma-separated example indices of --split (reference target)")
    p.add_argument("--text", action="append", default=None,
                   help="raw source sentence (repeatable); the target is the model's translation")
    p.add_argument("--type", action="append", choices=["encoder_self", "decoder_self", "cross"], default=None,
                   help="attention type (repeatable; default: all)")
    p.add_argument("--layers", default=None, help="comma-separated layer indices (default: all)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--heads", default=None, help="comma-separated head indices (default: all)")
    group.add_argument("--branch", type=int, default=None, help="draw MAT branch B (its heads averaged)")
    _beam(p, "beam for --text translations")
    p.set_defaults(analysis_run=_attention)

    about = "overlay several heads or diversity reports: pruning curves, dominant heads, MUTE diversity"
    p = sub.add_parser("compare", help=about, description=about)
    p.add_argument("--report", required=True, action="append", help="report folder of `analyze heads` or "
                   "`analyze diversity` (repeat; at least two of one kind)")
    p.add_argument("--label", action="append", default=None, help="label per --report (default: folder names)")
    _report_folder(p)
    p.set_defaults(analysis_run=_compare)


def run(args: argparse.Namespace) -> int:
    return int(args.analysis_run(args) or 0)


def _heads(args: argparse.Namespace) -> int:
    from multibranch.pruning.head_report import HeadAnalysisOptions, analyze_heads

    options = HeadAnalysisOptions(
        split=args.split, max_examples=args.max_examples, max_tokens=args.max_tokens, normalize=not args.no_normalize,
        per_example=args.per_example, bleu_split=args.bleu_split, bleu_max_sentences=args.bleu_max_sentences, beam=args.beam,
        curve=not args.no_curve, step=args.step, recompute=args.recompute, keep_one=args.keep_one,
        dominant=not args.no_dominant, device=args.device, progress=False if args.no_progress else None,
    )
    folder = analyze_heads(args.ckpt, args.data, args.out, options, force=args.force)
    print(f"wrote {folder.path}: {', '.join(folder.files)}")
    return 0


def _lengths(args: argparse.Namespace) -> int:
    from multibranch.analysis.lengths import LengthOptions, analyze_lengths, parse_edges
    from multibranch.errors import UserError

    try:
        edges = parse_edges(args.buckets)
    except ValueError as error:
        raise UserError(f"--buckets: {error}") from None
    if args.label is not None and len(args.label) != len(args.ckpt):
        raise UserError(f"{len(args.label)} --label for {len(args.ckpt)} --ckpt")
    if len(set(args.label or args.ckpt)) != len(args.ckpt):
        raise UserError("the checkpoints (or their --label) must be distinct")
    options = LengthOptions(split=args.split, max_sentences=args.max_sentences, edges=tuple(edges), beam=args.beam,
                            device=args.device)
    folder = analyze_lengths(args.ckpt, args.label, args.data, args.out, options, force=args.force)
    print(f"wrote {folder.path}: {', '.join(folder.files)}")
    return 0


def _gates(args: argparse.Namespace) -> int:
    from multibranch.analysis.gate_report import analyze_gates
    from multibranch.analysis.replacement import ReplacementOptions
    from multibranch.errors import UserError

    parts = args.ratio.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise UserError(f"--ratio {args.ratio!r} must be two kernel sizes SMALL,LARGE, e.g. 3,15")
    if args.random_draws < 0:
        raise UserError(f"--random-draws {args.random_draws}: give 0 or more")
    options = ReplacementOptions(split=args.split, max_sentences=args.max_sentences, draws=args.random_draws,
                                 beam=args.beam, device=args.device, per_module=args.per_module)
    try:
        folder = analyze_gates(args.ckpt, args.out, (int(parts[0]), int(parts[1])), force=args.force,
                               data_dir=args.data, replacement=options)
    except ValueError as error:
        raise UserError(str(error)) from None
    print(f"wrote {folder.path}: {', '.join(folder.files)}")
    return 0


def _diversity(args: argparse.Namespace) -> int:
    from multibranch.analysis.diversity import NotMuteError, analyze_diversity
    from multibranch.errors import UserError

    try:
        folder = analyze_diversity(args.ckpt, args.data, args.out, args.split, args.max_examples, args.max_tokens,
                                   args.device, force=args.force)
    except NotMuteError as error:
        raise UserError(str(error)) from None
    print(f"wrote {folder.path}: {', '.join(folder.files)}")
    return 0


def _index_list(flag: str, text: str | None) -> tuple[int, ...] | None:
    from multibranch.errors import UserError

    if text is None:
        return None
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UserError(f"{flag} {text!r} must be comma-separated integers") from None
    if any(v < 0 for v in values):
        raise UserError(f"{flag} {text!r}: indices must be >= 0")
    return values


def _attention(args: argparse.Namespace) -> int:
    from multibranch.analysis.attention_maps import Selection, SelectionError, analyze_attention
    from multibranch.analysis.heads import ROLES
    from multibranch.errors import UserError

    indices = _index_list("--sentences", args.sentences)
    selection = Selection(roles=tuple(args.type) if args.type else ROLES, layers=_index_list("--layers", args.layers),
                          heads=_index_list("--heads", args.heads), branch=args.branch)
    try:
        folder = analyze_attention(args.ckpt, args.out, data_dir=args.data, split=args.split,
                                   indices=list(indices or []), texts=args.text, selection=selection, beam=args.beam,
                                   force=args.force)
    except SelectionError as error:
        raise UserError(str(error)) from None
    print(f"wrote {folder.path}: {', '.join(folder.files)}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from multibranch.analysis.compare import compare_reports
    from multibranch.errors import UserError

    try:
        folder = compare_reports(args.report, args.label, args.out, force=args.force)
    except ValueError as error:
        raise UserError(str(error)) from None
    print(f"wrote {folder.path}: {', '.join(folder.files)}")
    return 0
