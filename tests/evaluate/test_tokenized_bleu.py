"""Tokenised BLEU (multi-bleu.perl on the given tokens, optional compound splitting) against a plain
re-implementation of multi-bleu.perl written here, and through `evaluate --tokenized-bleu`."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from multibranch.cli import main
from multibranch.evaluate.tokenized import compound_split, tokenized_bleu
from tests.helpers.cli import one_error_line

HYP = ["the well-known cat sat on the mat .", "a dog barked at the post-man !", "nothing here matches at all"]
REF = ["the well-known cat sat on a mat .", "the dog barked at the post-man .", "completely different words here now"]


def _multi_bleu(hyps: list[str], refs: list[str]) -> float:
    """multi-bleu.perl with one reference: clipped n-gram matches summed over the corpus, geometric mean of
    the four precisions, brevity penalty exp(1 - r/c) when c < r; 0 when a precision is 0."""
    matches, totals = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for hyp, ref in zip(hyps, refs, strict=True):
        h, r = hyp.split(), ref.split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            h_grams = Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            r_grams = Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
            matches[n - 1] += sum(min(c, r_grams[g]) for g, c in h_grams.items())
            totals[n - 1] += max(len(h) - n + 1, 0)
    if min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals, strict=True)) / 4
    brevity = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * brevity * math.exp(log_precision)


def test_compound_split_matches_the_perl_one_liner_by_hand():
    assert compound_split("a-b") == "a ##AT##-##AT## b"
    # the expected strings are what `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'` printed for these inputs
    assert compound_split("state-of-the-art") == "state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art"
    assert compound_split("a-b-c") == "a ##AT##-##AT## b-c"  # the b was consumed by the first match
    assert compound_split("- a - b -x y-") == "- a - b -x y-"  # a hyphen needs a non-space on both sides


def test_equals_multi_bleu_on_the_given_tokens():
    result = tokenized_bleu(HYP, [REF])
    assert result["score"] == pytest.approx(_multi_bleu(HYP, REF), abs=1e-9)
    assert result["sys_len"] == sum(len(h.split()) for h in HYP)
    assert "tok:none" in result["signature"] and "compound-split:no" in result["signature"]
    assert "not comparable" in result["note"]


def test_compound_split_changes_the_tokens_scored():
    split = tokenized_bleu(HYP, [REF], split_compounds=True)
    expected = _multi_bleu([compound_split(h) for h in HYP], [compound_split(r) for r in REF])
    assert split["score"] == pytest.approx(expected, abs=1e-9)
    assert split["score"] != pytest.approx(tokenized_bleu(HYP, [REF])["score"])  # the hyphens became matches
    assert split["sys_len"] == sum(len(h.split()) for h in HYP) + 4  # two compounds, two tokens each


def test_no_smoothing_zero_precision_gives_zero():
    assert tokenized_bleu(["a b c"], [["x y z"]])["score"] == 0.0


def test_cli_prints_sacrebleu_then_tokenized_bleu(tmp_path, capsys):
    hyp, ref, out = tmp_path / "hyp.tok", tmp_path / "ref.tok", tmp_path / "scores.json"
    hyp.write_text("\n".join(HYP) + "\n")
    ref.write_text("\n".join(REF) + "\n")
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--tokenized-bleu", "--compound-split",
                 "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("BLEU = ") and lines[-1].startswith("tokenized BLEU = ")
    assert "compound-split:yes" in lines[-1] and "not comparable across tokenisations" in lines[-1]
    report = json.loads(out.read_text())
    assert report["tokenized_bleu"]["score"] == pytest.approx(
        _multi_bleu([compound_split(h) for h in HYP], [compound_split(r) for r in REF]), abs=1e-9)
    assert report["bleu"]["score"] != pytest.approx(report["tokenized_bleu"]["score"])


def test_compound_split_without_tokenized_bleu_is_refused(tmp_path, capsys):
    hyp = tmp_path / "hyp"
    hyp.write_text("a\n")
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(hyp), "--compound-split"]) == 2
    assert "--compound-split: only with --tokenized-bleu" in one_error_line(capsys)
