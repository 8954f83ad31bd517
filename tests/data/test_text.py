"""Line reading rules: `\\n` only, CRLF, BOM, strict UTF-8 with file:line, aligned pairs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multibranch.data.text import open_input, read_lines, read_parallel, write_lines
from multibranch.errors import DataError


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_splits_on_newline_only(tmp_path):
    # U+2028, U+2029, U+0085, form feed and a lone CR are inside lines, never line breaks.
    lines = ["a\u2028b", "c\u2029d", "e\u0085f", "g\x0ch", "i\rj"]
    path = _write(tmp_path / "f.txt", "\n".join(lines).encode() + b"\n")
    assert read_lines(path).lines == lines


def test_crlf_bom_and_final_newline(tmp_path):
    path = _write(tmp_path / "f.txt", b"\xef\xbb\xbfone\r\ntwo\r\n\r\nfour\r\n")
    assert read_lines(path).lines == ["one", "two", "", "four"]
    # Only one trailing CR is removed; a BOM is only special at the start of the file.
    path = _write(tmp_path / "g.txt", b"x\r\r\n\xef\xbb\xbfy")
    assert read_lines(path).lines == ["x\r", "\ufeffy"]


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"", []), (b"\n", [""]), (b"a", ["a"]), (b"a\n", ["a"]), (b"a\n\n", ["a", ""]), (b"\xef\xbb\xbf", [])],
)
def test_line_counting_edge_cases(tmp_path, data, expected):
    assert read_lines(_write(tmp_path / "f.txt", data)).lines == expected


def test_invalid_utf8_strict_names_file_line_and_fix(tmp_path):
    path = _write(tmp_path / "bad.de", "ok\nstill ok\nab\u00e4".encode() + b"c\xffd\nlast\n")
    with pytest.raises(DataError) as err:
        read_lines(path)
    message = str(err.value)
    assert f"{path}:3:" in message
    assert "0xff" in message and "column 5" in message
    assert "--encoding-errors replace" in message


def test_invalid_utf8_replace_keeps_going_and_counts(tmp_path):
    path = _write(tmp_path / "bad.de", b"ok\n\xff\xfe bad\nfine\nbad \xc3\n")
    text = read_lines(path, encoding_errors="replace")
    assert text.replaced == 2
    assert len(text) == 4
    assert text.lines[0] == "ok" and text.lines[2] == "fine"
    assert "\ufffd" in text.lines[1] and "\ufffd" in text.lines[3]


@pytest.mark.parametrize(("n_src", "n_tgt"), [(5, 3), (2, 4)])
def test_unequal_line_counts_name_both_files_counts_and_first_extra_line(tmp_path, n_src, n_tgt):
    src = _write(tmp_path / "train.en", "".join(f"s{i}\n" for i in range(n_src)).encode())
    tgt = _write(tmp_path / "train.de", "".join(f"t{i}\n" for i in range(n_tgt)).encode())
    with pytest.raises(DataError) as err:
        read_parallel(src, tgt)
    message = str(err.value)
    longer = src if n_src > n_tgt else tgt
    assert str(src) in message and str(tgt) in message
    assert f"{n_src} lines" in message and f"has {n_tgt}" in message
    assert f"line {min(n_src, n_tgt) + 1} exists only in {longer}" in message


def test_u2028_does_not_shift_alignment(tmp_path):
    src = _write(tmp_path / "a.en", "one\u2028still one\ntwo\n".encode())
    tgt = _write(tmp_path / "a.de", b"eins\r\nzwei\r\n")
    pair = read_parallel(src, tgt)
    assert pair.src.lines == ["one\u2028still one", "two"]
    assert pair.tgt.lines == ["eins", "zwei"]


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_lines(tmp_path / "nope.en")
    present = _write(tmp_path / "x.en", b"a\n")
    with pytest.raises(DataError, match=str(tmp_path / "x.de")):
        read_parallel(present, tmp_path / "x.de")


def test_a_directory_is_named_as_such_not_missing(tmp_path):
    """A directory where a text file is expected said "not found" / "not a regular file"."""
    folder = tmp_path / "corpus.en"
    folder.mkdir()
    present = _write(tmp_path / "x.de", b"a\n")
    with pytest.raises(DataError, match=f"{folder}: is a directory"):
        read_lines(folder)
    with pytest.raises(DataError, match=f"{folder}: is a directory"):
        read_parallel(folder, present)
    with pytest.raises(DataError, match=f"{folder}: is a directory"), open_input(str(folder)):
        pass


_line = st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=20).filter(
    lambda s: not s.endswith("\r")
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_line, max_size=8))
def test_write_then_read_round_trips(tmp_path_factory, lines):
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = "x" + lines[0]
    path = tmp_path_factory.mktemp("rt") / "f.txt"
    write_lines(path, lines)
    assert read_lines(path).lines == lines


def test_write_refuses_embedded_newline(tmp_path):
    with pytest.raises(ValueError):
        write_lines(tmp_path / "f.txt", ["a\nb"])
