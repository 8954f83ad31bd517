"""The code-docstring corpus format: one Python function per line, one docstring literal per line.

A corpus is two line-aligned files `{prefix}.desc` and `{prefix}.code` (the format of Barone &
Sennrich's code-docstring-corpus, used by the MAT paper's Python code-generation task):

- each `.desc` line is a Python string literal (`'...'`) whose value is the docstring with its
  newlines written as the token `DCNL`;
- each `.code` line is one function (decorators, `def` line and body, docstring removed) kept on one
  line by escape tokens: `DCNL` is a newline; `DCSP` is one level of indentation when it stands at
  the start of a line (one token per level) or one space inside a string constant; `DCTB` (used
  by the data though not in its README) is a tab inside a string constant.

The escape tokens are whole words surrounded by single spaces that belong to the escape: in the
corpus a newline is written `" DCNL"`, each indentation level `" DCSP "` (so two levels read
`DCNL DCSP  DCSP x`) and each space (tab) of a string constant `" DCSP "` (`" DCTB "`): `'a b'`
is `'a DCSP b'`, `'a  b'` is `'a DCSP  DCSP b'`, `'a<tab>b'` is `'a DCTB b'`. The decoder does not
rely on the exact spacing around the indentation tokens (close to half of the functions have an
extra space after their first `DCNL`): every space at the start of a line is layout, and the
number of `DCSP` words there is the level.

`decode_code` writes one indentation level as `INDENT` (four spaces). Known ambiguity of the format:
a line that continues a triple-quoted string and starts with spaces is read as indented code, so
such strings come back with 4 spaces per original space (the corpus's functions were normalised
to one-line string constants, so this is rare, and it never changes whether the code parses).

Reading follows the project's line rules (`multibranch.data.text`): byte-exact lines, strict UTF-8
with file:line errors, equal line counts checked. An empty line in either file is an error, and so
is a `.desc` line that is not a valid string literal, unless the caller passes
`docstring_errors="raw"` (see `decode_docstring`). Docstring literals are decoded with
`ast.literal_eval`, never `eval`.
"""

from __future__ import annotations

import ast
import io
import logging
import re
import tokenize
import warnings
from pathlib import Path
from typing import Literal, NamedTuple

from multibranch.data.text import EncodingErrors, one_line, read_parallel
from multibranch.errors import DataError

NEWLINE_TOKEN = "DCNL"
SPACE_TOKEN = "DCSP"
TAB_TOKEN = "DCTB"
INDENT = "    "
DocstringErrors = Literal["strict", "raw"]
DOCSTRING_ERRORS = ("strict", "raw")
logger = logging.getLogger(__name__)

_NEWLINE = re.compile(r" *\bDCNL\b ?")
_LEADING_LAYOUT = re.compile(r"^(?: *\bDCSP\b)* *")
_IN_LINE = re.compile(r" ?\b(DCSP|DCTB)\b ?")
_IN_LINE_CHAR = {SPACE_TOKEN: " ", TAB_TOKEN: "\t"}
_DOCSTRING_NEWLINE = re.compile(r" ?\bDCNL\b ?")
_ESCAPE_WORD = re.compile(r"\b(?:DCNL|DCSP|DCTB)\b")
_IN_STRING_ESCAPE = {" ": " DCSP ", "\t": " DCTB "}
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)  # Python >= 3.12 splits f-strings
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


class CodeCorpus(NamedTuple):
    """Aligned docstrings (decoded text, real newlines) and functions (the one-line escaped form)."""

    docstrings: list[str]
    codes: list[str]


# ---- code lines -----------------------------------------------------------------------------------


def decode_code(escaped: str) -> str:
    """The corpus's one-line form of a function -> Python source (`INDENT` per level, no final newline)."""
    lines = []
    for line in _NEWLINE.split(escaped):
        layout = _LEADING_LAYOUT.match(line)
        assert layout is not None  # the pattern matches the empty string
        level = layout.group().count(SPACE_TOKEN)
        lines.append(INDENT * level + _IN_LINE.sub(lambda m: _IN_LINE_CHAR[m.group(1)], line[layout.end() :]))
    return "\n".join(lines)


def code_source(text: str) -> str:
    """`translate --code-format source`: an escaped function -> its Python source, ending in an empty line."""
    return decode_code(one_line(text)) + "\n"


