"""Scores that must not be silently wrong (issue 25 item 5, issue 20 item 4).

- PoV counts a hypothesis only if it parses as one function definition (text that merely parses,
  such as `QQQQ` or `raise SystemExit(3)`, does not count); the expected verdicts are written by hand.
- `evaluate --task classify` refuses predicted labels that the reference never uses (naming them),
  unless `--allow-unseen-labels`.
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
    from multibranch.evaluate.code import score_code

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
