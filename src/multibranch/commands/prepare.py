"""`multibranch prepare`: train SentencePiece on raw parallel text and binarise it for training."""

from __future__ import annotations

import argparse

HELP = "train SentencePiece on PREFIX.LANG files, clean and binarise them into a data directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--src", required=True, metavar="LANG", help="source language code (file suffix)")
    parser.add_argument("--tgt", required=True, metavar="LANG", help="target language code (file suffix)")
    parser.add_argument("--train", required=True, metavar="PREFIX", help="training files PREFIX.SRC / PREFIX.TGT")
    parser.add_argument("--valid", required=True, metavar="PREFIX", help="validation files PREFIX.SRC / PREFIX.TGT")
    parser.add_argument(
        "--test", nargs="+", action="extend", default=[], metavar="PREFIX",
        help="test file prefixes (become splits test, test1, ...)",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output data directory")
    parser.add_argument("--vocab-size", type=int, default=8000, help="SentencePiece vocabulary size")
    parser.add_argument(
        "--separate-vocab", action="store_true", help="one SentencePiece model per side (without it: one joint model)"
    )
    parser.add_argument("--model-type", choices=["bpe", "unigram"], default="bpe", help="SentencePiece model type")
    parser.add_argument(
        "--character-coverage", type=float, default=1.0, help="SentencePiece character coverage"
    )
    parser.add_argument(
        "--max-len", type=int, default=256, help="drop training pairs longer than N subword tokens (0: no limit)"
    )
    parser.add_argument(
        "--max-len-ratio", type=float, default=3.0,
        help="drop training pairs whose length ratio exceeds R (+5 tokens allowance; 0: no limit)",
    )
    parser.add_argument(
        "--encoding-errors", choices=["strict", "replace"], default="strict",
        help="invalid UTF-8: stop with file:line (strict) or replace bytes with U+FFFD and count lines",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing non-empty output directory")
    parser.add_argument("--seed", type=int, default=1, help="seed for SentencePiece sampling")


def run(args: argparse.Namespace) -> int:
    from multibranch.data.prepare import PrepareConfig, prepare

    cfg = PrepareConfig(
        src_lang=args.src,
        tgt_lang=args.tgt,
        train=args.train,
        valid=args.valid,
        test=list(args.test),
        out=args.out,
        vocab_size=args.vocab_size,
        joint=not args.separate_vocab,
        model_type=args.model_type,
        character_coverage=args.character_coverage,
        max_len=args.max_len or None,
        max_len_ratio=args.max_len_ratio or None,
        encoding_errors=args.encoding_errors,
        force=args.force,
        seed=args.seed,
    )
    meta = prepare(cfg)
    print(summary(meta))
    return 0


def summary(meta: dict) -> str:
    """A few lines: pairs kept/dropped per split, vocabulary, output location."""
    vocab = meta["vocab_size"]
    kind = "joint" if meta["joint"] else "separate"
    sizes = str(vocab["src"]) if meta["joint"] else f"{vocab['src']}/{vocab['tgt']}"
    lines = [f"prepared {meta['src_lang']}->{meta['tgt_lang']} in {meta['out']} ({kind} vocabulary, {sizes} pieces)"]
    for name, entry in meta["splits"].items():
        dropped = ", ".join(f"{reason} {n}" for reason, n in entry["dropped"].items() if n) or "none"
        replaced = sum(entry["replaced_lines"].values())
        extra = f"; {replaced} line(s) with replaced bytes" if replaced else ""
        lines.append(
            f"  {name:<6} {entry['pairs']:>8} pairs kept of {entry['lines']} (dropped: {dropped}){extra}"
        )
    lines.append(f"  details: {meta['out']}/report.md, {meta['out']}/data.json")
    return "\n".join(lines)