def split_source_functions(lines: list[str]) -> list[str]:
    """The functions of `translate --code-format source` output, given as its lines (as
    `multibranch.data.text` reads them, final newline removed).

    That output is, for every function, `decode_code(escaped) + "\n"` and one empty line, so it is
    split at the empty lines (a missing final empty line is accepted). The form is ambiguous where a
    function has an empty line of its own (inside, or first or last): such a function splits into
    more pieces. So the caller must check that the count matches the references: for output as
    `translate` writes it the count is never lower than the number of functions, and when it is equal
    every piece is its function give or take one leading or trailing newline, which neither parsing
    nor code tokens see. An empty function (the model wrote nothing) comes back as "".
    """
    if not lines:
        return []
    text = "\n".join(lines)
    if text.endswith("\n"):  # the empty line after the last function
        text = text[:-1]
    return text.split("\n\n")

def python_tokens(source: str) -> list[tokenize.TokenInfo]:
    """Python's tokenizer over `source`, with every f-string as one STRING token (as before 3.12).

    Raises tokenize.TokenError or SyntaxError (IndentationError) on source it cannot tokenize.
    """
    offsets = [0]
    for line in source.split("\n"):
        offsets.append(offsets[-1] + len(line) + 1)
    tokens: list[tokenize.TokenInfo] = []
    depth, first = 0, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. invalid escape sequences
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == _FSTRING_START:
                depth += 1
                first = first if depth > 1 else tok
            elif tok.type == _FSTRING_END:
                depth -= 1
                if depth == 0:
                    assert first is not None
                    begin = offsets[first.start[0] - 1] + first.start[1]
                    text = source[begin : offsets[tok.end[0] - 1] + tok.end[1]]
                    tokens.append(tokenize.TokenInfo(tokenize.STRING, text, first.start, tok.end, first.line))
            elif depth == 0:
                tokens.append(tok)
    return tokens


def _scan(source: str) -> tuple[set[tuple[int, int]], dict[int, int]]:
    """The (row, column) of every character inside a string constant, and the indentation depth of
    every row that starts a statement (from the tokenizer's INDENT/DEDENT tokens)."""
    lines = source.split("\n")
    in_string: set[tuple[int, int]] = set()
    levels: dict[int, int] = {}
    depth, at_start = 0, True
    layout = {tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER, tokenize.ENCODING}
    for tok in python_tokens(source):
        if tok.type == tokenize.INDENT:
            depth += 1
        elif tok.type == tokenize.DEDENT:
            depth -= 1
        elif tok.type == tokenize.NEWLINE:
            at_start = True
        elif tok.type not in layout:
            if at_start:
                levels[tok.start[0]] = depth
                at_start = False
            if tok.type == tokenize.STRING:
                in_string.update(_cells(lines, tok.start, tok.end))
    return in_string, levels


