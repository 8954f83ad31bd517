"""`multibranch translate`: raw text in, translations out, strictly one output line per input line.

Input is read as bytes and split on "\\n" only (a trailing "\\r" is removed; U+2028 and friends stay
inside their line). Invalid UTF-8 is an error naming the line, unless --encoding-errors replace.
Translations go to stdout, flushed after every chunk, or to -o FILE, written to a temporary file
beside it and renamed on success (a failure leaves an existing FILE untouched). Logs, the progress
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

HELP = "translate text with a checkpoint (beam search; one output line per input line)"
CHUNK_LINES = 4096  # lines translated (sorted, batched) together before writing
SCORE_FORMAT = "SCORE<TAB>LOGPROB<TAB>TOKENS"

logger = logging.getLogger("multibranch.translate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt", required=True, metavar="PATH", help="checkpoint file")
    parser.add_argument("-i", "--input", default="-", metavar="FILE", help="input text ('-' = stdin)")
    parser.add_argument("-o", "--output", default="-", metavar="FILE",
                        help="output text ('-' = stdout); a file is replaced only when translation succeeds")
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


def one_line(text: str) -> str:
    """Keep the one-line-per-input contract even if a detokenised string holds a line break."""
    return text.replace("\r", " ").replace("\n", " ")


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def count_lines(path: str) -> int | None:
    """Lines of a regular input file (as `iter_lines` splits them), None for stdin or a non-file."""
    if path == "-" or not Path(path).is_file():
        return None
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def code_source(text: str) -> str:
    """`--code-format source`: an escaped function -> its Python source, ending in an empty line."""
    from multibranch.tasks.code.corpus import decode_code

    return decode_code(one_line(text)) + "\n"


def format_translations(translator: Any, chunk: list[str], nbest: int, first_index: int, progress: Any = False,
                        render: Callable[[str], str] = one_line) -> str:
    """The output text of one chunk: `render(text)` and a newline per input line, or nbest rows
    'index ||| text ||| score'."""
    if nbest == 1:
        return "".join(render(text) + "\n" for text in translator.translate(chunk, progress=progress))
    return "".join(
        f"{first_index + i} ||| {one_line(text)} ||| {score:.6f}\n"
        for i, entries in enumerate(translator.translate_nbest(chunk, nbest, progress=progress))
        for text, score in entries
    )


def format_score(score: Any) -> str:
    """One --score-reference output line (without newline); None (empty input line) -> ""."""
    return "" if score is None else f"{score.score:.6f}\t{score.log_prob:.6f}\t{score.tokens}"


# ---- the command ---------------------------------------------------------------------------------


def _decode_overrides(args: argparse.Namespace) -> dict[str, object]:
    names = {"beam": "beam", "lenpen": "length_penalty", "lenpen_kind": "length_penalty_kind",
             "max_len_a": "max_len_a", "max_len_b": "max_len_b", "min_len": "min_len", "nbest": "nbest",
             "batch_tokens": "batch_tokens", "batch_size": "batch_size", "max_input_tokens": "max_input_tokens",
             "no_repeat_ngram_size": "no_repeat_ngram_size"}
    return {field: getattr(args, arg) for arg, field in names.items() if getattr(args, arg) is not None}


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


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from multibranch.checkpoint.format import CheckpointError
    from multibranch.data.text import iter_lines, open_input, open_output
    from multibranch.device import resolve_device
    from multibranch.inference.precision import for_decoding
    from multibranch.tasks.loading import load_model
    from multibranch.tasks.translation.translator import Translator, progress_bar, show_progress

    interactive = _is_interactive(args)
    _check_arguments(args, interactive)
    device = resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
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
    logger.info(
        "beam=%d lenpen=%g (%s) max_len=%g*src+%d min_len=%d no_repeat_ngram=%d nbest=%d batch_tokens=%d device=%s "
        "precision=%s",
        cfg.beam, cfg.length_penalty, cfg.length_penalty_kind, cfg.max_len_a, cfg.max_len_b, cfg.min_len,
        cfg.no_repeat_ngram_size, cfg.nbest, cfg.batch_tokens, device, args.precision,
    )
    name = "<stdin>" if args.input == "-" else args.input
    show = not args.no_progress and show_progress()
    if interactive:
        _interactive(translator, cfg.nbest, args.encoding_errors, render=render)
    elif args.score_reference is not None:
        _score_reference(translator, args, name, show)
    else:
        bar = progress_bar(count_lines(args.input), show, desc="translate")
        index = 0
        with open_input(args.input) as source, open_output(args.output) as sink:
            for chunk in _chunks(iter_lines(source, name, args.encoding_errors), CHUNK_LINES):
                sink.write(format_translations(translator, chunk, cfg.nbest, index, progress=bar,
                                               render=render).encode("utf-8"))
                sink.flush()
                index += len(chunk)
        bar.close()
    logger.info("translated %s", translator.stats.summary())
    return 0


def _interactive(translator: Any, nbest: int, encoding_errors: str, stdin: IO[bytes] | None = None,
                 render: Callable[[str], str] = one_line) -> None:
    """Translate stdin line by line as it arrives, flushing every answer; prompts go to stderr."""
    from multibranch.data.text import iter_lines

    source = stdin if stdin is not None else sys.stdin.buffer
    sink = sys.stdout
    print("multibranch translate: type a sentence and press Enter (Ctrl-D to quit)", file=sys.stderr, flush=True)
    print("> ", end="", file=sys.stderr, flush=True)
    for index, line in enumerate(iter_lines(source, "<stdin>", encoding_errors)):
        sink.write(format_translations(translator, [line], nbest, index, render=render))
        sink.flush()
        print("> ", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr, flush=True)


def _score_reference(translator: Any, args: argparse.Namespace, name: str, show: bool) -> None:
    """Read input and references whole, check they align, score, then write (nothing is written on error)."""
    from multibranch.data.text import iter_lines, open_input, open_output
    from multibranch.errors import DataError
    from multibranch.tasks.translation.translator import progress_bar

    with open_input(args.input) as source:
        lines = list(iter_lines(source, name, args.encoding_errors))
    with open_input(args.score_reference) as stream:
        references = list(iter_lines(stream, args.score_reference, args.encoding_errors))
    if len(lines) != len(references):
        raise DataError(f"line counts differ: {name} has {len(lines)} lines, {args.score_reference} has "
                        f"{len(references)}; line i of the reference must translate input line i")
    bar = progress_bar(len(lines), show, desc="score")
    scores = translator.score(lines, references, progress=bar)
    bar.close()
    with open_output(args.output) as sink:
        sink.write("".join(format_score(score) + "\n" for score in scores).encode("utf-8"))
