"""Reading labelled text for classification: TSV, CSV, TREC `COARSE:fine text` and JSONL files.

Every file is read with the line rules of `multibranch.data.text` (split on `\\n` only, CRLF and a
UTF-8 BOM handled, strict UTF-8 with `file:line` errors), then parsed one line per example:

- `tsv`: columns separated by tabs, no quoting (a tab inside a text is a column-count error);
- `csv`: comma-separated, with `"` quoting via the `csv` module; a quoted field cannot span lines;
- `trec`: `LABEL:fine text...` (the label is `LABEL`, or `LABEL:fine` with `fine_labels`);
- `jsonl`: one JSON object per line; `label_key` holds a string or integer, `text_key` a string. Labels
  are text, as in the other formats: the integer 1 is the label "1", so `1` and `"1"` name one class.
  Each run of line breaks inside a JSONL text is replaced by one space (the prepared text keeps one
  example per line); such texts are counted as `joined_lines`.

The format is given, or detected from the extension (.tsv, .csv, .label, .jsonl). TSV/CSV columns
are an index or a header name; the header row is required, absent, or detected (`auto`: the first
row is a header when its label cell is a word such as `label` or `class`, or its text cell a word such
as `text` or `sentence`: see LABEL_HEADERS / TEXT_HEADERS). Every row must have the
header's (or the first row's) number of columns. Empty lines are skipped and counted (`blank`).
Labels are stripped of surrounding whitespace and must be non-empty. A whitespace-only text is an
error, or with `empty_text="drop"` the example is dropped and counted (`empty`). Errors are
`DataError`s naming `file:line`.

Sentence pairs (entailment, paraphrase: GLUE RTE, MRPC): two text columns (`text_column` a list of two
indices or names, TSV/CSV only); `texts` holds the first texts and `second_texts` the second ones. An
empty second text is an `empty` text like an empty first one. TSV never treats `"` as a quote, as
GLUE's files need.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from multibranch.config import ConfigError
from multibranch.data.text import read_lines
from multibranch.errors import DataError

Format = Literal["auto", "tsv", "csv", "trec", "jsonl"]
EXTENSIONS = {".tsv": "tsv", ".csv": "csv", ".label": "trec", ".jsonl": "jsonl"}
LABEL_HEADERS = frozenset({"label", "labels", "class", "category", "target", "sentiment", "intent", "quality", "y"})
TEXT_HEADERS = frozenset({"text", "sentence", "sentence1", "sentence2", "question", "review", "document", "content",
                          "body"})


@dataclass
class ReadOptions:
    """How to read a labelled file (see the module docstring).

    `label_column` / `text_column` are 0-based indices or header names (names need a header); a string
    of digits, as a command line gives it, is an index. `text_column` may be a list of one or two
    columns: two read sentence pairs.
    """

    format: Format = "auto"
    header: Literal["auto", "yes", "no"] = "auto"
    label_column: int | str = 0
    text_column: int | str | list[int | str] = 1
    label_key: str = "label"
    text_key: str = "text"
    fine_labels: bool = False
    empty_text: Literal["error", "drop"] = "error"
    encoding_errors: Literal["strict", "replace"] = "strict"

    def __post_init__(self) -> None:
        if isinstance(self.label_column, str) and self.label_column.isdigit():
            self.label_column = int(self.label_column)
        columns = [int(c) if isinstance(c, str) and c.isdigit() else c for c in self.text_columns]
        self.text_column = columns[0] if len(columns) == 1 else columns

    @property
    def text_columns(self) -> list[int | str]:
        """The text column(s) as a list: one, or two for sentence pairs."""
        return list(self.text_column) if isinstance(self.text_column, (list, tuple)) else [self.text_column]

    @property
    def pairs(self) -> bool:
        return len(self.text_columns) == 2

    def validate(self) -> None:
        if self.format not in ("auto", *EXTENSIONS.values()):
            raise ConfigError(f"format={self.format!r} must be one of auto, tsv, csv, trec, jsonl")
        if self.header not in ("auto", "yes", "no"):
            raise ConfigError(f"header={self.header!r} must be auto, yes or no")
        if self.empty_text not in ("error", "drop"):
            raise ConfigError(f"empty_text={self.empty_text!r} must be 'error' or 'drop'")
        if self.encoding_errors not in ("strict", "replace"):
            raise ConfigError(f"encoding_errors={self.encoding_errors!r} must be 'strict' or 'replace'")
        texts = self.text_columns
        if not 1 <= len(texts) <= 2:
            raise ConfigError(f"{len(texts)} text columns ({', '.join(map(str, texts))}): give one text column, or two "
                              "for sentence pairs")
        for name, value in [("label_column", self.label_column)] + [("text_column", c) for c in texts]:
            if isinstance(value, int) and value < 0:
                raise ConfigError(f"{name}={value} must be >= 0 (or a header name)")
            if isinstance(value, str) and not value:
                raise ConfigError(f"{name} must not be empty")
        if self.label_column in texts:
            raise ConfigError(f"label_column and text_column are both {self.label_column!r}")
        if len(set(texts)) != len(texts):
            raise ConfigError(f"the two text columns are both {texts[0]!r}")
        if self.header == "no" and any(isinstance(c, str) for c in (self.label_column, *texts)):
            raise ConfigError("columns given by name need a header row (header 'yes' or 'auto')")
        if not self.label_key or not self.text_key or self.label_key == self.text_key:
            raise ConfigError("label_key and text_key must be different non-empty keys")


@dataclass
class LabeledText:
    """The examples of one file: `labels[i]` is the class of `texts[i]`, read from line `line_numbers[i]`."""

    path: Path
    format: str
    labels: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    second_texts: list[str] | None = None  # sentence pairs: the second text of each example
    line_numbers: list[int] = field(default_factory=list)
    lines: int = 0
    header: bool = False
    dropped: dict[str, int] = field(default_factory=lambda: {"blank": 0, "empty": 0})
    joined_lines: int = 0
    replaced_lines: int = 0

    def __len__(self) -> int:
        return len(self.texts)


def detect_format(path: str | Path, fmt: Format = "auto") -> str:
    """`fmt`, or the format that the extension of `path` names."""
    if fmt != "auto":
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in EXTENSIONS:
        known = ", ".join(f"{ext} ({name})" for ext, name in EXTENSIONS.items())
        raise DataError(f"{path}: cannot tell the format from the extension {suffix!r} (known: {known}); "
                        "pass --format tsv|csv|trec|jsonl")
    return EXTENSIONS[suffix]


def read_labeled(path: str | Path, options: ReadOptions | None = None) -> LabeledText:
    """Read one labelled file; DataError naming `file:line` on any bad row."""
    options = options or ReadOptions()
    options.validate()
    path = Path(path)
    fmt = detect_format(path, options.format)
    text = read_lines(path, encoding_errors=options.encoding_errors)
    out = LabeledText(path, fmt, lines=len(text), replaced_lines=text.replaced,
                      second_texts=[] if options.pairs else None)
    if options.pairs and fmt not in ("tsv", "csv"):
        raise DataError(f"{path}: sentence pairs (two text columns) are read from TSV or CSV files, not {fmt}")
    rows = [(number, line) for number, line in enumerate(text.lines, start=1) if line.strip()]
    out.dropped["blank"] = len(text) - len(rows)
    if fmt in ("tsv", "csv"):
        examples = _read_table(path, fmt, rows, options, out)
    elif fmt == "trec":
        examples = (_trec_row(path, number, line, options.fine_labels) for number, line in rows)
    else:
        examples = (_jsonl_row(path, number, line, options, out) for number, line in rows)
    for number, label, *bodies in examples:
        _add(out, path, number, label, bodies, options.empty_text)
    return out


def _add(out: LabeledText, path: Path, number: int, label: str, bodies: list[str], empty_text: str) -> None:
    """Keep one example: its label and its text (or pair of texts)."""
    label = label.strip()
    if not label:
        raise DataError(f"{path}:{number}: empty label")
    for which, body in enumerate(bodies):
        if not body.strip():
            if empty_text == "error":
                what = ("first", "second")[which] + " text of the pair" if len(bodies) == 2 else "text"
                raise DataError(f"{path}:{number}: empty {what} (pass --empty-text drop to drop such examples)")
            out.dropped["empty"] += 1
            return
    out.labels.append(label)
    out.texts.append(bodies[0])
    if out.second_texts is not None:
        out.second_texts.append(bodies[1])
    out.line_numbers.append(number)


# ------------------------------------------------------------------------------------- formats


def _split_row(path: Path, fmt: str, number: int, line: str) -> list[str]:
    if fmt == "tsv":
        return line.split("\t")
    try:
        return next(csv.reader([line], strict=True))
    except csv.Error as err:
        raise DataError(f"{path}:{number}: bad CSV row ({err}); quoted fields cannot span lines") from None


def _is_header(cells: list[str], options: ReadOptions) -> bool:
    if options.header != "auto":
        return options.header == "yes"
    if any(isinstance(c, str) for c in (options.label_column, *options.text_columns)):
        return True
    def cell(index: int) -> str:
        return cells[index].strip().lower() if index < len(cells) else ""

    return cell(options.label_column) in LABEL_HEADERS or \
        any(cell(c) in TEXT_HEADERS for c in options.text_columns)  # type: ignore[arg-type]


def _column(path: Path, header: list[str] | None, column: int | str, width: int, what: str) -> int:
    """The index of `column` in rows of `width` cells."""
    if isinstance(column, str):
        names = [cell.strip() for cell in header or []]
        if column not in names:
            raise DataError(f"{path}:1: no {what} column named {column!r} in the header ({', '.join(names)})")
        if names.count(column) > 1:
            raise DataError(f"{path}:1: {names.count(column)} columns are named {column!r} in the header; name the "
                            f"{what} column by its number (from 0) instead")
        return names.index(column)
    if column >= width:
        raise DataError(f"{path}: {what} column {column} does not exist: rows have {width} column(s)")
    return column


def _read_table(path: Path, fmt: str, rows: list[tuple[int, str]], options: ReadOptions, out: LabeledText):
    if not rows:
        return
    first_number, first_line = rows[0]
    first = _split_row(path, fmt, first_number, first_line)
    out.header = _is_header(first, options)
    width = len(first)
    label_at = _column(path, first if out.header else None, options.label_column, width, "label")
    text_at = [_column(path, first if out.header else None, c, width, "text") for c in options.text_columns]
    for number, line in rows[1:] if out.header else rows:
        cells = first if number == first_number else _split_row(path, fmt, number, line)
        if len(cells) != width:
            hint = " (a tab inside the text?)" if fmt == "tsv" and len(cells) > width else ""
            raise DataError(
                f"{path}:{number}: {len(cells)} column(s) but line {first_number} has {width}{hint}"
            )
        yield number, cells[label_at], *(cells[i] for i in text_at)


def _trec_row(path: Path, number: int, line: str, fine_labels: bool) -> tuple[int, str, str]:
    head, _, body = line.partition(" ")
    coarse, colon, fine = head.partition(":")
    if not colon or not coarse or not fine:
        raise DataError(f"{path}:{number}: expected 'COARSE:fine text', got {line[:60]!r}")
    return number, head if fine_labels else coarse, body


def _jsonl_row(path: Path, number: int, line: str, options: ReadOptions, out: LabeledText) -> tuple[int, str, str]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{number}: invalid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise DataError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
    for key in (options.label_key, options.text_key):
        if key not in record:
            raise DataError(f"{path}:{number}: missing key {key!r} (keys: {', '.join(map(str, record))}); "
                            "set --label-key / --text-key")
    label, body = record[options.label_key], record[options.text_key]
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        raise DataError(f"{path}:{number}: label {label!r} must be a string or an integer")
    if not isinstance(body, str):
        raise DataError(f"{path}:{number}: text {body!r} must be a string")
    if "\n" in body or "\r" in body:
        body = " ".join(part for part in body.replace("\r", "\n").split("\n") if part)
        out.joined_lines += 1
    return number, str(label), body
