"""Translating text as `multibranch translate` does: strictly one output line per input line.

Streams are read in chunks (sorted and batched inside a chunk) and each chunk's output is written and
flushed before the next is read, so a pipe sees translations as they are done. Output lines are the
translations with line breaks turned into spaces (`data.text.one_line`), or n-best rows `index ||| text ||| score`,
or for `--score-reference` `SCORE<TAB>LOGPROB<TAB>TOKENS`. With alignments (--print-alignment) every
translation is followed by ` ||| ` and its Pharaoh pairs `i-j ...` (OpenNMT's -report_align layout).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import IO, Any, BinaryIO

from multibranch.data.text import iter_lines, one_line, open_input
from multibranch.errors import DataError

CHUNK_LINES = 4096  # lines translated (sorted, batched) together before writing


def chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def format_translations(translator: Any, chunk: list[str], nbest: int, first_index: int, progress: Any = False,
                        render: Callable[[str], str] = one_line, prefixes: list[str] | None = None,
                        alignment: bool = False) -> str:
    """The output text of one chunk whose first line is input line `first_index` + 1: `render(text)` and a
    newline per input line, or nbest rows 'index ||| text ||| score'; `alignment`: ' ||| i-j ...' after each
    translation. `prefixes`: one target prefix per line of the chunk."""
    options: dict[str, Any] = {"progress": progress, "first_line": first_index + 1}
    if prefixes is not None:
        options["prefixes"] = prefixes
    if nbest == 1 and not alignment:
        return "".join(render(text) + "\n" for text in translator.translate(chunk, **options))
    if not alignment:
        return "".join(
            f"{first_index + i} ||| {one_line(text)} ||| {score:.6f}\n"
            for i, entries in enumerate(translator.translate_nbest(chunk, nbest, **options))
            for text, score in entries
        )
    results = translator.translate_full(chunk, nbest, **options)
    if nbest == 1:
        return "".join(f"{render(entries[0].text)} ||| {entries[0].alignment}\n" for entries in results)
    return "".join(f"{first_index + i} ||| {one_line(t.text)} ||| {t.score:.6f} ||| {t.alignment}\n"
                   for i, entries in enumerate(results) for t in entries)


def format_score(score: Any) -> str:
    """One --score-reference output line (without newline); None (empty input line) -> ""."""
    return "" if score is None else f"{score.score:.6f}\t{score.log_prob:.6f}\t{score.tokens}"


def translate_stream(translator: Any, source: BinaryIO, sink: BinaryIO, name: str, encoding_errors: str,
                     nbest: int, progress: Any = False, render: Callable[[str], str] = one_line,
                     chunk_lines: int = CHUNK_LINES, alignment: bool = False) -> int:
    """Translate `source` chunk by chunk into `sink` (UTF-8, flushed after every chunk); returns the
    number of input lines."""
    index = 0
    for chunk in chunks(iter_lines(source, name, encoding_errors), chunk_lines):
        sink.write(format_translations(translator, chunk, nbest, index, progress=progress,
                                       render=render, alignment=alignment).encode("utf-8"))
        sink.flush()
        index += len(chunk)
    return index


def check_lengths(translator: Any, path: str, encoding_errors: str, chunk_lines: int = CHUNK_LINES) -> None:
    """Read the input file `path` through once, chunk by chunk, for a line over the translator's input limit:
    with `long_inputs` "refuse", a DataError naming it before anything is decoded or written."""
    if translator.cfg.long_inputs != "refuse":
        return
    with open_input(path) as source:
        first = 1
        for chunk in chunks(iter_lines(source, path, encoding_errors), chunk_lines):
            translator.check_lengths(chunk, first)
            first += len(chunk)


def translate_interactive(translator: Any, nbest: int, encoding_errors: str, source: IO[bytes] | None = None,
                          sink: IO[str] | None = None, prompts: IO[str] | None = None,
                          render: Callable[[str], str] = one_line, alignment: bool = False) -> None:
    """Translate `source` (stdin) line by line as it arrives, flushing every answer to `sink` (stdout);
    prompts go to `prompts` (stderr)."""
    source = source if source is not None else sys.stdin.buffer
    sink = sink if sink is not None else sys.stdout
    prompts = prompts if prompts is not None else sys.stderr
    print("multibranch translate: type a sentence and press Enter (Ctrl-D to quit)", file=prompts, flush=True)
    print("> ", end="", file=prompts, flush=True)
    for index, line in enumerate(iter_lines(source, "<stdin>", encoding_errors)):
        sink.write(format_translations(translator, [line], nbest, index, render=render, alignment=alignment))
        sink.flush()
        print("> ", end="", file=prompts, flush=True)
    print(file=prompts, flush=True)


def read_scored_pairs(input_path: str, reference_path: str, encoding_errors: str,
                      what: str = "the reference must translate") -> tuple[list[str], list[str]]:
    """Input lines and the reference lines that score them (--score-reference), or the prefixes that
    start their translations (--prefix, `what` = "the prefix file starts"), of equal count."""
    name = "<stdin>" if input_path == "-" else input_path
    with open_input(input_path) as source:
        lines = list(iter_lines(source, name, encoding_errors))
    with open_input(reference_path) as stream:
        references = list(iter_lines(stream, reference_path, encoding_errors))
    if len(lines) != len(references):
        raise DataError(f"line counts differ: {name} has {len(lines)} lines, {reference_path} has "
                        f"{len(references)}; line i of {what} input line i")
    return lines, references


def score_text(translator: Any, lines: list[str], references: list[str], progress: Any = False) -> str:
    """The --score-reference output: one `format_score` line per input line."""
    return "".join(format_score(score) + "\n" for score in translator.score(lines, references, progress=progress))
