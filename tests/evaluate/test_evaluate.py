"""sacreBLEU scores with signatures: the library function and the `evaluate` command."""

from __future__ import annotations

import io
import json
import sys

import pytest
from sacrebleu.metrics import BLEU, CHRF

from multibranch.cli import main
from multibranch.errors import DataError
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


# ---- empty input, --json -, --json overwrite, sentence level, paired bootstrap --------------


def test_cli_empty_hyp_and_ref_is_one_clear_error(tmp_path, capsys):
    """Regression: empty hyp and ref raised IndexError inside sacreBLEU."""
    empty = _write(tmp_path / "empty", [])
    empty_ref = _write(tmp_path / "empty_ref", [])
    assert main(["evaluate", "--hyp", empty, "--ref", empty_ref]) == 2
    err = capsys.readouterr().err
    assert "nothing to score" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(DataError, match="nothing to score"):
        score_corpus([], [[]])


def test_cli_json_dash_is_stdout_and_stdout_stays_json(tmp_path, capsys):
    """Regression: `--json -` wrote a file named '-'."""
    hyp, ref = _write(tmp_path / "hyp", HYP), _write(tmp_path / "ref", REF)
    monkey_cwd = tmp_path / "cwd"
    monkey_cwd.mkdir()
    import os

    old = os.getcwd()
    os.chdir(monkey_cwd)
    try:
        assert main(["evaluate", "--hyp", hyp, "--ref", ref, "--json", "-"]) == 0
    finally:
        os.chdir(old)
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # the whole of stdout is one JSON document
    assert report["bleu"]["score"] == pytest.approx(BLEU().corpus_score(HYP, [REF]).score)
    assert captured.err.startswith("BLEU = ")  # the human lines moved to stderr
    assert not (monkey_cwd / "-").exists()


