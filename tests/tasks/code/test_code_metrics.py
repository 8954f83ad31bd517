"""PoV, code tokens and BLEU for generated functions (hand-written examples and hand-computed scores)."""

from __future__ import annotations

import math
import warnings

import pytest
import sacrebleu

from multibranch.errors import DataError
from multibranch.tasks.code.corpus import encode_code
from multibranch.tasks.code.metrics import (
    code_tokens,
    format_code_scores,
    parses,
    regex_code_tokens,
    score_code,
    token_line,
)

VALID = [
    "def f(x):\n    return x + 1",
    "@property\ndef name(self):\n    if self._n:\n        return self._n\n    return 'none'",
    "def g(*a, **k):\n    try:\n        pass\n    except (ValueError, KeyError) as e:\n"
    "        raise RuntimeError(e)",
    "def h():\n    return '\\d+'",  # an invalid escape sequence only warns: still valid code
]
INVALID = [
    "def f(x):\n    print x",  # Python 2 print statement
    "def f(x):\n    return (x + 1",  # unbalanced bracket
    "def f(x):\nreturn x",  # body not indented
    "def f(x):\n    if x:\n        return 1\n  return 2",  # dedent to no outer level
    "",  # empty hypothesis
    " \n\t",  # blank hypothesis
]


def test_pov_on_hand_written_functions():
    hypotheses = VALID + INVALID
    result = score_code(hypotheses, hypotheses, escaped=False)
    assert result["pov"] == {"score": 4 / 10, "valid": 4, "invalid": 6, "too_long": 0, "not_function": 0}
    assert [parses(h) for h in hypotheses] == [True] * 4 + [False] * 6


def test_pov_on_escaped_hypotheses():
    hypotheses = [
        "def f(x): DCNL DCSP return x",
        "def f(x): DCNL return x",  # the body lost its indentation token
        "def f(x): DCNL DCSP if x: DCNL DCSP  DCSP return 'a DCSP b' DCNL DCSP return None",
        "def f(x): DCNL DCSP print 'x DCSP is', x",  # Python 2
    ]
    assert score_code(hypotheses, hypotheses)["pov"]["score"] == 0.5


def test_parse_warnings_do_not_make_code_invalid():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert parses(VALID[3])


@pytest.mark.parametrize(
    "source",
    [
        "-" * 90_000 + "1",  # ast.parse raises MemoryError on this
        "x" + "[0]" * 30_000,  # ... and RecursionError on this
        "(" * 5000 + ")" * 5000,  # too many nested parentheses
        "x = 1\x00",  # null byte
    ],
)
def test_pathological_sources_are_invalid_not_errors(source):
    assert parses(source) is False
    assert score_code([source], ["x = 1"], escaped=False)["pov"]["valid"] == 0


def test_size_limit():
    source = "x = 1\n" * 20
    assert parses(source)
    assert not parses(source, max_chars=len(source) - 1)
    result = score_code([source], [source], escaped=False, max_chars=10)
    assert result["pov"] == {"score": 0.0, "valid": 0, "invalid": 1, "too_long": 1, "not_function": 0}


def test_generated_code_is_never_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "executed.txt"
    hypotheses = [
        f"open({str(marker)!r}, 'w').write('ran')",
        "raise SystemExit(3)",
        f"import os\n@os.makedirs({str(tmp_path / 'made_dir')!r})\ndef f():\n    pass",
        f"def f(x=open({str(marker)!r}, 'w')):\n    return x",
    ]
    escaped = [encode_code(h) for h in hypotheses]
    result = score_code(escaped, escaped)
    score_code(hypotheses, hypotheses, escaped=False)
    assert result["pov"]["not_function"] == 3 and result["pov"]["valid"] == 1  # they were parsed ...
    assert not marker.exists() and not (tmp_path / "made_dir").exists()  # ... and nothing ran
    assert list(tmp_path.iterdir()) == []


# ---- code tokens ---------------------------------------------------------------------------------


def test_code_tokens_hand_made():
    tokens, fell_back = code_tokens("def f(a, b=0x1F):\n    return a**2 + b  # note\n")
    assert not fell_back
    assert tokens == ["def", "f", "(", "a", ",", "b", "=", "0x1F", ")", ":",
                      "return", "a", "**", "2", "+", "b"]
    tokens, _ = code_tokens("x = f(a, 'b  c')")
    assert token_line(tokens) == "x = f ( a , 'b c' )"  # whitespace inside strings normalised too


TOKENIZABLE = [
    VALID[1],
    "def f(x: int = 1_000, *, y=1e-3j) -> dict:\n    x **= 2; y //= 3\n    return {**k, 'a': [1.5, .5, 7.]}",
    "def g(s):\n    return (rb'raw\\n' + b\"x\", f'{s!r:>{10}}', u'u', ...)\n",
    "def h():\n    t = '''multi\n  line'''\n    if (n := len(t)) >= 2 and n != 3:\n"
    "        return t \\\n            + 'x'",
    "async def k(a):\n    await a @ b\n    return [i for i in a if i is not None]",
    "def f(x):\n    print x",  # Python 2 still tokenizes
]


@pytest.mark.parametrize("source", TOKENIZABLE)
def test_regex_fallback_agrees_with_tokenize(source):
    tokens, fell_back = code_tokens(source)
    assert not fell_back
    assert regex_code_tokens(source) == tokens


