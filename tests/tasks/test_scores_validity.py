"""Scores that must not be silently wrong.

- PoV counts a hypothesis only if it parses as one function definition (text that merely parses,
  such as `QQQQ` or `raise SystemExit(3)`, does not count); the expected verdicts are written by hand.
- `evaluate --task classify` refuses predicted labels that the reference never uses (naming them),
  unless `--allow-unseen-labels`.
- `evaluate --task code` reads `translate --code-format source` output with `--code-format source`
  and says so when it is given that output without the flag.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multibranch.cli import main


def _write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


def _lines(path: Path, lines: list[str]) -> Path:
    return _write(path, "".join(line + "\n" for line in lines))


def _evaluate(*argv: str) -> int:
    return main(["evaluate", *argv])


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("multibranch evaluate: error: ")
    return err[0]


# ---- PoV: a valid hypothesis is one function definition --------------------------------------------

# (Python source, counts for PoV): verdicts written by hand, not computed with the library.
POV_CASES = [
    ("def f():\n    pass", True),
    ("def f(x):\n    return x + 1\n", True),
    ("@property\ndef name(self):\n    return self._name", True),  # decorators belong to the definition
    ("@a.b(1)\n@c\ndef f(x):\n    return x", True),
    ("async def f(x):\n    return await x", True),
    ("# a comment\n\ndef f():\n    pass\n", True),  # comments and blank lines are not statements
    ("def f():\n    def g():\n        return 1\n    class C:\n        pass\n    return g, C", True),
    ("def f():\n    return undefined_name", True),  # parse only: names are never resolved
    ("QQQQQQQQQQQQQQQQ", False),  # parses (a bare name), is not a function
    ("raise SystemExit(3)", False),
    ("x = 1", False),
    ("pass", False),
    ("'''only a docstring'''", False),
    ("f = lambda x: x", False),
    ("import os\ndef f():\n    pass", False),  # a statement before the function
    ("def f():\n    pass\nQQQQ", False),  # ... or after it
    ("def f():\n    pass\nf()", False),
    ("def f():\n    pass\ndef g():\n    pass", False),  # two functions for one docstring
    ("class C:\n    def f(self):\n        pass", False),
    ("if True:\n    def f():\n        pass", False),
    ("@decorator", False),  # does not parse
    ("def f():\nreturn 1", False),
    ("def f(x):\n    print x", False),  # Python 2
    ("", False),
]


@pytest.mark.parametrize(("source", "valid"), POV_CASES, ids=[repr(s[:24]) for s, _ in POV_CASES])
def test_pov_counts_only_a_function_definition(source, valid):
    from multibranch.tasks.code.metrics import score_code

    pov = score_code([source], ["def f():\n    pass"], escaped=False)["pov"]
    assert (pov["valid"], pov["invalid"], pov["score"]) == ((1, 0, 1.0) if valid else (0, 1, 0.0))


def test_evaluate_code_pov_of_parseable_non_functions(tmp_path, capsys):
    hyp = _lines(tmp_path / "hyp.code", [
        "QQQQQQQQQQQQQQQQQQQQ",
        "raise SystemExit(3)",
        "def f(): DCNL DCSP return 1 DCNL QQQQ",
        "def add(a, b): DCNL DCSP return (a + b)",
    ])
    ref = _lines(tmp_path / "ref.code", ["def add(a, b): DCNL DCSP return (a + b)"] * 4)
    assert _evaluate("--task", "code", "--hyp", str(hyp), "--ref", str(ref), "--json", str(tmp_path / "s.json")) == 0
    out = capsys.readouterr().out
    assert "PoV = 25.00% (1/4" in out
    report = json.loads((tmp_path / "s.json").read_text(encoding="utf-8"))
    assert report["pov"]["valid"] == 1 and report["pov"]["invalid"] == 3 and report["pov"]["score"] == 0.25
    assert report["pov"]["not_function"] == 3  # they parse, but are not one function definition


# ---- classify: predicted labels the reference never uses ---------------------------------------------


def test_evaluate_classify_refuses_labels_the_reference_never_uses(tmp_path, capsys):
    hyp = _lines(tmp_path / "hyp.txt", ["positive", "negative\t0.9", "Positive", "positive"])
    ref = _lines(tmp_path / "ref.txt", ["Positive", "Negative", "Positive", "Negative"])
    out = tmp_path / "s.json"
    assert _evaluate("--task", "classify", "--hyp", str(hyp), "--ref", str(ref), "--json", str(out)) == 2
    line = _one_error_line(capsys)
    assert "'negative'" in line and "'positive'" in line and "'Positive'" not in line.split(";")[0]
    assert f"{ref}" in line and "--allow-unseen-labels" in line
    assert "case" in line  # they differ from the reference's labels only in case
    assert not out.exists()


def test_evaluate_classify_unseen_labels_with_the_flag(tmp_path, capsys, caplog):
    # a legitimate case: the reference (a subset) has no 'c', the classifier predicts it once
    hyp = _lines(tmp_path / "hyp.txt", ["a", "c", "b", "b"])
    ref = _lines(tmp_path / "ref.txt", ["a", "a", "b", "b"])
    base = ["--task", "classify", "--hyp", str(hyp), "--ref", str(ref), "--json", "-"]
    assert _evaluate(*base) == 2
    line = _one_error_line(capsys)
    assert "'c'" in line and "hyp.txt:2" in line
    assert _evaluate(*base, "--allow-unseen-labels") == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    # by hand: a P 1/1 R 1/2 F1 2/3; b P 2/2 R 2/2 F1 1; c P 0/1 R 0/0 F1 0 -> macro (2/3 + 1 + 0) / 3
    assert report["accuracy"] == pytest.approx(3 / 4)
    assert report["macro_f1"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert report["labels_not_in_reference"] == {"c": 1}
    assert "never uses, scored as wrong predictions: 'c'" in caplog.text  # still named (stderr)


def test_evaluate_classify_labels_the_reference_uses_are_accepted(tmp_path, capsys):
    hyp = _lines(tmp_path / "hyp.txt", ["a", "a", "a"])  # never predicting 'b' is fine
    ref = _lines(tmp_path / "ref.txt", ["a", "b", "a"])
    assert _evaluate("--task", "classify", "--hyp", str(hyp), "--ref", str(ref), "--json", "-") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["accuracy"] == pytest.approx(2 / 3) and "labels_not_in_reference" not in report


# ---- code: the one-line escaped form and translate's --code-format source ----------------------------

ESCAPED = [
    "def add(a, b): DCNL DCSP return (a + b)",
    "@staticmethod DCNL def show(x): DCNL DCSP if (x > 0): DCNL DCSP  DCSP print('x DCSP =', x)",
    "",  # the model wrote nothing
    "raise SystemExit(3)",
]
# what `translate --code-format source` writes for ESCAPED: each function's source, then an empty line
SOURCE = ("def add(a, b):\n    return (a + b)\n\n"
          "@staticmethod\ndef show(x):\n    if (x > 0):\n        print('x =', x)\n\n"
          "\n\n"
          "raise SystemExit(3)\n\n")
REFERENCES = [
    "def add(a, b): DCNL DCSP return (a + b)",
    "@staticmethod DCNL def show(x): DCNL DCSP if (x > 0): DCNL DCSP  DCSP print('x DCSP =', x)",
    "def nothing(): DCNL DCSP pass",
    "def stop(): DCNL DCSP raise SystemExit(3)",
]


def test_evaluate_code_reads_the_source_format(tmp_path, capsys):
    escaped = _lines(tmp_path / "hyp.code", ESCAPED)
    source = _write(tmp_path / "hyp.py", SOURCE)
    ref = _lines(tmp_path / "ref.code", REFERENCES)
    assert _evaluate("--task", "code", "--hyp", str(escaped), "--ref", str(ref), "--json", "-") == 0
    from_escaped = json.loads(capsys.readouterr().out)
    assert _evaluate("--task", "code", "--hyp", str(source), "--ref", str(ref), "--json", "-",
                     "--code-format", "source") == 0
    from_source = json.loads(capsys.readouterr().out)
    assert from_source["lines"] == 4 and from_source["pov"]["valid"] == 2  # add and show
    for key in ("pov", "sentence_bleu", "bleu"):
        assert from_source[key] == from_escaped[key], key
    assert from_source["code_format"] == "source" and from_escaped["code_format"] == "escaped"


def test_evaluate_code_source_format_from_stdin_without_final_empty_line(tmp_path, capsys, monkeypatch):
    import io
    import sys

    ref = _lines(tmp_path / "ref.code", REFERENCES[:2])
    text = "def add(a, b):\n    return (a + b)\n\n@staticmethod\ndef show(x):\n    if (x > 0):\n        print('x =', x)\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))
    assert _evaluate("--task", "code", "--hyp", "-", "--ref", str(ref), "--json", "-", "--code-format", "source") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pov"]["valid"] == 2 and report["bleu"]["score"] == pytest.approx(100.0)


def test_evaluate_code_names_the_source_format_when_it_is_not_given(tmp_path, capsys):
    source = _write(tmp_path / "hyp.py", SOURCE)
    ref = _lines(tmp_path / "ref.code", REFERENCES)
    assert _evaluate("--task", "code", "--hyp", str(source), "--ref", str(ref)) == 2
    line = _one_error_line(capsys)
    assert "line counts differ" in line and "--code-format source" in line


def test_evaluate_code_source_format_with_an_empty_line_inside_a_function(tmp_path, capsys):
    # a function with an empty line inside cannot be told from two functions in the source format
    source = _write(tmp_path / "hyp.py", "def f():\n    x = 1\n\n    return x\n\ndef g():\n    pass\n\n")
    ref = _lines(tmp_path / "ref.code", ["def f(): DCNL DCSP x = 1 DCNL DCSP return x", "def g(): DCNL DCSP pass"])
    assert _evaluate("--task", "code", "--hyp", str(source), "--ref", str(ref), "--code-format", "source") == 2
    line = _one_error_line(capsys)
    assert "3 functions" in line and "2 lines" in line and "empty line" in line and "escaped" in line


@pytest.mark.parametrize(("task", "flag", "message"), [
    ("classify", ["--code-format", "source"], "--code-format: only for --task code"),
    ("translate", ["--code-format", "escaped"], "--code-format: only for --task code"),
    ("code", ["--allow-unseen-labels"], "--allow-unseen-labels: only for --task classify"),
    ("translate", ["--allow-unseen-labels"], "--allow-unseen-labels: only for --task classify"),
])
def test_task_specific_flags_are_refused_elsewhere(tmp_path, capsys, task, flag, message):
    hyp = _lines(tmp_path / "hyp.txt", ["a"])
    assert _evaluate("--task", task, "--hyp", str(hyp), "--ref", str(hyp), *flag) == 2
    assert message in _one_error_line(capsys)


def test_source_constant_is_what_translate_writes():
    """SOURCE above is written by hand; translate's own renderer must agree with it (the contract)."""
    from multibranch.tasks.code.corpus import code_source
    from multibranch.tasks.translation.files import format_translations

    class Echo:
        def translate(self, chunk, progress=False, first_line=1):
            return list(chunk)

    assert format_translations(Echo(), ESCAPED, 1, 0, render=code_source) == SOURCE


def test_source_split_is_right_whenever_the_count_matches():
    """Over random outputs of functions made of 'a' and newlines (empty ones, empty lines first, last and
    inside), written as translate writes them: the split never gives fewer pieces than functions, and
    when it gives as many, each piece is its function but for leading or trailing newlines."""
    import random

    from multibranch.tasks.code.corpus import split_source_functions

    rng, matched = random.Random(0), 0
    for _ in range(20_000):
        functions = ["".join(rng.choice("a\n") for _ in range(rng.randint(0, 5))) for _ in range(rng.randint(1, 5))]
        text = "".join(f + "\n\n" for f in functions)
        lines = text[:-1].split("\n")  # the file's lines, as multibranch.data.text reads them
        pieces = split_source_functions(lines)
        assert len(pieces) >= len(functions)
        if len(pieces) == len(functions):
            matched += 1
            assert [p.strip("\n") for p in pieces] == [f.strip("\n") for f in functions], functions
    assert matched > 5_000  # the equal case is exercised, not only the refused one
