"""`multibranch prepare`: train SentencePiece on raw parallel text (or, with `--task classify`, labelled
text; with `--task code`, the code-docstring corpus) and binarise it for training."""

from __future__ import annotations

import argparse

HELP = ("train SentencePiece on PREFIX.LANG files (labelled text files with --task classify, PREFIX.desc/PREFIX.code "
        "with --task code), clean and binarise them into a data directory")

TRANSLATION_ONLY = ("src", "tgt")
CODE_ONLY = ("docstring_errors",)
CLASSIFY_ONLY = ("holdout", "format", "header", "label_column", "text_column", "label_key", "text_key", "fine_labels",
                 "empty_text", "too_long", "hf_tokenizer")
SENTENCEPIECE_ONLY = ("vocab_size", "model_type", "character_coverage")
TRANSLATION_SCALE = ("workers", "spm_sample", "shard_pairs", "spm_model", "spm_model_tgt", "pretokenized", "dict",
                     "dict_tgt")
REUSED_VOCABULARY = SENTENCEPIECE_ONLY + ("spm_sample",)  # settings of a trained model, not of a reused one


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


def _given(args: argparse.Namespace, names: tuple[str, ...], parser_defaults: dict) -> list[str]:
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n) != parser_defaults.get(n)]


DEFAULTS = {"holdout": None, "format": "auto", "header": "auto", "label_column": "0", "text_column": None,
            "label_key": "label", "text_key": None, "fine_labels": False, "empty_text": "error",
            "too_long": "truncate", "src": None, "tgt": None, "hf_tokenizer": None, "vocab_size": 8000,
            "model_type": "bpe", "character_coverage": 1.0, "docstring_errors": "strict", "max_len_ratio": 3.0,
            "separate_vocab": False, "workers": 0, "spm_sample": 1_000_000, "shard_pairs": 500_000,
            "spm_model": None, "spm_model_tgt": None, "pretokenized": False, "dict": None, "dict_tgt": None}


def remove_stale_temporaries(out: str) -> None:
    """Remove what a killed `prepare` left beside OUT (`.OUT.tmp-*`, see `atomic_directory`), with one log line."""
    import logging

    from multibranch.atomic import remove_stale_output_temporaries

    removed = remove_stale_output_temporaries(out)
    if removed:
        logging.getLogger("multibranch.prepare").warning(
            "removed %d temporary file(s) or folder(s) left by an interrupted run: %s", len(removed),
            ", ".join(str(p) for p in removed))


def run(args: argparse.Namespace) -> int:
    from multibranch.errors import UserError

    remove_stale_temporaries(args.out)
    if args.task == "classify":
        wrong = _given(args, TRANSLATION_ONLY + CODE_ONLY + TRANSLATION_SCALE, DEFAULTS)
        if wrong:
            raise UserError(f"{', '.join(wrong)}: not for --task classify")
        return run_classify(args)
    if args.task == "code":
        wrong = _given(args, TRANSLATION_ONLY + tuple(n for n in CLASSIFY_ONLY if n != "holdout") + ("max_len_ratio",)
                       + TRANSLATION_SCALE, DEFAULTS)
        if wrong:
            raise UserError(f"{', '.join(wrong)}: not for --task code")
        return run_code(args)
    wrong = _given(args, CLASSIFY_ONLY + CODE_ONLY, DEFAULTS)
    if wrong:
        raise UserError(f"{', '.join(wrong)}: not for --task translate")
    missing = [f"--{n}" for n in ("src", "tgt", "valid") if getattr(args, n) is None]
    if missing:
        raise UserError(f"the following arguments are required: {', '.join(missing)}")
    _check_scale(args)
    if args.spm_model or args.pretokenized:
        wrong = _given(args, REUSED_VOCABULARY, DEFAULTS)
        if wrong:
            raise UserError(f"{', '.join(wrong)}: settings of a trained SentencePiece model, not used with "
                            f"{'--spm-model' if args.spm_model else '--pretokenized'}")
    from multibranch.data.parallel_prepare import PrepareConfig
    from multibranch.tasks.translation.prepare import prepare

    cfg = PrepareConfig(
        src_lang=args.src,
        tgt_lang=args.tgt,
        train=args.train,
        valid=args.valid,
        test=list(args.test),
        out=args.out,
        vocab_size=args.vocab_size,
        joint=not (args.separate_vocab or args.spm_model_tgt or args.dict_tgt),
        model_type=args.model_type,
        character_coverage=args.character_coverage,
        max_len=args.max_len or None,
        max_len_ratio=args.max_len_ratio or None,
        encoding_errors=args.encoding_errors,
        force=args.force,
        seed=args.seed,
        workers=args.workers,
        spm_max_sentences=args.spm_sample,
        shard_pairs=args.shard_pairs,
        spm_model=args.spm_model,
        spm_model_tgt=args.spm_model_tgt,
        pretokenized=args.pretokenized,
        dict=args.dict,
        dict_tgt=args.dict_tgt,
    )
    meta = prepare(cfg)
    print(summary(meta))
    return 0


