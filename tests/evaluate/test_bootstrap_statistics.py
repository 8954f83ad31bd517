"""The paired bootstrap from per-line statistics (what the reproduction keeps instead of translations) gives
sacreBLEU's own paired test on the text: the same corpus scores, resamples and p-values."""

from __future__ import annotations

import random

import pytest

from multibranch.errors import DataError
from multibranch.evaluate.metrics import paired_bootstrap, paired_bootstrap_statistics, sufficient_statistics


def corpus(n: int = 120) -> tuple[list[str], list[str], list[str]]:
    """References and two noisy systems of them, one a little better than the other."""
    rng = random.Random(7)
    words = [f"w{i}" for i in range(40)]
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(n)]

    def noisy(line: str, rate: float) -> str:
        return " ".join(w if rng.random() > rate else rng.choice(words) for w in line.split())

    return refs, [noisy(r, 0.45) for r in refs], [noisy(r, 0.40) for r in refs]


@pytest.mark.parametrize("samples", [200, 1000])
def test_statistics_give_sacrebleus_paired_test_on_the_text(samples):
    refs, base, system = corpus()
    text = paired_bootstrap(base, system, refs, metrics=("bleu",), samples=samples)["bleu"]
    stats = paired_bootstrap_statistics(sufficient_statistics(base, refs), sufficient_statistics(system, refs),
                                        samples=samples)
    assert stats["baseline"] == pytest.approx(text["baseline"]["score"], abs=1e-4)
    assert stats["system"] == pytest.approx(text["system"]["score"], abs=1e-4)
    assert stats["p_value"] == pytest.approx(text["p_value"])
    assert 0.002 < stats["p_value"] < 1.0  # a case where the p-value is neither of its extremes


def test_bleu_statistics_per_line_are_lengths_then_matches_and_totals():
    (row,) = sufficient_statistics(["a b c d"], ["a b c e"])
    # hypothesis length 4, reference length 4; 1-grams 3/4, 2-grams 2/3, 3-grams 1/2, 4-grams 0/1
    assert row == [4, 4, 3, 2, 1, 0, 4, 3, 2, 1]


def test_identical_statistics_are_no_difference_and_mismatched_sets_are_refused():
    refs, base, _ = corpus(30)
    stats = sufficient_statistics(base, refs)
    assert paired_bootstrap_statistics(stats, [list(r) for r in stats])["p_value"] == 1.0
    with pytest.raises(DataError, match="same, non-empty test set"):
        paired_bootstrap_statistics(stats, stats[:-1])
