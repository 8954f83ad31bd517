"""`multibranch prepare`: train SentencePiece on raw parallel text (or, with `--task classify`, labelled
text; with `--task code`, the code-docstring corpus) and binarise it for training."""

from __future__ import annotations

import argparse

HELP = ("train SentencePiece on PREFIX.LANG files (labelled text files with --task classify, PREFIX.desc/PREFIX.code "
        "with --task code), clean and binarise them into a data directory")

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", choices=["translate", "classify", "code"], default="translate",
                        help="translate: parallel PREFIX.LANG files; classify: labelled text (TSV, CSV, TREC, JSONL); "
                             "code: docstring -> Python function, PREFIX.desc + PREFIX.code (code-docstring corpus)")
    parser.add_argument("--src", metavar="LANG", help="source language code (file suffix; translate, required)")
    parser.add_argument("--tgt", metavar="LANG", help="target language code (file suffix; translate, required)")
    parser.add_argument("--train", required=True, metavar="PREFIX|FILE",
                        help="training files PREFIX.SRC / PREFIX.TGT (code: PREFIX.desc / PREFIX.code), or the "
                             "labelled training FILE (classify)")
    parser.add_argument("--valid", metavar="PREFIX|FILE",
                        help="validation files PREFIX.SRC / PREFIX.TGT (required for translate and code), or the "
                             "labelled validation FILE (classify; or use --holdout)")
    parser.add_argument(
        "--test", nargs="+", action="extend", default=[], metavar="PREFIX|FILE",
        help="test file prefixes or labelled test files (become splits test, test1, ...)",
    )
    classify = parser.add_argument_group("classification (--task classify)")
    classify.add_argument("--holdout", type=float, metavar="N",
                          help="classify: validation = a stratified, seeded part of train; code: the test split = a "
                               "seeded part of train (default 1000; 0: none). A fraction in (0, 1) or a count")
    classify.add_argument("--format", choices=["auto", "tsv", "csv", "trec", "jsonl"], default="auto",
                          help="input format (auto: from the file extension)")
    classify.add_argument("--header", choices=["auto", "yes", "no"], default="auto",
                          help="whether TSV/CSV files start with a header row")
    classify.add_argument("--label-column", default="0", metavar="COL",
                          help="TSV/CSV label column: 0-based index or header name")
    classify.add_argument("--text-column", action="append", metavar="COL",
                          help="TSV/CSV text column: 0-based index or header name (default 1); give it twice for "
                               "sentence pairs (--text-column A --text-column B)")
    classify.add_argument("--label-key", default="label", metavar="KEY", help="JSONL label key")
    classify.add_argument("--text-key", action="append", metavar="KEY",
                          help="JSONL text key (default text); JSONL gives one text per example (sentence pairs: "
                               "TSV/CSV with --text-column twice)")
    classify.add_argument("--fine-labels", action="store_true", help="TREC: use the fine labels (COARSE:fine)")
    classify.add_argument("--empty-text", choices=["error", "drop"], default="error",
                          help="an example with empty text: stop with file:line, or drop it (counted)")
    classify.add_argument("--too-long", choices=["truncate", "drop"], default="truncate",
                          help="texts longer than --max-len: truncate, or drop (train only)")
    classify.add_argument("--hf-tokenizer", metavar="DIR",
                          help="tokenize with the Hugging Face tokenizer in DIR (the model directory given to "
                               "`convert from-hf-bert`) instead of training SentencePiece: ids and CLS/SEP are the "
                               "HF model's")
    code = parser.add_argument_group("code generation (--task code)")
    code.add_argument("--docstring-errors", choices=["strict", "raw"], default="strict",
                      help="a .desc line that is not a valid Python string literal: stop with file:line (strict), "
                           "or keep the text between its quotes (raw; counted in the report)")
    scale = parser.add_argument_group("large corpora and reused preprocessing (--task translate)")
    scale.add_argument("--workers", type=int, default=0, metavar="N",
                       help="encoding processes (0: one per core; 1: in this process); the output does not "
                            "depend on it")
    scale.add_argument("--spm-sample", type=int, default=1_000_000, metavar="N",
                       help="train SentencePiece on a seeded sample of N training sentences (N >= 1)")
    scale.add_argument("--shard-pairs", type=int, default=500_000, metavar="N",
                       help="training pairs per shard file (N >= 1); memory while preparing holds one shard")
    scale.add_argument("--spm-model", "--spm-model-src", dest="spm_model", metavar="FILE",
                       help="apply this existing SentencePiece model and its vocabulary instead of training one "
                            "(joint; with --spm-model-tgt: the source model)")
    scale.add_argument("--spm-model-tgt", metavar="FILE", help="the target side's SentencePiece model (separate "
                                                               "vocabularies)")
    scale.add_argument("--pretokenized", action="store_true",
                       help="the text is already tokenised and BPE-split (fairseq's preparation, '@@ ' continuation "
                            "markers): words are the vocabulary, counted from train or given with --dict; "
                            "translate joins '@@ ' and does no detokenisation")
    scale.add_argument("--dict", "--dict-src", dest="dict", metavar="FILE", help="--pretokenized: the vocabulary as a fairseq dict.txt "
                                                       "(joint; with --dict-tgt: the source side's)")
    scale.add_argument("--dict-tgt", metavar="FILE", help="--pretokenized: the target side's fairseq dict.txt")
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
        "--max-len", type=int, default=256,
        help="drop training pairs (classify: truncate texts) longer than N subword tokens (0: no limit)"
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
    import dataclasses

    from multibranch.preparing import PrepareOptions, prepare_data, summary

    names = {f.name for f in dataclasses.fields(PrepareOptions)}
    options = PrepareOptions(**{name: value for name, value in vars(args).items() if name in names})
    meta = prepare_data(options)
    print(summary(meta, options.task, options.out))
    return 0