def _check_scale(args: argparse.Namespace) -> None:
    """The options of large corpora, checked as the user typed them (before the config names them otherwise)."""
    from multibranch.errors import UserError

    if args.spm_sample < 1:
        raise UserError(f"--spm-sample {args.spm_sample}: must be >= 1 (the number of training sentences "
                        "SentencePiece is trained on)")
    if args.shard_pairs < 1:
        raise UserError(f"--shard-pairs {args.shard_pairs}: must be >= 1 (training pairs per shard file)")
    if args.workers < 0:
        raise UserError(f"--workers {args.workers}: must be >= 0 (0: one per core)")


def run_classify(args: argparse.Namespace) -> int:
    from multibranch.errors import UserError
    from multibranch.tasks.classification.prepare import ClassifyPrepareConfig, prepare_classification
    from multibranch.tasks.classification.readers import ReadOptions

    if args.text_key is not None and len(args.text_key) > 1:
        raise UserError(f"--text-key given {len(args.text_key)} times ({', '.join(args.text_key)}): JSONL reads one "
                        "text per example; sentence pairs are read from TSV/CSV with --text-column A --text-column B")
    if (args.valid is None) == (args.holdout is None):
        raise UserError("--task classify needs exactly one of --valid FILE and --holdout N")
    if args.hf_tokenizer is not None:
        wrong = _given(args, SENTENCEPIECE_ONLY, DEFAULTS)
        if wrong:
            raise UserError(f"{', '.join(wrong)}: SentencePiece settings, not used with --hf-tokenizer")
    read = ReadOptions(format=args.format, header=args.header, label_column=args.label_column,
                       text_column=args.text_column or ["1"], label_key=args.label_key,
                       text_key=(args.text_key or ["text"])[0],
                       fine_labels=args.fine_labels, empty_text=args.empty_text,
                       encoding_errors=args.encoding_errors)
    cfg = ClassifyPrepareConfig(train=args.train, out=args.out, valid=args.valid, holdout=args.holdout,
                                test=list(args.test), read=read, vocab_size=args.vocab_size,
                                model_type=args.model_type, character_coverage=args.character_coverage,
                                max_len=args.max_len or None, too_long=args.too_long, force=args.force,
                                seed=args.seed, hf_tokenizer=args.hf_tokenizer)
    cfg.validate()
    meta = prepare_classification(cfg)
    print(classify_summary(meta, args.out))
    return 0


def run_code(args: argparse.Namespace) -> int:
    from multibranch.errors import UserError
    from multibranch.tasks.code.prepare import CodePrepareConfig, prepare_code

    if args.valid is None:
        raise UserError("--task code needs --valid PREFIX (the corpus's valid.desc / valid.code)")
    cfg = CodePrepareConfig(train=args.train, valid=args.valid, out=args.out,
                            holdout=1000 if args.holdout is None else args.holdout, test=list(args.test),
                            vocab_size=args.vocab_size, joint=not args.separate_vocab, model_type=args.model_type,
                            character_coverage=args.character_coverage, max_len=args.max_len or None,
                            docstring_errors=args.docstring_errors, encoding_errors=args.encoding_errors,
                            force=args.force, seed=args.seed)
    meta = prepare_code(cfg)
    print(summary(meta))
    return 0


def classify_summary(meta: dict, out: str) -> str:
    """A few lines: examples per split, labels, output location."""
    vocabulary = (f"Hugging Face tokenizer, {meta['vocab_size']} ids" if meta.get("hf_tokenizer")
                  else f"{meta['vocab_size']} pieces")
    lines = [f"prepared {len(meta['labels'])}-label classification data in {out} ({vocabulary}; "
             f"labels: {', '.join(meta['labels'])})"]
    for name, entry in meta["splits"].items():
        lines.append(f"  {name:<6} {entry['examples']:>8} examples")
    lines.append(f"  details: {out}/report.md, {out}/data.json")
    return "\n".join(lines)


def summary(meta: dict) -> str:
    """A few lines: pairs kept/dropped per split, vocabulary, output location."""
    vocab = meta["vocab_size"]
    kind = "joint" if meta["joint"] else "separate"
    sizes = str(vocab["src"]) if meta["joint"] else f"{vocab['src']}/{vocab['tgt']}"
    lines = [f"prepared {meta['src_lang']}->{meta['tgt_lang']} in {meta['out']} ({kind} vocabulary, {sizes} pieces)"]
    shards = sum(len(entry.get("shards", [])) for entry in meta["splits"].values())
    for name, entry in meta["splits"].items():
        dropped = ", ".join(f"{reason} {n}" for reason, n in entry["dropped"].items() if n) or "none"
        replaced = sum(entry["replaced_lines"].values())
        extra = f"; {replaced} line(s) with replaced bytes" if replaced else ""
        lines.append(
            f"  {name:<6} {entry['pairs']:>8} pairs kept of {entry['lines']} (dropped: {dropped}){extra}"
        )
    lines.append(f"  details: {meta['out']}/report.md, {meta['out']}/data.json ({shards} shard(s))")
    return "\n".join(lines)
