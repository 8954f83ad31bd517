"""`multibranch translate`: raw text in, translations out, strictly one output line per input line.

Input is read as bytes and split on "\\n" only (a trailing "\\r" is removed; U+2028 and friends stay
inside their line). Invalid UTF-8 is an error naming the line, unless --encoding-errors replace.
Translations go to stdout, flushed after every chunk, or to -o FILE (an existing FILE only with
--force), written to a temporary file beside it and renamed on success (a failure leaves an existing
FILE untouched). Before the model is loaded, an input file is read through once for invalid UTF-8 and
-o's directory is checked for write permission and free space; a disk that fills up anyway is one
error line (exit 2), the old FILE intact. The work itself: `multibranch.tasks.translation.files`. Logs, the progress
bar (terminal only) and the speed summary go to stderr.

Modes: batch translation (default), --interactive (one line at a time, flushed as typed; the
default when stdin is a terminal and no -i is given), and --score-reference REF (forced decoding).

A code-generation checkpoint (`prepare --task code`) takes one docstring a line and writes one
function a line in the corpus's escaped form (`DCNL`/`DCSP`, what `evaluate --task code` reads);
`--code-format source` writes the decoded Python source instead, each function followed by one
empty line (for reading; it breaks the one-line-per-input contract, so it refuses --nbest and
--score-reference).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

HELP = "translate text with a checkpoint (beam search; one output line per input line)"
SCORE_FORMAT = "SCORE<TAB>LOGPROB<TAB>TOKENS"

logger = logging.getLogger("multibranch.translate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt", required=True, metavar="PATH",
                        help="checkpoint file, `convert export` directory, or `convert ct2` directory (decoded by "
                             "CTranslate2 with the options equal to our beam search)")
    parser.add_argument("-i", "--input", default="-", metavar="FILE", help="input text ('-' = stdin)")
    parser.add_argument("-o", "--output", default="-", metavar="FILE",
                        help="output text ('-' = stdout); a file is replaced only when translation succeeds")
    parser.add_argument("--force", action="store_true", help="overwrite an existing -o file")
    parser.add_argument("--interactive", action="store_true",
                        help="translate each line as it is typed and flush it at once (the default when stdin "
                             "is a terminal and neither -i nor -o is given); output goes to stdout")
    parser.add_argument("--score-reference", metavar="REF",
                        help="forced decoding: instead of translating, score line i of REF as the translation of "
                             f"input line i and print '{SCORE_FORMAT}' per line: SCORE = LOGPROB / length penalty "
                             "(as the beam search normalises), LOGPROB = total log-probability of the reference "
                             "tokens incl. EOS (natural log), TOKENS = their count incl. EOS; an empty input "
                             "line gives an empty output line")
    group = parser.add_argument_group("decoding (unset: the checkpoint's decode config)")
    group.add_argument("--beam", type=int, metavar="N", help="beam size (1 = greedy)")
    group.add_argument("--lenpen", type=float, metavar="A", help="length penalty exponent alpha")
    group.add_argument("--lenpen-kind", choices=["fairseq", "gnmt"], help="score/len^a or score/((5+len)/6)^a")
    group.add_argument("--max-len-a", type=float, metavar="A", help="max output length = A * source length + B")
    group.add_argument("--max-len-b", type=int, metavar="B", help="the B of --max-len-a")
    group.add_argument("--min-len", type=int, metavar="N", help="no EOS before N output tokens")
    group.add_argument("--no-repeat-ngram-size", type=int, metavar="N",
                       help="forbid any output N-gram from occurring twice in a hypothesis (0: allow)")
    group.add_argument("--nbest", type=int, metavar="N", help="print N hypotheses per line as 'index ||| text ||| score'")
    group.add_argument("--batch-tokens", type=int, metavar="N", help="padded source tokens x beam per batch")
    group.add_argument("--batch-size", type=int, metavar="N", help="sentences per batch")
    group.add_argument("--max-input-tokens", type=int, metavar="N", help="truncate longer inputs (tokens incl. EOS)")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto",
                        help="where to run the model (auto: cuda when available)")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (unset: torch's choice)")
    parser.add_argument("--precision", choices=["fp32", "int8"], default="fp32",
                        help="fp32: the model as trained; int8: its linear layers quantized to int8 for "
                             "decoding (CPU only, faster, BLEU may move slightly)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    parser.add_argument("--encoding-errors", choices=["strict", "replace"], default="strict",
                        help="invalid UTF-8 in the input: error naming the line (strict) or replace with U+FFFD")
    parser.add_argument("--code-format", choices=["escaped", "source"], default="escaped",
                        help="code-generation checkpoints: one function a line in the corpus's DCNL/DCSP form "
                             "(escaped, what `evaluate --task code` reads) or Python source, each function followed "
                             "by an empty line (source)")


# ---- the command ---------------------------------------------------------------------------------


def _decode_overrides(args: argparse.Namespace) -> dict[str, object]:
    names = {"beam": "beam", "lenpen": "length_penalty", "lenpen_kind": "length_penalty_kind",
             "max_len_a": "max_len_a", "max_len_b": "max_len_b", "min_len": "min_len", "nbest": "nbest",
             "batch_tokens": "batch_tokens", "batch_size": "batch_size", "max_input_tokens": "max_input_tokens",
             "no_repeat_ngram_size": "no_repeat_ngram_size"}
    return {field: getattr(args, arg) for arg, field in names.items() if getattr(args, arg) is not None}


# What a `convert ct2` directory cannot honour: argument -> (the values it can, why not the others).
CT2_REFUSED: dict[str, tuple[tuple[object, ...], str]] = {
    "precision": (("fp32",), "a CTranslate2 directory decodes with the quantization it was converted with "
                             "(`multibranch convert ct2 --quantization int8`)"),
    "lenpen_kind": ((None, "fairseq"), "CTranslate2 only has the score / len^alpha (fairseq) length penalty"),
    "code_format": (("escaped",), "a CTranslate2 directory holds a translation model (`convert ct2` refuses "
                                  "code-generation models)"),
}


def _check_ct2_arguments(args: argparse.Namespace) -> None:
    """One line for the first option set that a `convert ct2` directory cannot honour."""
    from multibranch.errors import UserError

    for name, (allowed, why) in CT2_REFUSED.items():
        value = getattr(args, name, None)
        if value not in allowed:
            raise UserError(f"--{name.replace('_', '-')} {value}: not with a CTranslate2 directory ({args.ckpt}): "
                            f"{why}")


def _is_interactive(args: argparse.Namespace) -> bool:
    if args.interactive:
        return True
    automatic = args.input == "-" and args.output == "-" and args.score_reference is None
    return automatic and sys.stdin is not None and sys.stdin.isatty()


def _check_arguments(args: argparse.Namespace, interactive: bool) -> None:
    """Every user error that needs no model: before anything is loaded or written."""
    from multibranch.data.text import check_input_file, check_output_file
    from multibranch.device import resolve_device
    from multibranch.errors import UserError
    from multibranch.inference.precision import check_precision
    from multibranch.tasks.translation.ct2 import is_ct2_directory

    if is_ct2_directory(args.ckpt):
        _check_ct2_arguments(args)
    check_precision(args.precision, resolve_device(args.device))  # ConfigError: unusable device/precision
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads {args.threads}: must be >= 1")
    if interactive and (args.input != "-" or args.output != "-"):
        raise UserError("--interactive reads stdin and writes stdout; drop -i/-o")
    if args.score_reference is not None:
        if interactive:
            raise UserError("--score-reference cannot be combined with --interactive")
        if args.nbest not in (None, 1):
            raise UserError("--score-reference prints one score per line; drop --nbest")
        if args.score_reference == "-":
            raise UserError("--score-reference needs a file (only -i may be stdin)")
        check_input_file(args.score_reference)
    if args.code_format == "source" and (args.score_reference is not None or args.nbest not in (None, 1)):
        raise UserError("--code-format source writes whole functions; it cannot be combined with --nbest or "
                        "--score-reference")
    if args.input != "-":
        check_input_file(args.input)
    check_output_file(args.output, [args.input, *([args.score_reference] if args.score_reference else [])])


def _check_output(args: argparse.Namespace, interactive: bool) -> tuple[list[str], list[str]] | None:
    """Input errors, then the output: refuse an existing -o without --force and a directory that cannot
    take the output, before the model is loaded. Returns the --score-reference pairs (read whole)."""
    from multibranch.data.text import check_can_write, refuse_existing_output, scan_lines
    from multibranch.tasks.translation.files import read_scored_pairs

    pairs = None
    if args.score_reference is not None:
        pairs = read_scored_pairs(args.input, args.score_reference, args.encoding_errors)
    elif not interactive and args.input != "-":
        scan_lines(args.input, args.encoding_errors)  # invalid UTF-8: an error now, not after hours of decoding
    refuse_existing_output(args.output, args.force)
    size = Path(args.input).stat().st_size if args.input != "-" else 0
    check_can_write(args.output, size * (args.nbest or 1))  # a translation is about as long as its source
    return pairs


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from multibranch.checkpoint.format import CheckpointError
    from multibranch.device import resolve_device
    from multibranch.inference.precision import for_decoding
    from multibranch.tasks.loading import load_model
    from multibranch.tasks.translation.ct2 import Ct2Translator, is_ct2_directory
    from multibranch.tasks.translation.files import code_source, one_line
    from multibranch.tasks.translation.translator import Translator

    interactive = _is_interactive(args)
    _check_arguments(args, interactive)
    pairs = _check_output(args, interactive)
    device = resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if is_ct2_directory(args.ckpt):
        translator = Ct2Translator(args.ckpt, device, threads=args.threads or 0, **_decode_overrides(args))
        return _translate(args, translator, one_line, interactive, pairs)
    loaded = load_model(args.ckpt, device, task=("translation", "code"))
    if loaded.tokenizer is None:
        raise CheckpointError(f"{args.ckpt} has no tokenizer, so it cannot translate raw text")
    if args.code_format != "escaped" and loaded.config.task != "code":
        raise CheckpointError(f"--code-format: {args.ckpt} is a {loaded.config.task} model, not a code-generation "
                              "model")
    render = code_source if args.code_format == "source" else one_line
    cfg = dataclasses.replace(loaded.config.decode, **_decode_overrides(args))
    cfg.validate()
    translator = Translator(for_decoding(loaded.model, args.precision), loaded.tokenizer, cfg, device)
    return _translate(args, translator, render, interactive, pairs)


def _translate(args: argparse.Namespace, translator, render, interactive: bool,  # noqa: ANN001
               pairs: tuple[list[str], list[str]] | None) -> int:
    """Translate (or score) with `translator` as the arguments ask; its `cfg` is the decode config."""
    from multibranch.data.text import count_lines, open_input, open_output
    from multibranch.tasks.translation.files import score_text, translate_interactive, translate_stream
    from multibranch.tasks.translation.translator import progress_bar, show_progress

    cfg = translator.cfg
    logger.info(
        "beam=%d lenpen=%g (%s) max_len=%g*src+%d min_len=%d no_repeat_ngram=%d nbest=%d batch_tokens=%d device=%s "
        "precision=%s",
        cfg.beam, cfg.length_penalty, cfg.length_penalty_kind, cfg.max_len_a, cfg.max_len_b, cfg.min_len,
        cfg.no_repeat_ngram_size, cfg.nbest, cfg.batch_tokens, translator.device, args.precision,
    )
    name = "<stdin>" if args.input == "-" else args.input
    show = not args.no_progress and show_progress()
    if interactive:
        translate_interactive(translator, cfg.nbest, args.encoding_errors, render=render)
    elif pairs is not None:
        lines, references = pairs
        bar = progress_bar(len(lines), show, desc="score")
        text = score_text(translator, lines, references, progress=bar)
        bar.close()
        with open_output(args.output) as sink:
            sink.write(text.encode("utf-8"))
    else:
        bar = progress_bar(count_lines(args.input), show, desc="translate")
        with open_input(args.input) as source, open_output(args.output) as sink:
            translate_stream(translator, source, sink, name, args.encoding_errors, cfg.nbest, progress=bar,
                             render=render)
        bar.close()
    logger.info("translated %s", translator.stats.summary())
    return 0


def __getattr__(name: str):
    """Names that moved to `multibranch.tasks.translation.files`, for code that imported them from here."""
    if name in ("one_line", "code_source", "format_translations", "format_score", "CHUNK_LINES"):
        from multibranch.tasks.translation import files

        return getattr(files, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
