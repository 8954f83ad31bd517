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

Decoding as researchers use it (docs/decoding.md): several --ckpt form an ensemble (the mean of the
members' per-step distributions); --sampling draws outputs (--temperature, --top-k, --top-p, --seed,
--nbest N samples); --prefix FILE forces each translation's start; --print-alignment appends
attention-based `i-j` pairs.

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
    parser.add_argument("--ckpt", required=True, nargs="+", metavar="PATH",
                        help="checkpoint file or `convert export` directory; several: an ensemble that decodes with "
                             "the mean of the members' per-step distributions (one vocabulary required); or one "
                             "`convert ct2` directory (decoded by CTranslate2 with the options equal to our beam "
                             "search)")
    parser.add_argument("--ensemble-mean", choices=["prob", "log-prob"],
                        help="how an ensemble (several --ckpt) combines its members: log of the mean probability "
                             "(prob, the default; fairseq's EnsembleModel) or mean of the log-probabilities "
                             "(log-prob)")
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
    group.add_argument("--max-input-tokens", type=int, metavar="N",
                       help="the most source tokens (incl. EOS) a line may have (unset: the model's max_positions, "
                            "which also bounds it)")
    group.add_argument("--long-inputs", choices=["truncate", "refuse"],
                       help="a line over the limit: translate its first tokens with one warning naming the line "
                            "(truncate, the default), or stop with an error naming it (refuse)")
    group.add_argument("--fixed-shapes", choices=["auto", "on", "off"],
                       help="on: every batch keeps its rows until all are done (the engine a GPU replays as CUDA "
                            "graphs); off: finished sentences leave the batch; auto: on on CUDA, off on a CPU")
    group.add_argument("--prefix", metavar="FILE",
                       help="line i is the start every translation of input line i must have (target text; an "
                            "empty line: no prefix); the search goes on after it")
    sampling = parser.add_argument_group("sampling (instead of beam search; docs/decoding.md)")
    sampling.add_argument("--sampling", action="store_true",
                          help="draw --nbest outputs per line at random (back-translation) instead of beam search")
    sampling.add_argument("--temperature", type=float, metavar="T", help="sample from softmax(logits / T) (default 1)")
    sampling.add_argument("--top-k", type=int, metavar="K", help="sample among the K most probable tokens (0: all)")
    sampling.add_argument("--top-p", type=float, metavar="P",
                          help="sample among the most probable tokens that together reach probability P (1: all)")
    sampling.add_argument("--seed", type=int, metavar="N",
                          help="random seed: the same seed, input and batch settings give the same samples")
    alignment = parser.add_argument_group("alignment")
    alignment.add_argument("--print-alignment", action="store_true",
                           help="append ' ||| i-j ...' to every translation: for output piece j the source piece i "
                                "the cross-attention weighs most (attention-based, not a trained aligner)")
    alignment.add_argument("--alignment-layer", type=int, metavar="N",
                           help="decoder layer whose cross-attention (mean over heads) aligns (-1: the last, as "
                                "fairseq)")
    parser.add_argument("--device", default="auto",
                        help="where to run the model: cpu, cuda, cuda:N or auto (cuda when available)")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (unset: torch's choice)")
    parser.add_argument("--precision", choices=["fp32", "int8", "bf16", "fp16"], default="fp32",
                        help="fp32: the model as trained; int8 (CPU): its linear layers quantized to int8; bf16: "
                             "its linear layers in bf16 on the CPU (CPUs with native bf16), the whole model in "
                             "bf16 on CUDA; fp16 (CUDA): the whole model in fp16. All but fp32 are faster, and "
                             "BLEU may move slightly")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    parser.add_argument("--encoding-errors", choices=["strict", "replace"], default="strict",
                        help="invalid UTF-8 in the input: error naming the line (strict) or replace with U+FFFD")
    parser.add_argument("--code-format", choices=["escaped", "source"], default="escaped",
                        help="code-generation checkpoints: one function a line in the corpus's DCNL/DCSP form "
                             "(escaped, what `evaluate --task code` reads) or Python source, each function followed "
                             "by an empty line (source)")


# ---- the command ---------------------------------------------------------------------------------


def decode_arguments() -> dict[str, str]:
    """translate's decoding arguments (argparse names: `lenpen`) -> the DecodeConfig fields they set."""
    from multibranch.experiment.decoding import DECODE_OPTIONS

    return {option.flag[2:].replace("-", "_"): field for field, option in DECODE_OPTIONS.items()
            if field != "sampling"}


def option_name(dest: str) -> str:
    """`--max-len-a` of the argument `max_len_a`."""
    return f"--{dest.replace('_', '-')}"


def _decode_overrides(args: argparse.Namespace) -> dict[str, object]:
    overrides = {field: getattr(args, arg) for arg, field in decode_arguments().items() if getattr(args, arg) is not None}
    if args.sampling:
        overrides["sampling"] = True
    return overrides


def _alignment_layer(args: argparse.Namespace) -> int | None:
    """The decoder layer that aligns (-1, the last, unless chosen); None without --print-alignment."""
    if not args.print_alignment:
        return None
    return -1 if args.alignment_layer is None else args.alignment_layer


def _check_ct2_arguments(args: argparse.Namespace) -> None:
    """One line for the first option set that a `convert ct2` directory cannot honour."""
    from multibranch.loading.model import CT2_REFUSED, check_ct2_options

    check_ct2_options(args.ckpt[0], {name: getattr(args, name, None) for name in CT2_REFUSED if hasattr(args, name)})


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
    from multibranch.loading.model import check_paths

    if check_paths(args.ckpt):
        _check_ct2_arguments(args)
    if args.ensemble_mean is not None and len(args.ckpt) == 1:
        raise UserError(f"--ensemble-mean {args.ensemble_mean}: combines the members of an ensemble (several "
                        f"--ckpt); {args.ckpt[0]} is one model")
    check_precision(args.precision, resolve_device(args.device))  # ConfigError: unusable device/precision
    _check_decoding(args, interactive)
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
    if args.prefix is not None:
        check_input_file(args.prefix)
    check_output_file(args.output, [args.input, *(p for p in (args.score_reference, args.prefix) if p), *args.ckpt])


def _check_decoding(args: argparse.Namespace, interactive: bool) -> None:
    """Decoding values out of their range (the decode config's rules: `config.check_value`), and sampling,
    prefix and alignment options that cannot work (before anything is loaded)."""
    from multibranch.config import check_value
    from multibranch.errors import UserError
    from multibranch.experiment.decoding import SAMPLING_ONLY, DecodeConfig, check_sampling_only

    for name, field in decode_arguments().items():
        if getattr(args, name) is not None:
            check_value(DecodeConfig, field, getattr(args, name), option_name(name))
    check_sampling_only([option_name(name) for name in SAMPLING_ONLY if getattr(args, name) is not None],
                        args.sampling, "--sampling")
    if args.sampling:
        if args.beam is not None:
            raise UserError("--sampling draws --nbest samples per line instead of a beam search; drop --beam")
        if args.score_reference is not None:
            raise UserError("--sampling cannot be combined with --score-reference (which decodes nothing)")
    if args.prefix is not None:
        if interactive or args.score_reference is not None:
            raise UserError("--prefix needs a batch translation: drop --interactive / --score-reference")
        if args.prefix == "-":
            raise UserError("--prefix needs a file (only -i may be stdin)")
    if args.alignment_layer is not None and not args.print_alignment:
        raise UserError("--alignment-layer chooses the layer of --print-alignment; add --print-alignment")
    if args.print_alignment and (args.score_reference is not None or args.code_format == "source"):
        raise UserError("--print-alignment goes with translations: drop --score-reference / --code-format source")


def _check_output(args: argparse.Namespace, interactive: bool) -> tuple[list[str], list[str]] | None:
    """Input errors, then the output: refuse an existing -o without --force and a directory that cannot
    take the output, before the model is loaded. Returns the --score-reference or --prefix pairs (read whole)."""
    from multibranch.data.directories import refuse_replacing_file
    from multibranch.data.text import check_can_write, refuse_existing_output, scan_lines
    from multibranch.tasks.translation.files import read_scored_pairs

    pairs = None
    if args.score_reference is not None:
        pairs = read_scored_pairs(args.input, args.score_reference, args.encoding_errors)
    elif args.prefix is not None:
        pairs = read_scored_pairs(args.input, args.prefix, args.encoding_errors,
                                  what="the prefix file starts the translation of")
    elif not interactive and args.input != "-":
        scan_lines(args.input, args.encoding_errors)  # invalid UTF-8: an error now, not after hours of decoding
    refuse_replacing_file(args.output, "-o")  # another command's output: never, --force or not
    refuse_existing_output(args.output, args.force)
    size = Path(args.input).stat().st_size if args.input != "-" else 0
    check_can_write(args.output, size * (args.nbest or 1))  # a translation is about as long as its source
    return pairs


def run(args: argparse.Namespace) -> int:
    import torch

    from multibranch.checkpoint.format import CheckpointError
    from multibranch.data.text import one_line
    from multibranch.device import resolve_device
    from multibranch.inference.allocator import keep_freed_memory, loaded_objects_frozen
    from multibranch.loading.model import TRANSLATION_TASKS, LoadedModel
    from multibranch.tasks.code.corpus import code_source

    interactive = _is_interactive(args)
    _check_arguments(args, interactive)
    pairs = _check_output(args, interactive)
    if args.output != "-":
        _remove_stale_temporaries(args.output)
    device = resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    keep_freed_memory()
    loaded = LoadedModel.load(args.ckpt, device, args.precision, tasks=TRANSLATION_TASKS,
                              ensemble_mean=args.ensemble_mean or "prob", decode=_decode_overrides(args),
                              threads=args.threads or 0)
    if args.code_format != "escaped" and loaded.task != "code":
        raise CheckpointError(f"--code-format: {loaded.name} is a {loaded.task} model, not a code-generation model")
    render = code_source if args.code_format == "source" else one_line
    translator = loaded.translator(alignment_layer=_alignment_layer(args), threads=args.threads or 0)
    with loaded_objects_frozen():
        return _translate(args, translator, render, interactive, pairs)


def _remove_stale_temporaries(output: str) -> None:
    """Remove the temporaries a killed run left beside the -o FILE (`.FILE.<random>.tmp`), with one log line."""
    from multibranch.atomic import remove_stale_output_temporaries

    removed = remove_stale_output_temporaries(output)
    if removed:
        logger.warning(
            "removed %d temporary file(s) left by an interrupted run: %s", len(removed),
            ", ".join(str(p) for p in removed))


def _translate(args: argparse.Namespace, translator, render, interactive: bool,  # noqa: ANN001
               pairs: tuple[list[str], list[str]] | None) -> int:
    """Translate (or score) with `translator` as the arguments ask; its `cfg` is the decode config. With
    --long-inputs refuse, a line over the model's limit is an error before anything is decoded or written
    (stdin, read as a stream: before its chunk is)."""
    from multibranch.data.text import count_lines, open_input, open_output
    from multibranch.tasks.translation.files import (
        check_lengths,
        format_translations,
        score_text,
        translate_interactive,
        translate_stream,
    )
    from multibranch.tasks.translation.translator import progress_bar, show_progress

    if pairs is not None:
        translator.check_lengths(pairs[0])
    elif not interactive and args.input != "-":
        check_lengths(translator, args.input, args.encoding_errors)
    cfg = translator.cfg
    logger.info(
        "beam=%d lenpen=%g (%s) max_len=%g*src+%d min_len=%d no_repeat_ngram=%d nbest=%d batch_tokens=%d device=%s "
        "precision=%s models=%d%s",
        cfg.beam, cfg.length_penalty, cfg.length_penalty_kind, cfg.max_len_a, cfg.max_len_b, cfg.min_len,
        cfg.no_repeat_ngram_size, cfg.nbest, cfg.batch_tokens, translator.device, args.precision, len(args.ckpt),
        f" sampling (temperature={cfg.temperature:g} top_k={cfg.top_k} top_p={cfg.top_p:g} seed={cfg.seed})"
        if cfg.sampling else "",
    )
    name = "<stdin>" if args.input == "-" else args.input
    show = not args.no_progress and show_progress()
    if interactive:
        translate_interactive(translator, cfg.nbest, args.encoding_errors, render=render,
                              alignment=args.print_alignment)
    elif args.prefix is not None and pairs is not None:  # read whole: every prefix is checked before any output
        lines, prefixes = pairs
        bar = progress_bar(len(lines), show, desc="translate")
        text = format_translations(translator, lines, cfg.nbest, 0, progress=bar, render=render, prefixes=prefixes,
                                   alignment=args.print_alignment)
        bar.close()
        with open_output(args.output) as sink:
            sink.write(text.encode("utf-8"))
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
                             render=render, alignment=args.print_alignment)
        bar.close()
    logger.info("translated %s", translator.stats.summary())
    return 0