def test_fallback_on_source_that_does_not_tokenize():
    tokens, fell_back = code_tokens("def f(x):\n    return (x + 'a b'")
    assert fell_back
    assert tokens == ["def", "f", "(", "x", ")", ":", "return", "(", "x", "+", "'a b'"]
    tokens, fell_back = code_tokens("def f():\n    s = '''open")
    assert fell_back and tokens[-1] == "'''open"


# ---- BLEU ----------------------------------------------------------------------------------------


def test_sentence_bleu_identical_is_100():
    refs = ["def f(x): DCNL DCSP return x", "@d DCNL def g(): DCNL DCSP return 'a DCSP b'"]
    result = score_code(refs, refs)
    assert result["sentence_bleu"]["score"] == pytest.approx(100.0)
    assert result["bleu"]["score"] == pytest.approx(100.0)


def test_bleu_ignores_layout():
    hyp = "def f(x):\n  y=x+1\n  return y"
    ref = "def f( x ):\n        y = x + 1\n        return y"
    result = score_code([hyp], [ref], escaped=False)
    assert result["sentence_bleu"]["score"] == pytest.approx(100.0)


def test_sentence_bleu_hand_computed():
    # 10 code tokens each, differing in the last one: n-gram precisions 9/10, 8/9, 7/8, 6/7, BP = 1,
    # so BLEU = 100 * (9/10 * 8/9 * 7/8 * 6/7) ** (1/4) = 100 * 0.6 ** 0.25
    hyp = "def f(x):\n  return x + 1"
    ref = "def f(x):\n    return x + 2"
    result = score_code([hyp], [ref], escaped=False)
    assert result["sentence_bleu"]["score"] == pytest.approx(100 * 0.6**0.25, abs=1e-9)


def test_sentence_bleu_exponential_smoothing_hand_computed():
    # tokens "x = a" vs "x = b": precisions 2/3, 1/2 and 0/1 for trigrams, which exp smoothing turns
    # into 1/(2*1); no 4-grams, so the effective order is 3: 100 * (2/3 * 1/2 * 1/2) ** (1/3)
    result = score_code(["x = a"], ["x = b"], escaped=False)
    assert result["sentence_bleu"]["score"] == pytest.approx(100 * (1 / 6) ** (1 / 3), abs=1e-9)
    assert "smooth:exp" in result["sentence_bleu"]["signature"]
    assert "eff:yes" in result["sentence_bleu"]["signature"]


def test_mean_sentence_bleu_is_the_average():
    result = score_code(["x = a", "def f():\n    pass"], ["x = b", "def f():\n    pass"], escaped=False)
    assert result["sentence_bleu"]["score"] == pytest.approx((100 * (1 / 6) ** (1 / 3) + 100) / 2, abs=1e-9)


def test_corpus_bleu_equals_sacrebleu_on_the_token_streams():
    hyps = ["def f(x):\n  return x+1", "def g(a,b):\n  return a*b", "def h():\n    return [1, 2, 3]"]
    refs = ["def f(x):\n    return x + 2", "def g(a, b):\n    return a * b * 2",
            "def h():\n    return (1, 2)"]
    result = score_code(hyps, refs, escaped=False)
    hyp_lines = ["def f ( x ) : return x + 1", "def g ( a , b ) : return a * b",
                 "def h ( ) : return [ 1 , 2 , 3 ]"]
    ref_lines = ["def f ( x ) : return x + 2", "def g ( a , b ) : return a * b * 2",
                 "def h ( ) : return ( 1 , 2 )"]
    expected = sacrebleu.corpus_bleu(hyp_lines, [ref_lines], tokenize="none")
    assert result["bleu"]["score"] == pytest.approx(expected.score, abs=1e-9)
    assert "tok:none" in result["bleu"]["signature"]
    sentence = [sacrebleu.sentence_bleu(h, [r], tokenize="none", smooth_method="exp").score
                for h, r in zip(hyp_lines, ref_lines)]
    assert result["sentence_bleu"]["score"] == pytest.approx(math.fsum(sentence) / 3, abs=1e-9)


def test_escaped_and_source_forms_score_the_same():
    sources = [VALID[0], VALID[1], INVALID[0]]
    refs = [VALID[1], VALID[0], VALID[2]]
    from_source = score_code(sources, refs, escaped=False)
    from_escaped = score_code([encode_code(s) for s in sources], [encode_code(r) for r in refs])
    assert from_source == from_escaped


def test_score_code_rejects_bad_input():
    with pytest.raises(DataError, match="line counts differ: 2 hypotheses but 1 references"):
        score_code(["a", "b"], ["a"])
    with pytest.raises(DataError, match="no hypotheses"):
        score_code([], [])


def test_format_code_scores():
    lines = format_code_scores(score_code(VALID[:2] + INVALID[:2], VALID[:2] + INVALID[:2], escaped=False))
    assert lines[0] == ("PoV = 50.00% (2/4 parse as one function definition with Python's ast; "
                        "0 others parse but are not one)")
    assert lines[1].startswith("sentence BLEU (mean) = 100.00 (nrefs:1|")
    assert lines[2].startswith("BLEU = 100.00 ")
