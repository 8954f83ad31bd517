"""`multibranch evaluate`: sacreBLEU BLEU / chrF of detokenised output against raw references.

Prints one line per metric, the score followed by its sacreBLEU signature, e.g.
    BLEU = 38.50 83.3/60.0/50.0/33.3 (BP = ...) (nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0)
Optionally: per-line scores (--sentence-level), a paired bootstrap test against a second system (--compare;
with several --hyp files and as many --compare files, the outputs of several trainings of each system, seed by
seed: one test over all of them, each resample scored on every seed), BLEU on the given tokens as the WMT14
En-De papers report it (--tokenized-bleu, optionally --compound-split; printed after sacreBLEU, labelled as
not comparable across tokenisations), and everything as JSON (--json FILE, or --json - for stdout).

With `--task classify`, --hyp holds one predicted label per line (the output of `multibranch classify`;
anything after a TAB, such as --probs, is ignored) and the one --ref one gold label per line: accuracy,
macro-F1 (percent), Matthews correlation (CoLA's metric), the F1 of the positive class (MRPC's metric:
--positive-label, by default `1` when the labels are 0 and 1) and the confusion matrix (rows: reference,
columns: prediction). Predicted labels that
the reference never uses are refused, named (they would enter macro-F1 with F1 0; usually the two files
spell labels differently, e.g. `positive` vs `Positive`), unless --allow-unseen-labels, which scores them
as wrong predictions (a class missing from a reference subset) and still names them on stderr.

With `--task code`, --hyp and the one --ref hold one Python function per line in the code-docstring
corpus's escaped form (`DCNL`/`DCSP`, what `translate` writes for a code checkpoint; the prepared
`test.tgt.txt` or a corpus `.code` file); with `--code-format source`, --hyp holds what `translate
--code-format source` writes instead (each function's source followed by an empty line; read back with
`multibranch.tasks.code.corpus.split_source_functions`, refused when the count of functions does not
match the references, as happens when a function has an empty line of its own): PoV (the share of hypotheses that Python's `ast` parses, after
decoding, as exactly one function definition; nothing is executed), mean sentence BLEU (exponential
smoothing) and corpus BLEU, both on code tokens (`multibranch.tasks.code.metrics`).

stdout carries exactly one kind of output: the JSON with `--json -`, else the per-line rows with
`--sentence-level`, else the score lines; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger("multibranch.evaluate")

HELP = "score translations with sacreBLEU (BLEU, chrF), per line or with paired bootstrap; print the signatures"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", choices=["translate", "classify", "code"], default="translate",
                        help="translate: sacreBLEU scores; classify: accuracy, macro-F1, MCC, positive-class F1 and confusion matrix of "
                             "one label per line; code: PoV, mean sentence BLEU and corpus BLEU of one escaped "
                             "Python function per line")
    parser.add_argument("--hyp", required=True, nargs="+", action="extend", metavar="FILE",
                        help="detokenised system output ('-' = stdin); several files: the baseline's replicates "
                             "(seeds) for --compare")
    parser.add_argument("--ref", required=True, action="append", metavar="FILE",
                        help="raw reference text; repeat for several references")
    parser.add_argument("--metrics", nargs="+", default=["bleu", "chrf"], choices=["bleu", "chrf", "chrf++", "ter"],
                        help="corpus-level metrics (and those of --compare)")
    parser.add_argument("--tokenize", default="13a", help="sacreBLEU tokenizer for BLEU")
    parser.add_argument("--lowercase", action="store_true", help="case-insensitive BLEU and chrF (TER is case-insensitive always, as sacreBLEU's default)")
    parser.add_argument("--allow-download", action="store_true",
                        help="allow tokenizers that download a model (spm, flores101, flores200)")
    parser.add_argument("--sentence-level", action="store_true",
                        help="per-line scores: one row 'BLEU<TAB>chrF' per hypothesis line on stdout (sentence BLEU "
                             "with exponential smoothing and effective order; chrF), corpus scores to stderr; "
                             "with --json also stored under 'sentences' (with --json -, only there)")
    parser.add_argument("--compare", nargs="+", action="extend", metavar="FILE",
                        help="paired bootstrap resampling: score system FILE against the baseline --hyp on the same "
                             "references and report both scores with mean +- 95%% CI and the p-value of the "
                             "difference; as many FILEs as --hyp files: replicate k of the system against replicate "
                             "k of the baseline, one test over the replicates (each resample scored on every "
                             "replicate and the scores averaged)")
    parser.add_argument("--bootstrap-samples", type=int, default=1000, metavar="N",
                        help="bootstrap resamples for --compare (seeded by $SACREBLEU_SEED, 12345 if unset)")
    parser.add_argument("--tokenized-bleu", action="store_true",
                        help="also report BLEU on the given whitespace tokens, as multi-bleu.perl (no smoothing), the "
                             "way the WMT14 En-De papers did; --hyp and --ref must be tokenised the same way (e.g. "
                             "fairseq's Moses-tokenised references and translate output on --pretokenized data). "
                             "Printed after sacreBLEU and marked as not comparable across tokenisations")
    parser.add_argument("--compound-split", action="store_true",
                        help="with --tokenized-bleu: split hyphenated compounds first, a-b -> a ##AT##-##AT## b "
                             "(get_ende_bleu.sh / fairseq's compound_split_bleu.sh)")
    parser.add_argument("--json", metavar="OUT",
                        help="also write scores, signatures and line counts as JSON to OUT ('-' = stdout: the "
                             "score lines then go to stderr)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    parser.add_argument("--encoding-errors", choices=["strict", "replace"], default="strict",
                        help="invalid UTF-8: error naming the line (strict) or replace")
    parser.add_argument("--code-format", choices=["escaped", "source"],
                        help="--task code: the form of --hyp, as `translate --code-format` wrote it: escaped (when "
                             "unset: one function per line, DCNL/DCSP) or source (each function's Python source "
                             "followed by an empty line); --ref is always escaped")
    parser.add_argument("--positive-label", metavar="LABEL",
                        help="--task classify: also report this label's F1 (default: 1 when the labels are 0 and 1)")
    parser.add_argument("--allow-unseen-labels", action="store_true",
                        help="--task classify: score predicted labels that the reference never uses (e.g. a class "
                             "missing from a reference subset) as wrong predictions; without it they are refused, "
                             "named, since they usually mean the files spell labels differently")


def _read(path: str, errors: str) -> list[str]:
    from multibranch.data.text import iter_lines, open_input

    with open_input(path) as stream:
        return list(iter_lines(stream, "<stdin>" if path == "-" else path, errors))


def _replicates(args: argparse.Namespace) -> bool:
    """Whether the call compares replicates (several --hyp files); else --hyp and --compare become one path each.
    UserError for replicate files that do not pair up or for options a replicate comparison does not take."""
    from multibranch.errors import UserError

    if len(args.hyp) == 1 and (args.compare is None or len(args.compare) == 1):
        args.hyp, args.compare = args.hyp[0], args.compare[0] if args.compare else None
        return False
    if args.compare is None:
        raise UserError(f"{len(args.hyp)} --hyp files: several are the replicates (seeds) of a baseline; give as "
                        "many --compare files, the system's replicates in the same order")
    if len(args.compare) != len(args.hyp):
        raise UserError(f"{len(args.hyp)} --hyp files but {len(args.compare)} --compare files: give one system "
                        "output per baseline output, the same replicate (seed) at the same place")
    refused = [flag for flag, given in (("--task " + args.task, args.task != "translate"),
                                        ("--sentence-level", args.sentence_level),
                                        ("--tokenized-bleu", args.tokenized_bleu)) if given]
    if refused:
        raise UserError(f"{', '.join(refused)}: not with several --hyp files (a comparison of replicates)")
    if "-" in args.hyp:
        raise UserError("--hyp '-': stdin holds one output; give the replicates as files")
    return True


def _check_arguments(args: argparse.Namespace, replicates: bool = False) -> None:
    """User errors that need no scoring, before anything is read or written."""
    from multibranch.data.directories import refuse_replacing_file
    from multibranch.data.text import check_input_file, check_output_file
    from multibranch.errors import UserError

    if "-" in args.ref:
        raise UserError("--ref cannot be '-' (only --hyp may come from stdin)")
    if "-" in (args.compare if replicates else [args.compare]):
        raise UserError("--compare needs a file (only --hyp may come from stdin)")
    if args.bootstrap_samples < 1:
        raise UserError(f"--bootstrap-samples {args.bootstrap_samples}: must be >= 1")
    if args.code_format is not None and args.task != "code":
        raise UserError("--code-format: only for --task code")
    if args.compound_split and not args.tokenized_bleu:
        raise UserError("--compound-split: only with --tokenized-bleu")
    if args.allow_unseen_labels and args.task != "classify":
        raise UserError("--allow-unseen-labels: only for --task classify")
    if args.positive_label is not None and args.task != "classify":
        raise UserError("--positive-label: only for --task classify")
    inputs = ([*args.hyp, *args.ref, *args.compare] if replicates
              else [args.hyp, *args.ref, *([args.compare] if args.compare else [])])
    for path in inputs:
        if path != "-":
            check_input_file(path)
    if args.json and args.json != "-":
        refuse_replacing_file(args.json, "--json")  # another command's output: never, --force or not
        if Path(args.json).exists() and not args.force:
            raise FileExistsError(f"{args.json} exists; pass --force to overwrite it")
        check_output_file(args.json, inputs, parent_must_exist=False)


def run(args: argparse.Namespace) -> int:
    from multibranch.evaluate.metrics import evaluate_translation, format_bootstrap, format_scores

    replicates = _replicates(args)
    _check_arguments(args, replicates)
    if replicates:
        return _run_replicates(args)
    if args.task == "classify":
        return _run_classify(args)
    if args.task == "code":
        return _run_code(args)
    hyp_name = "<stdin>" if args.hyp == "-" else args.hyp
    report = evaluate_translation(
        _read(args.hyp, args.encoding_errors), {path: _read(path, args.encoding_errors) for path in args.ref},
        hyp_name=hyp_name, metrics=args.metrics, tokenize=args.tokenize, lowercase=args.lowercase,
        allow_download=args.allow_download, sentence_level=args.sentence_level,
        compare=(args.compare, _read(args.compare, args.encoding_errors)) if args.compare else None,
        bootstrap_samples=args.bootstrap_samples, tokenized=args.tokenized_bleu, split_compounds=args.compound_split)
    report["hyp"] = args.hyp
    sentences, bootstrap = report.get("sentences"), report.get("compare")

    json_to_stdout = args.json == "-"
    rows_to_stdout = sentences is not None and not json_to_stdout
    human = sys.stderr if json_to_stdout or rows_to_stdout else sys.stdout
    for line in format_scores(report):
        print(line, file=human, flush=True)
    if bootstrap is not None:
        print(f"paired bootstrap, baseline {args.hyp} vs system {args.compare}, {args.bootstrap_samples} resamples:",
              file=human, flush=True)
        for line in format_bootstrap(bootstrap):
            print(f"  {line}", file=human, flush=True)
    if rows_to_stdout:
        sys.stdout.write("".join(f"{b:.4f}\t{c:.4f}\n" for b, c in zip(sentences["bleu"], sentences["chrf"],
                                                                         strict=True)))
    if args.json:
        _write_json(args.json, report)
    sys.stdout.flush()
    return 0


def _run_replicates(args: argparse.Namespace) -> int:
    """Several trainings of two systems, compared by the paired bootstrap over the replicates."""
    from multibranch.evaluate.metrics import compare_replicates, format_replicates

    def read(paths: list[str]) -> list[tuple[str, list[str]]]:  # a file may stand for several replicates
        return [(path, _read(path, args.encoding_errors)) for path in paths]

    report = compare_replicates(read(args.hyp), read(args.compare), dict(read(args.ref)), metrics=args.metrics,
                                tokenize=args.tokenize, lowercase=args.lowercase,
                                allow_download=args.allow_download, samples=args.bootstrap_samples)
    lines = [f"paired bootstrap over {report['replicates']} replicates, baseline {' '.join(args.hyp)} vs system "
             f"{' '.join(args.compare)}, {args.bootstrap_samples} resamples:",
             *(f"  {line}" for line in format_replicates(report))]
    return _report(args, lines, report)


def _check_single_reference(args: argparse.Namespace, what: str) -> None:
    """UserError for translation-only flags and for more than one --ref (classify and code)."""
    from multibranch.errors import UserError

    translation_only = [flag for flag, given in (
        ("--sentence-level", args.sentence_level), ("--compare", args.compare), ("--lowercase", args.lowercase),
        ("--metrics", args.metrics != ["bleu", "chrf"]), ("--tokenize", args.tokenize != "13a"),
        ("--allow-download", args.allow_download), ("--tokenized-bleu", args.tokenized_bleu)) if given]
    if translation_only:
        raise UserError(f"{', '.join(translation_only)}: only for --task translate")
    if len(args.ref) != 1:
        raise UserError(f"--task {args.task} takes exactly one --ref ({what})")


def _run_code(args: argparse.Namespace) -> int:
    from multibranch.tasks.code.metrics import format_code_scores, score_code_lines

    _check_single_reference(args, "one escaped function per line")
    hyp_name = "<stdin>" if args.hyp == "-" else args.hyp
    result = score_code_lines(_read(args.hyp, args.encoding_errors), _read(args.ref[0], args.encoding_errors),
                              hyp_name, args.ref[0], code_format=args.code_format or "escaped")
    return _report(args, format_code_scores(result), {"hyp": args.hyp, "ref": args.ref[0], **result})


def _report(args: argparse.Namespace, lines: list[str], document: dict) -> int:
    """Print the human-readable lines (to stderr when the JSON goes to stdout) and write `document` to --json."""
    human = sys.stderr if args.json == "-" else sys.stdout
    for line in lines:
        print(line, file=human, flush=True)
    if args.json:
        _write_json(args.json, document)
    sys.stdout.flush()
    return 0


def _run_classify(args: argparse.Namespace) -> int:
    from multibranch.tasks.classification.metrics import format_classification, score_label_lines

    _check_single_reference(args, "one gold label per line")
    hyp_name = "<stdin>" if args.hyp == "-" else args.hyp
    result = score_label_lines(_read(args.hyp, args.encoding_errors), _read(args.ref[0], args.encoding_errors),
                               hyp_name, args.ref[0], allow_unseen=args.allow_unseen_labels,
                               positive=args.positive_label)
    return _report(args, format_classification(result), {"hyp": args.hyp, "ref": args.ref[0], **result})


def _write_json(target: str, report: dict[str, Any]) -> None:
    """The JSON report to stdout (`-`) or atomically to a file."""
    from multibranch.json_file import write_json

    if target == "-":
        sys.stdout.write(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        return
    write_json(target, report)