def test_cli_json_refuses_to_overwrite_without_force(tmp_path, capsys):
    """Regression: --json silently replaced an existing file (everything else requires --force)."""
    hyp, ref = _write(tmp_path / "hyp", HYP), _write(tmp_path / "ref", REF)
    out = tmp_path / "scores.json"
    out.write_text("keep me", encoding="utf-8")
    assert main(["evaluate", "--hyp", hyp, "--ref", ref, "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "--force" in err
    assert out.read_text(encoding="utf-8") == "keep me"
    assert main(["evaluate", "--hyp", hyp, "--ref", ref, "--json", str(out), "--force"]) == 0
    assert json.loads(out.read_text(encoding="utf-8"))["lines"] == 4
    assert main(["evaluate", "--hyp", hyp, "--ref", ref, "--json", hyp, "--force"]) == 2  # never its own input
    assert "same file as input" in capsys.readouterr().err


def test_sentence_level_scores_equal_sacrebleu_sentence_functions(tmp_path, capsys):
    from sacrebleu import sentence_bleu, sentence_chrf

    hyp, ref = _write(tmp_path / "hyp", HYP), _write(tmp_path / "ref", REF)
    out = tmp_path / "s.json"
    assert main(["evaluate", "--hyp", hyp, "--ref", ref, "--sentence-level", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    rows = [line.split("\t") for line in captured.out.splitlines()]
    assert len(rows) == len(HYP) and captured.err.startswith("BLEU = ")
    for (bleu, chrf), h, r in zip(rows, HYP, REF, strict=True):
        assert float(bleu) == pytest.approx(sentence_bleu(h, [r], smooth_method="exp").score, abs=5e-5)
        assert float(chrf) == pytest.approx(sentence_chrf(h, [r]).score, abs=5e-5)
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["sentences"]["bleu"][0] == pytest.approx(sentence_bleu(HYP[0], [REF[0]]).score)
    assert "smooth:exp" in report["sentences"]["bleu_signature"]


def _bootstrap_corpus(n: int = 60) -> tuple[list[str], list[str]]:
    import random

    rng = random.Random(3)
    words = [f"w{i}" for i in range(50)]
    refs = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(n)]
    noisy = [" ".join(w if rng.random() < 0.5 else rng.choice(words) for w in r.split()) for r in refs]
    return refs, noisy


def test_paired_bootstrap_perfect_system_is_significant_identical_is_not(tmp_path, capsys):
    from multibranch.evaluate.metrics import paired_bootstrap

    refs, noisy = _bootstrap_corpus()
    better = paired_bootstrap(noisy, refs, refs, metrics=("bleu", "chrf"), samples=200)
    assert better["bleu"]["system"]["score"] == pytest.approx(100.0)
    assert better["bleu"]["p_value"] < 0.01 and better["chrf"]["p_value"] < 0.01
    assert better["bleu"]["system"]["ci95"] == pytest.approx(0.0)  # every resample of a perfect system is 100
    low, high = (better["bleu"]["baseline"]["mean"] + s * better["bleu"]["baseline"]["ci95"] for s in (-1, 1))
    assert low < better["bleu"]["baseline"]["score"] < high
    same = paired_bootstrap(noisy, list(noisy), refs, metrics=("bleu",), samples=200)
    assert same["bleu"]["p_value"] == 1.0  # no difference at all: never significant
    assert "bs:200" in same["bleu"]["signature"]
    nearly = list(noisy)
    nearly[0] = " ".join(reversed(nearly[0].split()))  # one line of 60 changed: a difference within chance
    close = paired_bootstrap(noisy, nearly, refs, metrics=("bleu", "chrf"), samples=200)
    assert close["bleu"]["system"]["score"] != close["bleu"]["baseline"]["score"]
    assert close["bleu"]["p_value"] > 0.05 and close["chrf"]["p_value"] > 0.05

    hyp, ref, sys2 = _write(tmp_path / "hyp", noisy), _write(tmp_path / "ref", refs), _write(tmp_path / "sys2", refs)
    out = tmp_path / "cmp.json"
    assert main(["evaluate", "--hyp", hyp, "--ref", ref, "--compare", sys2, "--bootstrap-samples", "100",
                 "--metrics", "bleu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "paired bootstrap" in printed and "p = " in printed
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["compare"]["bleu"]["p_value"] < 0.02 and report["compare"]["system"] == sys2


def test_outputs_with_the_same_line_statistics_have_no_difference_to_test(tmp_path, capsys):
    """Lines that differ only in spacing tokenize alike: every resample scores both systems the same, so there is
    no difference to test. That is said, with p = 1, rather than sacreBLEU's 1 / (samples + 1) = 0.001, which
    reads as a significant difference."""
    from multibranch.evaluate.metrics import paired_bootstrap

    refs, noisy = _bootstrap_corpus()
    spaced = [f" {line.replace(' ', '  ')} " for line in noisy]  # the same tokens, other spacing
    same = paired_bootstrap(noisy, spaced, refs, metrics=("bleu", "chrf"), samples=1000)
    for name in ("bleu", "chrf"):
        assert same[name]["baseline"]["score"] == same[name]["system"]["score"]
        assert same[name]["no_difference"] is True and same[name]["p_value"] == 1.0
    nearly = list(noisy)
    nearly[0] = " ".join(reversed(nearly[0].split()))  # one line really differs: the bootstrap decides
    close = paired_bootstrap(noisy, nearly, refs, metrics=("bleu",), samples=200)
    assert close["bleu"]["no_difference"] is False and close["bleu"]["p_value"] > 0.05

    hyp, ref, sys2 = _write(tmp_path / "hyp", noisy), _write(tmp_path / "ref", refs), _write(tmp_path / "sys2", spaced)
    assert main(["evaluate", "--hyp", hyp, "--ref", ref, "--compare", sys2]) == 0
    compared = capsys.readouterr().out.split("paired bootstrap")[1].splitlines()[1:]
    assert len(compared) == 2 and all("no difference" in line and "p = " not in line for line in compared)


def test_a_directory_as_hyp_says_so(tmp_path, capsys):
    ref = _write(tmp_path / "ref", REF)
    assert main(["evaluate", "--hyp", str(tmp_path), "--ref", ref]) == 2
    assert "is a directory" in capsys.readouterr().err


# ---- several trainings of each system: the paired bootstrap over the replicates ------------------------------


REPLICATE_REFS = [f"the {animal} sat on the {thing} near the door" for animal in ("cat", "dog", "bird", "fox")
                  for thing in ("mat", "rug", "chair", "bed", "box")]


def _replicate(tmp_path, name: str, seed: int, noise: float) -> str:
    import random

    rng = random.Random(seed)
    words = ["a", "the", "cat", "dog", "sat", "on", "in", "mat", "door"]
    lines = [" ".join(w if rng.random() > noise else rng.choice(words) for w in ref.split()) for ref in REPLICATE_REFS]
    return _write(tmp_path / name, lines)


def test_cli_compares_replicates_seed_by_seed(tmp_path, capsys):
    from multibranch.evaluate.metrics import compare_replicates

    ref = _write(tmp_path / "ref", REPLICATE_REFS)
    bases = [_replicate(tmp_path, f"base{k}", k, 0.4) for k in range(3)]
    systems = [_replicate(tmp_path, f"sys{k}", 10 + k, 0.3) for k in range(3)]
    out = tmp_path / "compare.json"
    assert main(["evaluate", "--hyp", *bases, "--compare", *systems, "--ref", ref, "--bootstrap-samples", "200",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == (f"paired bootstrap over 3 replicates, baseline {' '.join(bases)} vs system "
                          f"{' '.join(systems)}, 200 resamples:")
    report = json.loads(out.read_text(encoding="utf-8"))

    def read(paths):
        return [(p, open(p, encoding="utf-8").read().splitlines()) for p in paths]

    expected = compare_replicates(read(bases), read(systems), {ref: REPLICATE_REFS}, samples=200)
    assert report["bleu"]["p_value"] == expected["bleu"]["p_value"] and report["baseline_files"] == bases
    assert report["chrf"]["system"]["scores"] == pytest.approx(expected["chrf"]["system"]["scores"])
    assert printed[1].startswith("  BLEU: baseline ") and f"p = {expected['bleu']['p_value']:.4f}" in printed[1]
    assert printed[2].startswith("  chrF2: baseline ")
    # one file may stand for several replicates: a fixed baseline against three seeds of the system
    assert main(["evaluate", "--hyp", bases[0], bases[0], bases[0], "--compare", *systems, "--ref", ref,
                 "--metrics", "bleu", "--bootstrap-samples", "50"]) == 0
    assert "over 3 replicates" in capsys.readouterr().out
    # the files may come one flag each, as --ref does; --json - puts the report alone on stdout
    repeated = [arg for k in range(3) for arg in ("--hyp", bases[k], "--compare", systems[k])]
    assert main(["evaluate", *repeated, "--ref", ref, "--bootstrap-samples", "200", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["bleu"]["p_value"] == expected["bleu"]["p_value"]
    assert captured.err.startswith("paired bootstrap over 3 replicates")


@pytest.mark.parametrize("extra, message", [
    (["--compare", "S0"], "2 --hyp files but 1 --compare files"),
    ([], "2 --hyp files: several are the replicates"),
    (["--compare", "S0", "S1", "--sentence-level"], "--sentence-level: not with several --hyp files"),
    (["--compare", "S0", "S1", "--task", "classify"], "--task classify: not with several --hyp files"),
    (["--compare", "S0", "-"], "--compare needs a file"),
])
def test_cli_replicates_that_do_not_pair_up_are_one_line_before_anything_is_written(extra, message, tmp_path,
                                                                                     capsys):
    ref = _write(tmp_path / "ref", REPLICATE_REFS)
    files = {f"B{k}": _replicate(tmp_path, f"B{k}", k, 0.4) for k in range(2)}
    files.update({f"S{k}": _replicate(tmp_path, f"S{k}", 5 + k, 0.3) for k in range(2)})
    out = tmp_path / "compare.json"
    args = [files.get(a, a) for a in extra]
    assert main(["evaluate", "--hyp", files["B0"], files["B1"], *args, "--ref", ref, "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_cli_a_tokenizer_without_its_extra_is_one_line(tmp_path, capsys):
    try:
        import MeCab  # noqa: F401

        pytest.skip("MeCab is installed: ja-mecab works here")
    except ImportError:
        pass
    hyp, ref = _write(tmp_path / "hyp", HYP), _write(tmp_path / "ref", REF)
    assert main(["evaluate", "--hyp", hyp, "--ref", ref, "--tokenize", "ja-mecab"]) == 2
    err = capsys.readouterr().err
    assert "tokenizer 'ja-mecab' is not usable here" in err and "sacrebleu[ja]" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_replicates_of_other_lengths_are_named(tmp_path, capsys):
    ref = _write(tmp_path / "ref", REPLICATE_REFS)
    short = _write(tmp_path / "short", REPLICATE_REFS[:-1])
    base = _replicate(tmp_path, "base", 1, 0.4)
    assert main(["evaluate", "--hyp", base, base, "--compare", base, short, "--ref", ref]) == 2
    err = capsys.readouterr().err
    assert f"{short} has 19 lines, the references 20" in err and len(err.strip().splitlines()) == 1


def test_ter_is_sacrebleu_s_default_case_insensitive_ter():
    from sacrebleu.metrics import TER

    from multibranch.evaluate.metrics import evaluate_translation

    hyps = ["The Cat sat on the Mat .", "A dog runs in the park ."]
    refs = ["the cat sat on the mat .", "A dog is running in the Park ."]
    ours = evaluate_translation(hyps, {"ref": refs}, metrics=["ter"])["ter"]
    expected = TER().corpus_score(hyps, [refs])
    assert ours["score"] == pytest.approx(expected.score) and "case:lc" in ours["signature"]
    assert ours["score"] != pytest.approx(TER(case_sensitive=True).corpus_score(hyps, [refs]).score)
