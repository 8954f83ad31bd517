"""sacreBLEU scores with signatures: the library function and the `evaluate` command."""

from __future__ import annotations

import io
import json
import sys

import pytest
from sacrebleu.metrics import BLEU, CHRF

from multibranch.cli import main
from multibranch.data.errors import DataError
from multibranch.evaluate.metrics import format_scores, score_corpus

HYP = ["The cat sat on the mat.", "", "A dog barked loudly at the postman!", "Nothing here matches"]
REF = ["The cat sat on a mat.", "Hello there.", "The dog barked loudly at the postman.", "Completely different"]
REF2 = ["A cat sat on the mat.", "Hi.", "A dog barked at the postman!", "Nothing matches here"]


def test_scores_equal_sacrebleu_computed_independently():
    result = score_corpus(HYP, REF)
    bleu, chrf = BLEU(), CHRF()
    assert result["bleu"]["score"] == pytest.approx(bleu.corpus_score(HYP, [REF]).score)
    assert result["chrf"]["score"] == pytest.approx(chrf.corpus_score(HYP, [REF]).score)
    assert result["bleu"]["signature"] == str(bleu.get_signature())
    assert result["chrf"]["signature"] == str(chrf.get_signature())
    assert "tok:13a" in result["bleu"]["signature"] and "nrefs:1" in result["bleu"]["signature"]
    assert result["lines"] == 4 and result["references"] == 1


def test_options_lowercase_tokenizer_and_multiple_references():
    result = score_corpus(HYP, [REF, REF2], tokenize="intl", lowercase=True)
    expected = BLEU(tokenize="intl", lowercase=True).corpus_score(HYP, [REF, REF2]).score
    assert result["bleu"]["score"] == pytest.approx(expected)
    assert "nrefs:2" in result["bleu"]["signature"] and "case:lc" in result["bleu"]["signature"]
    assert result["chrf"]["score"] == pytest.approx(CHRF(lowercase=True).corpus_score(HYP, [REF, REF2]).score)
    assert result["bleu"]["score"] > score_corpus(HYP, REF, tokenize="intl", lowercase=True)["bleu"]["score"]


def test_format_has_score_and_signature():
    lines = format_scores(score_corpus(HYP, REF))
    assert lines[0].startswith("BLEU = ") and "(nrefs:1|case:mixed|eff:no|tok:13a|" in lines[0]
    assert lines[1].startswith("chrF2 = ") and "nc:6" in lines[1]


def test_errors():
    with pytest.raises(DataError, match="4 hypotheses but 3 lines in reference 2"):
        score_corpus(HYP, [REF, REF2[:3]])
    with pytest.raises(DataError, match="downloads"):
        score_corpus(HYP, REF, tokenize="flores200")
    with pytest.raises(DataError, match="unknown sacreBLEU tokenizer"):
        score_corpus(HYP, REF, tokenize="moses")
    with pytest.raises(DataError, match="unknown metric"):
        score_corpus(HYP, REF, metrics=("meteor",))


def _write(path, lines):
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    return str(path)


def test_cli_prints_signatures_and_writes_json(tmp_path, capsys):
    hyp, ref, ref2 = _write(tmp_path / "hyp", HYP), _write(tmp_path / "ref", REF), _write(tmp_path / "ref2", REF2)
    out = tmp_path / "scores" / "test.json"
    assert main(["evaluate", "--hyp", hyp, "--ref", ref, "--ref", ref2, "--json", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    bleu = BLEU()
    expected = bleu.corpus_score(HYP, [REF, REF2])
    assert printed[0] == f"{expected} ({bleu.get_signature()})"
    assert printed[1].startswith("chrF2 = ")
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["bleu"]["score"] == pytest.approx(expected.score)
    assert report["bleu"]["signature"] == str(bleu.get_signature())
    assert "signature" in report["chrf"] and report["lines"] == 4 and report["references"] == 2


def test_cli_hyp_from_stdin(tmp_path, monkeypatch, capsys):
    ref = _write(tmp_path / "ref", REF)
    data = "".join(line + "\r\n" for line in HYP).encode()  # CRLF is stripped
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    assert main(["evaluate", "--hyp", "-", "--ref", ref, "--metrics", "bleu"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and printed[0].startswith(f"BLEU = {BLEU().corpus_score(HYP, [REF]).score:.2f}")


def test_cli_errors_are_one_line(tmp_path, capsys):
    hyp, short = _write(tmp_path / "hyp", HYP), _write(tmp_path / "short", REF[:3])
    assert main(["evaluate", "--hyp", hyp, "--ref", short]) == 2
    err = capsys.readouterr().err
    assert "line counts differ" in err and "has 4 lines" in err and "has 3" in err
    bad = tmp_path / "bad"
    bad.write_bytes(b"ok\n\xc3\x28 broken\nok\nok\n")
    assert main(["evaluate", "--hyp", str(bad), "--ref", _write(tmp_path / "ref", REF)]) == 2
    assert f"{bad}:2: invalid UTF-8" in capsys.readouterr().err
    assert main(["evaluate", "--hyp", hyp, "--ref", hyp, "--tokenize", "spm"]) == 2
    assert "downloads" in capsys.readouterr().err
