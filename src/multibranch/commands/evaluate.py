"""`multibranch evaluate`: sacreBLEU BLEU / chrF of detokenised output against raw references.

Prints one line per metric, the score followed by its sacreBLEU signature, e.g.
    BLEU = 38.50 83.3/60.0/50.0/33.3 (BP = ...) (nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0)
and optionally writes the scores, signatures and line counts as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "score translations with sacreBLEU (BLEU, chrF) and print the signatures"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hyp", required=True, metavar="FILE", help="detokenised system output ('-' = stdin)")
    parser.add_argument("--ref", required=True, action="append", metavar="FILE",
                        help="raw reference text; repeat for several references")
    parser.add_argument("--metrics", nargs="+", default=["bleu", "chrf"], choices=["bleu", "chrf", "chrf++", "ter"],
                        help="default: bleu chrf")
    parser.add_argument("--tokenize", default="13a", help="sacreBLEU tokenizer for BLEU (default: 13a)")
    parser.add_argument("--lowercase", action="store_true", help="case-insensitive scores")
    parser.add_argument("--allow-download", action="store_true",
                        help="allow tokenizers that download a model (spm, flores101, flores200)")
    parser.add_argument("--json", metavar="OUT", help="also write scores, signatures and line counts here")
    parser.add_argument("--encoding-errors", choices=["strict", "replace"], default="strict",
                        help="invalid UTF-8: error naming the line (default) or replace")


def _read(path: str, errors: str) -> list[str]:
    from multibranch.data.text import iter_lines, open_input

    with open_input(path) as stream:
        return list(iter_lines(stream, "<stdin>" if path == "-" else path, errors))


def run(args: argparse.Namespace) -> int:
    from multibranch.cli import UserError
    from multibranch.data.errors import DataError
    from multibranch.evaluate.metrics import format_scores, score_corpus

    if "-" in args.ref:
        raise UserError("--ref cannot be '-' (only --hyp may come from stdin)")
    hypotheses = _read(args.hyp, args.encoding_errors)
    references = [_read(path, args.encoding_errors) for path in args.ref]
    for path, ref in zip(args.ref, references, strict=True):
        if len(ref) != len(hypotheses):
            raise DataError(f"line counts differ: {args.hyp} has {len(hypotheses)} lines, {path} has {len(ref)}")
    result = score_corpus(hypotheses, references, metrics=args.metrics, tokenize=args.tokenize,
                          lowercase=args.lowercase, allow_download=args.allow_download)
    for line in format_scores(result):
        print(line, flush=True)
    if args.json:
        report = {"hyp": args.hyp, "refs": list(args.ref), "tokenize": args.tokenize, "lowercase": args.lowercase,
                  **result}
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0