def _cells(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> list[tuple[int, int]]:
    """The (row, column) positions from `start` (inclusive) to `end` (exclusive), across lines."""
    out = []
    for row in range(start[0], end[0] + 1):
        first = start[1] if row == start[0] else 0
        last = end[1] if row == end[0] else len(lines[row - 1])
        out.extend((row, col) for col in range(first, last))
    return out


def encode_code(source: str) -> str:
    """Python source -> the corpus's one-line form (the inverse of `decode_code`).

    Indentation levels come from Python's tokenizer (any consistent width, or tabs; an indented
    first statement, as in a method copied out of its class, is level 0). Spaces inside string
    constants become `DCSP` and tabs `DCTB`; other spaces are kept; trailing newlines are dropped.
    Lines that do not start a statement (blank lines, comments, continuation lines inside
    brackets) lose their leading whitespace. `decode_code(encode_code(s)) == s` for source indented
    with `INDENT` whose strings do not span lines. Raises ValueError for source that Python cannot
    tokenize or that already contains an escape word.
    """
    source = source.replace("\r\n", "\n").rstrip("\n")
    found = _ESCAPE_WORD.search(source)
    if found:
        raise ValueError(f"source contains the escape word {found.group()!r}, which the format cannot hold")
    try:
        in_string, levels = _scan(source)
    except (tokenize.TokenError, SyntaxError) as err:
        raise ValueError(f"cannot tokenize the source: {err}") from None
    base = min(levels.values(), default=0)
    out = []
    for row, line in enumerate(source.split("\n"), start=1):
        body_start = 0
        if (row, 0) not in in_string:  # a line continuing a multi-line string keeps its spaces
            body_start = len(line) - len(line.lstrip(" \t"))
        body = "".join(
            _IN_STRING_ESCAPE[ch] if ch in _IN_STRING_ESCAPE and (row, col) in in_string else ch
            for col, ch in enumerate(line[body_start:], start=body_start)
        )
        level = levels.get(row, base) - base
        indent = "  ".join([SPACE_TOKEN] * level) + " " if level else ""
        out.append(("" if row == 1 else " DCNL ") + indent + body)
    return "".join(out)


# ---- docstring lines ------------------------------------------------------------------------------


def decode_docstring(line: str, where: str = "docstring") -> str:
    """A `.desc` line (a Python string literal) -> the docstring text, `DCNL` -> newline.

    Uses `ast.literal_eval` (never `eval`); a line that is not a string literal raises DataError
    naming `where` (e.g. "train.desc:12").
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences are warnings, not errors
            value = ast.literal_eval(line)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
        reason = err.msg if isinstance(err, SyntaxError) else str(err) or type(err).__name__
        raise DataError(f"{where}: not a valid Python string literal ({reason})") from None
    if not isinstance(value, str):
        raise DataError(f"{where}: expected a string literal, got a {type(value).__name__}")
    return _DOCSTRING_NEWLINE.sub("\n", value)


def raw_docstring(line: str) -> str:
    """Fallback for a malformed literal: the text between the outer quotes, `DCNL` -> newline."""
    text = line.strip()
    for quote in ('"""', "'''", '"', "'"):
        if len(text) >= 2 * len(quote) and text.startswith(quote) and text.endswith(quote):
            text = text[len(quote) : -len(quote)]
            break
    return _DOCSTRING_NEWLINE.sub("\n", text)


# ---- reading a corpus -----------------------------------------------------------------------------


class CodeCorpusReading(NamedTuple):
    """A corpus as read, with what the reading had to tolerate (for prepare's report)."""

    corpus: CodeCorpus
    raw_docstrings: list[int]  # 1-based `.desc` lines whose malformed literal was kept as raw text
    replaced_lines: tuple[int, int]  # lines with replaced bytes (desc, code), encoding_errors="replace"


def read_code_corpus(
    prefix: str | Path,
    *,
    encoding_errors: EncodingErrors = "strict",
    docstring_errors: DocstringErrors = "strict",
) -> CodeCorpus:
    """Read `{prefix}.desc` + `{prefix}.code` into aligned docstrings and escaped functions.

    Errors (DataError, naming file:line): a missing file, unequal line counts, invalid UTF-8 (unless
    encoding_errors="replace"), an empty or whitespace-only line, and a `.desc` line that is not a
    string literal (unless docstring_errors="raw", which keeps the text between its quotes and logs
    how many lines needed it). Functions are returned as in the file; `decode_code` gives source.
    """
    return read_code_corpus_details(prefix, encoding_errors=encoding_errors,
                                    docstring_errors=docstring_errors).corpus


def read_code_corpus_details(
    prefix: str | Path,
    *,
    encoding_errors: EncodingErrors = "strict",
    docstring_errors: DocstringErrors = "strict",
) -> CodeCorpusReading:
    """`read_code_corpus`, also returning which docstrings were kept raw and how many lines had bad bytes."""
    if docstring_errors not in DOCSTRING_ERRORS:
        raise ValueError(f"docstring_errors must be one of {DOCSTRING_ERRORS}, got {docstring_errors!r}")
    desc_path, code_path = Path(f"{prefix}.desc"), Path(f"{prefix}.code")
    pair = read_parallel(desc_path, code_path, encoding_errors=encoding_errors)
    for text in (pair.src, pair.tgt):
        for i, line in enumerate(text.lines, start=1):
            if not line.strip():
                raise DataError(f"{text.path}:{i}: empty line; every line must hold one example")
    docstrings, raw = [], []
    for i, line in enumerate(pair.src.lines, start=1):
        try:
            docstrings.append(decode_docstring(line, where=f"{desc_path}:{i}"))
        except DataError as err:
            if docstring_errors == "strict":
                raise DataError(f"{err}; fix the line or keep malformed literals as raw text "
                                "(docstring_errors='raw'; `prepare --docstring-errors raw`)") from None
            docstrings.append(raw_docstring(line))
            raw.append(i)
    if raw:
        logger.warning("%s: kept %d malformed docstring literal(s) as raw text (first: line %d)",
                       desc_path, len(raw), raw[0])
    return CodeCorpusReading(CodeCorpus(docstrings, list(pair.tgt.lines)), raw,
                             (pair.src.replaced, pair.tgt.replaced))
