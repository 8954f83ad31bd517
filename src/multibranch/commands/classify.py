"""`multibranch classify`: label lines of text with a trained classifier checkpoint.

One output line per input line: the label, or with --probs `LABEL<TAB>name=p name=p ...` (every
label's probability, in the checkpoint's label order). An empty (or whitespace-only) input line has
no text to classify and gives an empty output line. -o is written atomically, never over -i or
a checkpoint, and over an existing file only with --force. Several --ckpt make an ensemble: the label is the argmax of the members' mean
probabilities (each member reads the text with its own tokenizer; all must have the same labels in
the same order).
A sentence-pair classifier (trained on data prepared with two --text-column) reads two tab-separated
texts per line (`a<TAB>b`, as GLUE's TSV files hold them); a line with another number of columns or an
empty text is an error, and pairs given to a single-text classifier too.
"""

from __future__ import annotations

import argparse

HELP = "label lines of text (one label per line) with a classifier checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt", required=True, nargs="+", metavar="PATH",
                        help="classifier checkpoint file; several: an ensemble (their mean probabilities)")
    parser.add_argument("-i", "--input", default="-", metavar="FILE", help="input text, one example per line ('-' = stdin); for a sentence-pair classifier "
                             "two tab-separated texts per line")
    parser.add_argument("-o", "--output", default="-", metavar="FILE",
                        help="output labels ('-' = stdout); a file is replaced only when labelling succeeds")
    parser.add_argument("--force", action="store_true", help="overwrite an existing -o file")
    parser.add_argument("--probs", action="store_true",
                        help="print 'LABEL<TAB>name=p name=p ...' with every label's probability")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N", help="lines per batch")
    parser.add_argument("--device", default="auto",
                        help="where to run the model: cpu, cuda, cuda:N or auto (cuda when available)")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (unset: torch's choice)")
    parser.add_argument("--encoding-errors", choices=["strict", "replace"], default="strict",
                        help="invalid UTF-8 in the input: error naming the line (strict) or replace with U+FFFD")


def format_line(labels: list[str], probs: list[float] | None, with_probs: bool) -> str:
    """One output line (without newline); probs None = an empty input line."""
    if probs is None:
        return ""
    best = labels[max(range(len(probs)), key=probs.__getitem__)]
    if not with_probs:
        return best
    return best + "\t" + " ".join(f"{name}={p:.4f}" for name, p in zip(labels, probs))


def run(args: argparse.Namespace) -> int:
    import torch

    from multibranch.data.directories import refuse_replacing_file
    from multibranch.data.text import (
        check_can_write,
        check_input_file,
        check_output_file,
        iter_lines,
        open_input,
        open_output,
        refuse_existing_output,
    )
    from multibranch.device import resolve_device
    from multibranch.errors import UserError
    from multibranch.loading.model import LoadedModel
    from multibranch.tasks.classification.inference import classify_text_lines

    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size}: must be >= 1")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads {args.threads}: must be >= 1")
    resolve_device(args.device)  # ConfigError for a device this machine cannot use
    if args.input != "-":
        check_input_file(args.input)
    check_output_file(args.output, [args.input, *args.ckpt])
    refuse_replacing_file(args.output, "-o")  # another command's output: never, --force or not
    refuse_existing_output(args.output, args.force)
    device = resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    name = "<stdin>" if args.input == "-" else args.input
    with open_input(args.input) as source:
        lines = list(iter_lines(source, name, args.encoding_errors))
    check_can_write(args.output, 16 * len(lines) * (4 if args.probs else 1))
    loaded = LoadedModel.load(args.ckpt, device, tasks=("classification",))
    per_line = classify_text_lines(loaded, lines, args.batch_size, name)
    labels = loaded.labels
    with open_output(args.output) as sink:
        sink.write("".join(format_line(labels, p, args.probs) + "\n" for p in per_line).encode("utf-8"))
    return 0
