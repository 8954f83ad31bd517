"""The code-docstring format: DCNL/DCSP/DCTB decoding and encoding, docstring literals, the reader.

Every example here is hand-written; the real corpus is only read (never copied) by the last test.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multibranch.errors import DataError
from multibranch.tasks.code.corpus import (
    INDENT,
    CodeCorpus,
    decode_code,
    decode_docstring,
    encode_code,
    raw_docstring,
    read_code_corpus,
)
from multibranch.tasks.code.metrics import parses

_ESCAPE_WORDS = re.compile(r"\b(DCNL|DCSP|DCTB)\b")

# (escaped one-line form, expected Python source) written by hand
DECODE_CASES = [
    (  # nested indentation, a space inside a string
        "def f(x): DCNL DCSP if x: DCNL DCSP  DCSP for y in x: DCNL DCSP  DCSP  DCSP print('a DCSP b') "
        "DCNL DCSP return None",
        "def f(x):\n    if x:\n        for y in x:\n            print('a b')\n    return None",
    ),
    (  # the corpus's variant with two spaces after the first DCNL decodes the same
        "def f(x): DCNL  DCSP if x: DCNL DCSP  DCSP return 1 DCNL DCSP return 2",
        "def f(x):\n    if x:\n        return 1\n    return 2",
    ),
    (  # consecutive, leading and trailing spaces inside strings; a tab
        "def g(): DCNL DCSP return ('a DCSP  DCSP b', ' DCSP x DCSP ', ' DCSP ', 'c DCTB d', ' DCTB  DCSP ')",
        "def g():\n    return ('a  b', ' x ', ' ', 'c\td', '\t ')",
    ),
    (  # a blank line, a decorator and a nested function back at a lower level
        "@cache DCNL def h(n): DCNL DCSP def inner(): DCNL DCSP  DCSP return n DCNL  DCNL DCSP return inner",
        "@cache\ndef h(n):\n    def inner():\n        return n\n\n    return inner",
    ),
    (  # escape words are whole words only: identifiers that contain them are untouched
        "def k(): DCNL DCSP MY_DCSP = XDCNL DCNL DCSP return 'DCSPx'",
        "def k():\n    MY_DCSP = XDCNL\n    return 'DCSPx'",
    ),
    ("", ""),
]


@pytest.mark.parametrize(("escaped", "source"), DECODE_CASES)
def test_decode_code_hand_made(escaped, source):
    assert decode_code(escaped) == source


def test_decode_code_levels_ignore_spacing_around_dcsp():
    spaced = "def f(): DCNL DCSP  DCSP x = 1"
    tight = "def f(): DCNL DCSP DCSP x = 1"
    assert decode_code(spaced) == decode_code(tight) == "def f():\n        x = 1"


# (Python source, expected escaped form) written by hand: the canonical spacing of the corpus
ENCODE_CASES = [
    ("def f(x):\n    return x", "def f(x): DCNL DCSP return x"),
    (
        "def f(x):\n    if x:\n        s = 'a  b\\tc'\n        return s\n    return ' '",
        "def f(x): DCNL DCSP if x: DCNL DCSP  DCSP s = 'a DCSP  DCSP b\\tc' DCNL DCSP  DCSP return s "
        "DCNL DCSP return ' DCSP '",
    ),
    ("def t():\n    return 'x\ty'", "def t(): DCNL DCSP return 'x DCTB y'"),
    ("@d\ndef f():\n    pass\n\nx = f", "@d DCNL def f(): DCNL DCSP pass DCNL  DCNL x = f"),
]


@pytest.mark.parametrize(("source", "escaped"), ENCODE_CASES)
def test_encode_code_hand_made(source, escaped):
    assert encode_code(source) == escaped
    assert decode_code(escaped) == source  # and back


ROUND_TRIP_SOURCES = [
    "def add(a, b=2, *args, **kw):\n    return a + b",
    "class A:\n    def m(self):\n        try:\n            return {'k v': [1, 2]}\n        except KeyError:\n"
    "            raise\n        finally:\n            pass",
    "def fmt(x):\n    return f'{x} and  {x!r}'",
    "def w(p):\n    with open(p) as fh:\n        while True:\n            if not fh.read(1):\n"
    "                break\n    return  'two  spaces '",
    "def g():\n    yield (lambda y: y * 2)\n\n\n    yield 'end'",
    "def u():\n    return f'caf\u00e9  {1}' + '\u65e5\u672c \u8a9e'",  # columns are characters, not bytes
]


@pytest.mark.parametrize("source", ROUND_TRIP_SOURCES)
def test_round_trip_decode_encode(source):
    escaped = encode_code(source)
    assert "\n" not in escaped
    assert decode_code(escaped) == source
    assert encode_code(decode_code(escaped)) == escaped


@given(
    st.text(alphabet="ab DCSPNLT\t\u00e9", max_size=20),
    st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=6),
)
def test_round_trip_property(content, depths):
    """Any run of spaces and tabs inside a string, at any nesting depth, survives encode -> decode."""
    body, level = [], 1
    for depth in depths:  # an `if` with a one-statement body, then back to any enclosing level
        body += [INDENT * level + "if s:", INDENT * (level + 1) + f"s = '{content}'"]
        level = min(depth, level) + 1
    source = "def f(s):\n" + "\n".join(body) + "\n" + INDENT * level + "return s"
    if _ESCAPE_WORDS.search(source):
        with pytest.raises(ValueError, match="escape word"):
            encode_code(source)
        return
    escaped = encode_code(source)
    assert "\n" not in escaped and "\t" not in escaped
    assert decode_code(escaped) == source
    assert parses(decode_code(escaped))


def test_encode_levels_from_any_indentation_width():
    two_spaces = "def f(x):\n  if x:\n    return 1\n  return 2\n"
    tabs = "def f(x):\n\tif x:\n\t\treturn 1\n\treturn 2"
    expected = "def f(x): DCNL DCSP if x: DCNL DCSP  DCSP return 1 DCNL DCSP return 2"
    assert encode_code(two_spaces) == encode_code(tabs) == expected
    assert decode_code(expected) == "def f(x):\n    if x:\n        return 1\n    return 2"


def test_encode_method_copied_out_of_its_class():
    method = "    def m(self):\n        return self.x\n"
    assert encode_code(method) == "def m(self): DCNL DCSP return self.x"


def test_encode_multiline_string_is_the_known_ambiguity():
    source = "def f():\n    return \'\'\'a\n  b\'\'\'"
    escaped = encode_code(source)
    assert escaped == "def f(): DCNL DCSP return \'\'\'a DCNL  DCSP  DCSP b\'\'\'"
    # the two spaces in the string are read as two indentation levels
    assert decode_code(escaped) == "def f():\n    return \'\'\'a\n        b\'\'\'"


def test_encode_continuation_and_comment_lines_lose_leading_space():
    source = "def f():\n    x = [1,\n         2]  # two\n        # stray comment\n    return x"
    escaped = encode_code(source)
    assert escaped == "def f(): DCNL DCSP x = [1, DCNL 2]  # two DCNL # stray comment DCNL DCSP return x"
    assert parses(decode_code(escaped))


@pytest.mark.parametrize("source", ["x = 'DCSP'", "DCNL = 1", "s = 'a DCTB b'"])
def test_encode_refuses_escape_words(source):
    with pytest.raises(ValueError, match="escape word"):
        encode_code(source)


def test_encode_refuses_source_that_does_not_tokenize():
    with pytest.raises(ValueError, match="cannot tokenize"):
        encode_code("def f(:\n    return (1")


# ---- docstrings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "text"),
    [
        ("'Return the sum. DCNL Both arguments are ints.'", "Return the sum.\nBoth arguments are ints."),
        ('"It\'s a \\"quoted\\" word"', 'It\'s a "quoted" word'),
        ("'tab\\there, backslash \\\\ and caf\\xe9'", "tab\there, backslash \\ and caf\u00e9"),
        ("u'unicode prefix'", "unicode prefix"),
        ("''", ""),
        ("'A regex \\d+ kept as written'", "A regex \\d+ kept as written"),
    ],
)
def test_decode_docstring(line, text):
    assert decode_docstring(line) == text


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("'unterminated", "not a valid Python string literal"),
        ("'bad \\x escape'", "not a valid Python string literal"),
        ("42", "expected a string literal, got a int"),
        ("b'bytes'", "expected a string literal, got a bytes"),
        ("__import__('os').getcwd()", "not a valid Python string literal"),
        ("'a' + 'b'", "not a valid Python string literal"),
    ],
)
def test_decode_docstring_rejects(line, reason):
    with pytest.raises(DataError, match=rf"^train\.desc:7: {reason}"):
        decode_docstring(line, where="train.desc:7")


def test_raw_docstring_strips_outer_quotes():
    assert raw_docstring("'bad \\x escape DCNL next'") == "bad \\x escape\nnext"
    assert raw_docstring('"""triple"""') == "triple"


# ---- reader --------------------------------------------------------------------------------------


def _write(tmp_path: Path, desc: bytes, code: bytes) -> Path:
    prefix = tmp_path / "part"
    (tmp_path / "part.desc").write_bytes(desc)
    (tmp_path / "part.code").write_bytes(code)
    return prefix


def test_read_code_corpus(tmp_path):
    prefix = _write(
        tmp_path,
        b"'Add. DCNL Twice.'\r\n'Nothing.'\n",
        b"def add(a, b): DCNL DCSP return a + b\r\ndef nop(): DCNL DCSP pass\n",
    )
    corpus = read_code_corpus(prefix)
    assert corpus == CodeCorpus(["Add.\nTwice.", "Nothing."],
                                ["def add(a, b): DCNL DCSP return a + b", "def nop(): DCNL DCSP pass"])
    docstrings, codes = corpus  # unpacks as a pair
    assert decode_code(codes[0]) == "def add(a, b):\n    return a + b"


def test_read_code_corpus_unequal_line_counts(tmp_path):
    prefix = _write(tmp_path, b"'a'\n'b'\n", b"def f(): DCNL DCSP pass\n")
    with pytest.raises(DataError, match=r"line counts differ: .*part\.desc has 2 lines, .*part\.code has 1"):
        read_code_corpus(prefix)


def test_read_code_corpus_invalid_utf8_names_file_and_line(tmp_path):
    prefix = _write(tmp_path, b"'a'\n'b'\n", b"def f(): DCNL DCSP pass\nx = '\xff'\n")
    with pytest.raises(DataError, match=r"part\.code:2: invalid UTF-8"):
        read_code_corpus(prefix)


@pytest.mark.parametrize(("desc", "code", "where"), [
    (b"'a'\n\n", b"def f(): DCNL DCSP pass\ndef g(): DCNL DCSP pass\n", r"part\.desc:2"),
    (b"'a'\n'b'\n", b"def f(): DCNL DCSP pass\n   \n", r"part\.code:2"),
])
def test_read_code_corpus_empty_line(tmp_path, desc, code, where):
    with pytest.raises(DataError, match=rf"{where}: empty line"):
        read_code_corpus(_write(tmp_path, desc, code))


def test_read_code_corpus_malformed_docstring(tmp_path, caplog):
    code = b"def f(): DCNL DCSP pass\ndef g(): DCNL DCSP pass\n"
    prefix = _write(tmp_path, b"'ok'\n'bad \\x DCNL escape'\n", code)
    with pytest.raises(DataError, match=r"part\.desc:2: not a valid .*literal.*docstring_errors='raw'"):
        read_code_corpus(prefix)
    with caplog.at_level(logging.WARNING):
        corpus = read_code_corpus(prefix, docstring_errors="raw")
    assert corpus.docstrings == ["ok", "bad \\x\nescape"]
    assert "kept 1 malformed docstring literal(s) as raw text (first: line 2)" in caplog.text


def test_read_code_corpus_missing_file(tmp_path):
    (tmp_path / "part.desc").write_text("'a'\n")
    with pytest.raises(DataError, match=r"part\.code: file not found"):
        read_code_corpus(tmp_path / "part")


# ---- the real corpus (read only) -----------------------------------------------------------------


def test_real_valid_split_decodes_to_parseable_code(code_docstring):
    corpus = read_code_corpus(code_docstring / "valid", docstring_errors="raw")
    assert len(corpus.docstrings) == len(corpus.codes) > 0
    rate = sum(parses(decode_code(code)) for code in corpus.codes) / len(corpus.codes)
    assert rate >= 0.90  # the README says ~97%; the rest is Python 2
