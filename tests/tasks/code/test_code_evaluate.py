"""`multibranch evaluate --task code`: PoV on hand-written functions, BLEU against an independent
computation, JSON output, bad input, and generated code is never executed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from multibranch.cli import main

VALID = [
    "def add(a, b): DCNL DCSP return (a + b)",
    "def show(x): DCNL DCSP if (x > 0): DCNL DCSP  DCSP print(x)",
    "def greet(): DCNL DCSP return 'hello DCSP world'",
]
INVALID = [
    "def add(a, b) DCNL DCSP return (a + b)",  # missing colon
    "def show(x): DCNL DCSP if (x > 0): DCNL DCSP print(x)",  # body of the if not indented
    "def greet(): DCNL DCSP return 'hello",  # unterminated string
    "print x",  # Python 2
]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_pov_on_hand_written_functions(tmp_path, capsys):
    hyp = _write(tmp_path / "hyp.code", VALID + INVALID)
    ref = _write(tmp_path / "ref.code", VALID + VALID + VALID[:1])
    assert main(["evaluate", "--task", "code", "--hyp", str(hyp), "--ref", str(ref), "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "PoV = 42.86% (3/7 parse as one function definition with Python's ast; 0 others parse" in out
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["pov"] == {"score": 3 / 7, "valid": 3, "invalid": 4, "too_long": 0, "not_function": 0}
    assert report["hyp"] == str(hyp) and report["ref"] == str(ref) and report["lines"] == 7


def test_bleu_is_sacrebleu_on_code_tokens(tmp_path, capsys):
    hyp = _write(tmp_path / "hyp.code", ["def add(a, b): DCNL DCSP return (a - b)", VALID[2]])
    ref = _write(tmp_path / "ref.code", [VALID[0], VALID[2]])
    assert main(["evaluate", "--task", "code", "--hyp", str(hyp), "--ref", str(ref), "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    # the code tokens, written out by hand
    hyps = ["def add ( a , b ) : return ( a - b )", "def greet ( ) : return 'hello world'"]
    refs = ["def add ( a , b ) : return ( a + b )", "def greet ( ) : return 'hello world'"]
    sentence = BLEU(tokenize="none", smooth_method="exp", effective_order=True)
    expected_mean = sum(sentence.sentence_score(h, [r]).score for h, r in zip(hyps, refs)) / 2
    assert report["sentence_bleu"]["score"] == pytest.approx(expected_mean)
    assert report["bleu"]["score"] == pytest.approx(BLEU(tokenize="none").corpus_score(hyps, [refs]).score)
    assert report["pov"]["score"] == 1.0


def test_generated_code_is_never_executed(tmp_path, capsys):
    marker = tmp_path / "executed.txt"
    attack = [
        f"open({str(marker)!r}, 'w').write('ran')",
        f"__import__('pathlib').Path({str(marker)!r}).write_text('ran')",
        f"def f(x=open({str(marker)!r}, 'w')): DCNL DCSP pass",
        f"@open({str(marker)!r}, 'w').write DCNL def g(): DCNL DCSP pass",
    ]
    hyp = _write(tmp_path / "hyp.code", attack)
    ref = _write(tmp_path / "ref.code", VALID[:1] * len(attack))
    assert main(["evaluate", "--task", "code", "--hyp", str(hyp), "--ref", str(ref), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["pov"]["valid"] == 2  # all parse, two are functions...
    assert not marker.exists()  # ...and none ran


@pytest.mark.parametrize(("extra", "message"), [
    (["--sentence-level"], "--sentence-level: only for --task translate"),
    (["--metrics", "chrf"], "--metrics: only for --task translate"),
    (["--tokenize", "none"], "--tokenize: only for --task translate"),
    (["--ref", "REF2"], "--task code takes exactly one --ref"),
])
def test_bad_flags(tmp_path, capsys, extra, message):
    hyp = _write(tmp_path / "hyp.code", VALID)
    ref = _write(tmp_path / "ref.code", VALID)
    extra = [str(ref) if x == "REF2" else x for x in extra]
    assert main(["evaluate", "--task", "code", "--hyp", str(hyp), "--ref", str(ref), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_line_count_mismatch_and_empty_input(tmp_path, capsys):
    hyp = _write(tmp_path / "hyp.code", VALID)
    ref = _write(tmp_path / "ref.code", VALID[:2])
    assert main(["evaluate", "--task", "code", "--hyp", str(hyp), "--ref", str(ref)]) == 2
    assert "line counts differ" in capsys.readouterr().err
    empty = _write(tmp_path / "empty.code", [])
    assert main(["evaluate", "--task", "code", "--hyp", str(empty), "--ref", str(empty)]) == 2
    assert "no functions to score" in capsys.readouterr().err


def test_json_file_is_not_overwritten_without_force(tmp_path, capsys):
    hyp = _write(tmp_path / "hyp.code", VALID)
    out = tmp_path / "s.json"
    out.write_text("keep")
    assert main(["evaluate", "--task", "code", "--hyp", str(hyp), "--ref", str(hyp), "--json", str(out)]) == 2
    assert out.read_text() == "keep"
    assert main(["evaluate", "--task", "code", "--hyp", str(hyp), "--ref", str(hyp), "--json", str(out),
                 "--force"]) == 0
    assert json.loads(out.read_text())["bleu"]["score"] == pytest.approx(100.0)
