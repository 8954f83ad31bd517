"""`multibranch prepare --task code`: a code-docstring corpus -> a desc->code translation directory.

Every corpus here is written by the test (templates in tests/helpers/code.py), never taken from the real
corpus; the real corpus is only read through the `code_docstring` fixture.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multibranch.cli import main
from multibranch.tasks import task_name_of
from multibranch.tasks.code.corpus import decode_code
from multibranch.tasks.code.prepare import holdout_indices, source_line
from multibranch.tasks.translation.dataset import PreparedData
from tests.helpers.code import synthetic_pairs, write_corpus


def prepare_args(root: Path, *extra: str) -> list[str]:
    return ["prepare", "--task", "code", "--train", str(root / "train"), "--valid", str(root / "valid"),
            "--out", str(root / "data"), "--vocab-size", "80", *extra]


@pytest.fixture
def corpus(tmp_path) -> Path:
    write_corpus(tmp_path / "train", synthetic_pairs(60, seed=1))
    write_corpus(tmp_path / "valid", synthetic_pairs(8, seed=2))
    return tmp_path


# ---- the good path --------------------------------------------------------------------------------


def test_prepare_code_writes_a_code_translation_directory(corpus, capsys):
    train = synthetic_pairs(60, seed=1)
    assert main(prepare_args(corpus, "--holdout", "10", "--seed", "4")) == 0
    data = PreparedData.load(corpus / "data")
    meta = data.meta
    assert meta["task"] == "code" and task_name_of(corpus / "data") == "code"
    assert (meta["src_lang"], meta["tgt_lang"]) == ("desc", "code")
    assert [meta["splits"][s]["pairs"] for s in ("train", "valid", "test")] == [50, 8, 10]

    held = holdout_indices(60, 10, seed=4)  # the seeded draw, recomputed independently of prepare
    assert meta["code"]["holdout"]["train_indices"] == held
    test = data.split("test")
    assert test.raw_tgt_lines() == [train[i][1] for i in held]  # escaped code kept as in the corpus
    kept = [pair for i, pair in enumerate(train) if i not in held]
    assert data.split("train").raw_tgt_lines() == [code for _, code in kept]
    # sources are the decoded docstrings on one line: quotes gone, DCNL -> newline -> one space
    sources = data.split("train").raw_src_lines()
    greet = next(i for i, (desc, _) in enumerate(kept) if desc.startswith("'Greet"))
    name = kept[greet][0].split()[1].rstrip(".")
    assert sources[greet] == f"Greet {name}. Says hello."
    assert decode_code(test.raw_tgt_lines()[0]).startswith("def ")
    report = (corpus / "data" / "report.md").read_text(encoding="utf-8")
    assert "## Code generation" in report and "10 training examples (seed 4)" in report
    assert "prepared desc->code" in capsys.readouterr().out


def test_prepare_code_holdout_zero_and_extra_test(corpus):
    write_corpus(corpus / "extra", synthetic_pairs(5, seed=9))
    assert main(prepare_args(corpus, "--holdout", "0", "--test", str(corpus / "extra"))) == 0
    splits = json.loads((corpus / "data" / "data.json").read_text())["splits"]
    assert {name: s["pairs"] for name, s in splits.items()} == {"train": 60, "valid": 8, "test": 5}


def test_prepare_code_drops_empty_docstrings_and_keeps_raw_literals_on_request(tmp_path, caplog):
    pairs = synthetic_pairs(30, seed=1)
    pairs[3] = ("''", pairs[3][1])  # an empty docstring value: dropped, counted
    pairs[5] = ("'bad \\x escape'", pairs[5][1])  # not a valid literal
    write_corpus(tmp_path / "train", pairs)
    write_corpus(tmp_path / "valid", synthetic_pairs(4, seed=2))
    assert main(prepare_args(tmp_path, "--holdout", "0")) == 2  # strict by default
    assert main(prepare_args(tmp_path, "--holdout", "0", "--docstring-errors", "raw")) == 0
    meta = json.loads((tmp_path / "data" / "data.json").read_text())
    assert meta["splits"]["train"]["pairs"] == 29 and meta["splits"]["train"]["dropped"]["empty"] == 1
    assert meta["code"]["raw_docstrings"][f"{tmp_path / 'train'}.desc"] == [6]
    sources = (tmp_path / "data" / "train.src.txt").read_text(encoding="utf-8").split("\n")
    assert sources[4] == "bad \\x escape"  # line 6 of the corpus, after the dropped line 4


# ---- bad input: one line on stderr, exit 2, nothing written -----------------------------------------


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_mismatched_line_counts(corpus, capsys):
    with open(corpus / "train.code", "a", encoding="utf-8") as handle:
        handle.write("def extra(): DCNL DCSP pass\n")
    assert main(prepare_args(corpus)) == 2
    assert "line counts differ" in _error(capsys)
    assert not (corpus / "data").exists()


@pytest.mark.parametrize("side", ["desc", "code"])
def test_empty_line(corpus, capsys, side):
    path = corpus / f"valid.{side}"
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[2] = "  "
    path.write_text("\n".join(lines), encoding="utf-8")
    assert main(prepare_args(corpus)) == 2
    assert f"valid.{side}:3: empty line" in _error(capsys)


def test_invalid_utf8(corpus, capsys):
    with open(corpus / "train.desc", "ab") as handle:
        handle.write(b"'caf\xe9'\n")
    with open(corpus / "train.code", "a", encoding="utf-8") as handle:
        handle.write("def cafe(): DCNL DCSP pass\n")
    assert main(prepare_args(corpus)) == 2
    assert "train.desc:61: invalid UTF-8" in _error(capsys)


def test_malformed_docstring_literal_names_the_flag(corpus, capsys):
    lines = (corpus / "train.desc").read_text(encoding="utf-8").split("\n")
    lines[6] = "'unterminated"
    (corpus / "train.desc").write_text("\n".join(lines), encoding="utf-8")
    assert main(prepare_args(corpus)) == 2
    err = _error(capsys)
    assert "train.desc:7: not a valid Python string literal" in err and "--docstring-errors raw" in err


def test_missing_file_and_missing_valid(corpus, capsys):
    (corpus / "valid.code").unlink()
    assert main(prepare_args(corpus)) == 2
    assert "valid.code" in _error(capsys)
    assert main(["prepare", "--task", "code", "--train", str(corpus / "train"), "--out", str(corpus / "d")]) == 2
    assert "needs --valid" in _error(capsys)


@pytest.mark.parametrize(("extra", "message"), [
    (["--holdout", "60"], "holdout=60 asks for 60 of 60"),
    (["--holdout", "2.5"], "holdout=2.5 must be"),
    (["--src", "en"], "--src: not for --task code"),
    (["--format", "tsv"], "--format: not for --task code"),
    (["--max-len-ratio", "2"], "--max-len-ratio: not for --task code"),
])
def test_bad_flags(corpus, capsys, extra, message):
    assert main(prepare_args(corpus, *extra)) == 2
    assert message in _error(capsys)
    assert not (corpus / "data").exists()


def test_docstring_errors_flag_is_code_only(corpus, capsys):
    args = ["prepare", "--src", "desc", "--tgt", "code", "--train", str(corpus / "train"), "--valid",
            str(corpus / "valid"), "--out", str(corpus / "d"), "--docstring-errors", "raw"]
    assert main(args) == 2
    assert "--docstring-errors: not for --task translate" in _error(capsys)


def test_existing_output_needs_force_and_other_files_are_kept(corpus, capsys):
    (corpus / "data").mkdir()
    (corpus / "data" / "keep.txt").write_text("x")
    assert main(prepare_args(corpus, "--holdout", "5", "--force")) == 2
    assert "is a directory of other files, not a prepared data directory" in _error(capsys)
    assert [p.name for p in (corpus / "data").iterdir()] == ["keep.txt"]
    (corpus / "data" / "keep.txt").unlink()
    assert main(prepare_args(corpus, "--holdout", "5")) == 0
    assert main(prepare_args(corpus, "--holdout", "5")) == 2
    assert "pass --force" in _error(capsys)
    assert main(prepare_args(corpus, "--holdout", "5", "--force")) == 0


def test_source_line_folds_whitespace():
    assert source_line("Add two numbers.\n\n  Returns:\tthe sum ") == "Add two numbers. Returns: the sum"


# ---- the real corpus (read only) --------------------------------------------------------------------


@pytest.mark.slow
def test_real_corpus_prepares(code_docstring, tmp_path):
    """~20 s: the whole corpus with its 6 malformed literals kept raw and a 1000-example test split."""
    assert main(["prepare", "--task", "code", "--train", str(code_docstring / "train"), "--valid",
                 str(code_docstring / "valid"), "--out", str(tmp_path / "data"), "--docstring-errors", "raw",
                 "--vocab-size", "2000"]) == 0
    meta = json.loads((tmp_path / "data" / "data.json").read_text())
    n_train = len((code_docstring / "train.code").read_bytes().splitlines())
    held = meta["code"]["holdout"]["train_indices"]
    assert len(held) == 1000 and held == holdout_indices(n_train, 1000, 1)
    train, test = meta["splits"]["train"], meta["splits"]["test"]
    assert train["lines"] == n_train - 1000 and test["lines"] == 1000
    assert sum(len(v) for v in meta["code"]["raw_docstrings"].values()) == 6
    test_code = set((tmp_path / "data" / "test.tgt.txt").read_text(encoding="utf-8").split("\n"))
    train_code = set((tmp_path / "data" / "train.tgt.txt").read_text(encoding="utf-8").split("\n"))
    assert not (test_code - {""}) & train_code  # the corpus is de-duplicated by code
