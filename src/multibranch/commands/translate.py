"""`multibranch translate`: raw text in, translations out, strictly one output line per input line.

Input is read as bytes and split on "\\n" only (a trailing "\\r" is removed; U+2028 and friends stay
inside their line). Invalid UTF-8 is an error naming the line, unless --encoding-errors replace.
Translations go to stdout (or -o) and are flushed after every chunk; logs and the speed summary
go to stderr.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator

HELP = "translate text with a checkpoint (beam search; one output line per input line)"
CHUNK_LINES = 4096  # lines translated (sorted, batched) together before writing

logger = logging.getLogger("multibranch.translate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt", required=True, metavar="PATH", help="checkpoint file")
    parser.add_argument("-i", "--input", default="-", metavar="FILE", help="input text (default: stdin)")
    parser.add_argument("-o", "--output", default="-", metavar="FILE", help="output text (default: stdout)")
    group = parser.add_argument_group("decoding (default: the checkpoint's decode config)")
    group.add_argument("--beam", type=int, metavar="N", help="beam size (1 = greedy)")
    group.add_argument("--lenpen", type=float, metavar="A", help="length penalty exponent alpha")
    group.add_argument("--lenpen-kind", choices=["fairseq", "gnmt"], help="score/len^a or score/((5+len)/6)^a")
    group.add_argument("--max-len-a", type=float, metavar="A", help="max output length = A * source length + B")
    group.add_argument("--max-len-b", type=int, metavar="B")
    group.add_argument("--min-len", type=int, metavar="N", help="no EOS before N output tokens")
    group.add_argument("--nbest", type=int, metavar="N", help="print N hypotheses per line as 'index ||| text ||| score'")
    group.add_argument("--batch-tokens", type=int, metavar="N", help="padded source tokens x beam per batch")
    group.add_argument("--batch-size", type=int, metavar="N", help="sentences per batch")
    group.add_argument("--max-input-tokens", type=int, metavar="N", help="truncate longer inputs (tokens incl. EOS)")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto", help="default: auto")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's choice)")
    parser.add_argument("--encoding-errors", choices=["strict", "replace"], default="strict",
                        help="invalid UTF-8 in the input: error (default) or replace with U+FFFD")


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


# ---- the command ---------------------------------------------------------------------------------


def _decode_overrides(args: argparse.Namespace) -> dict[str, object]:
    names = {"beam": "beam", "lenpen": "length_penalty", "lenpen_kind": "length_penalty_kind",
             "max_len_a": "max_len_a", "max_len_b": "max_len_b", "min_len": "min_len", "nbest": "nbest",
             "batch_tokens": "batch_tokens", "batch_size": "batch_size", "max_input_tokens": "max_input_tokens"}
    return {field: getattr(args, arg) for arg, field in names.items() if getattr(args, arg) is not None}


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from multibranch.cli import UserError
    from multibranch.data.text import iter_lines, open_input, open_output
    from multibranch.inference.translator import Translator, resolve_device
    from multibranch.train.checkpoint import CheckpointError, load_model

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available (use --device cpu or auto)")
    device = resolve_device(args.device)
    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads {args.threads}: must be >= 1")
        torch.set_num_threads(args.threads)
    loaded = load_model(args.ckpt, device)
    if loaded.tokenizer is None:
        raise CheckpointError(f"{args.ckpt} has no tokenizer, so it cannot translate raw text")
    cfg = dataclasses.replace(loaded.config.decode, **_decode_overrides(args))
    cfg.validate()
    translator = Translator(loaded.model, loaded.tokenizer, cfg, device)
    logger.info(
        "beam=%d lenpen=%g (%s) max_len=%g*src+%d min_len=%d nbest=%d batch_tokens=%d device=%s",
        cfg.beam, cfg.length_penalty, cfg.length_penalty_kind, cfg.max_len_a, cfg.max_len_b, cfg.min_len,
        cfg.nbest, cfg.batch_tokens, device,
    )
    name = "<stdin>" if args.input == "-" else args.input
    index = 0
    with open_input(args.input) as source, open_output(args.output) as sink:
        for chunk in _chunks(iter_lines(source, name, args.encoding_errors), CHUNK_LINES):
            if cfg.nbest == 1:
                out = "".join(one_line(text) + "\n" for text in translator.translate(chunk))
            else:
                out = "".join(
                    f"{index + i} ||| {one_line(text)} ||| {score:.6f}\n"
                    for i, entries in enumerate(translator.translate_nbest(chunk, cfg.nbest))
                    for text, score in entries
                )
            index += len(chunk)
            sink.write(out.encode("utf-8"))
            sink.flush()
    logger.info("translated %s", translator.stats.summary())
    return 0
