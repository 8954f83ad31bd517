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


def replicate_corpora(n: int = 80) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """References, and three replicates (seeds) of a baseline and of a slightly better system."""
    rng = random.Random(11)
    words = [f"w{i}" for i in range(40)]
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(n)]

    def noisy(line: str, rate: float) -> str:
        return " ".join(w if rng.random() > rate else rng.choice(words) for w in line.split())

    return refs, [[noisy(r, 0.45) for r in refs] for _ in range(3)], [[noisy(r, 0.43) for r in refs] for _ in range(3)]


def test_replicates_score_each_resample_on_every_seed_and_average(monkeypatch):
    """Against the text: the same resampled lines (sacreBLEU's seeded draw), each replicate scored by sacreBLEU's
    corpus BLEU on those lines, the scores averaged over the replicates, then sacreBLEU's p-value."""
    import numpy as np
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import _compute_p_value

    from multibranch.evaluate.metrics import paired_bootstrap_replicates

    monkeypatch.setenv("SACREBLEU_SEED", "3")
    refs, bases, systems = replicate_corpora()
    samples = 100
    got = paired_bootstrap_replicates([sufficient_statistics(b, refs) for b in bases],
                                      [sufficient_statistics(s, refs) for s in systems], samples=samples)

    bleu = BLEU()
    idxs = np.random.default_rng(3).choice(len(refs), size=(samples, len(refs)), replace=True)

    def mean_resampled(replicates: list[list[str]]) -> np.ndarray:
        return np.array([np.mean([bleu.corpus_score([hyps[i] for i in idx], [[refs[i] for i in idx]]).score
                                  for hyps in replicates]) for idx in idxs])

    full = {side: [bleu.corpus_score(hyps, [refs]).score for hyps in replicates]
            for side, replicates in (("baseline", bases), ("system", systems))}
    diffs = np.abs(mean_resampled(systems) - mean_resampled(bases))
    expected_p = _compute_p_value(diffs - diffs.mean(), abs(np.mean(full["system"]) - np.mean(full["baseline"])))
    assert got["replicates"] == 3 and got["lines"] == len(refs) and got["samples"] == samples
    assert got["baseline_scores"] == pytest.approx(full["baseline"], abs=1e-4)
    assert got["system_scores"] == pytest.approx(full["system"], abs=1e-4)
    assert got["system"] == pytest.approx(np.mean(full["system"]), abs=1e-4)
    assert got["p_value"] == pytest.approx(expected_p)
    assert 1 / (samples + 1) < got["p_value"] < 1.0  # neither extreme: the comparison means something


def test_one_replicate_is_sacrebleus_test_and_repeating_it_changes_nothing():
    from multibranch.evaluate.metrics import paired_bootstrap_replicates

    refs, base, system = corpus()
    b, s = sufficient_statistics(base, refs), sufficient_statistics(system, refs)
    one = paired_bootstrap_replicates([b], [s], samples=500)
    text = paired_bootstrap(base, system, refs, metrics=("bleu",), samples=500)["bleu"]  # sacreBLEU on the text
    assert one["p_value"] == pytest.approx(text["p_value"]) and one["seed"] == 12345
    twice = paired_bootstrap_replicates([b, b], [s, s], samples=500)
    assert twice["p_value"] == one["p_value"] and twice["system"] == pytest.approx(one["system"])
    same = paired_bootstrap_replicates([b, s], [b, s])  # every seed paired with itself
    assert same["no_difference"] and same["p_value"] == 1.0 and not one["no_difference"]


@pytest.mark.parametrize("value, seed", [("7", 7), ("none", None), ("None", None), ("0", None)])
def test_the_bootstrap_seed_is_read_as_sacrebleu_reads_it(value, seed, monkeypatch):
    from multibranch.evaluate.metrics import bootstrap_seed

    monkeypatch.setenv("SACREBLEU_SEED", value)
    assert bootstrap_seed() == seed


def test_a_bootstrap_seed_that_is_no_number_is_a_data_error(monkeypatch):
    from multibranch.evaluate.metrics import paired_bootstrap_replicates

    monkeypatch.setenv("SACREBLEU_SEED", "abc")
    refs, base, system = corpus(20)
    with pytest.raises(DataError, match="SACREBLEU_SEED='abc': give an integer"):
        paired_bootstrap_replicates([sufficient_statistics(base, refs)], [sufficient_statistics(system, refs)])


def test_replicates_must_pair_up_on_one_test_set():
    from multibranch.evaluate.metrics import paired_bootstrap_replicates

    refs, base, system = corpus(30)
    b, s = sufficient_statistics(base, refs), sufficient_statistics(system, refs)
    with pytest.raises(DataError, match="1 baseline and 2 system replicates"):
        paired_bootstrap_replicates([b], [s, s])
    with pytest.raises(DataError, match="in replicate 2"):
        paired_bootstrap_replicates([b, b], [s, s[:-1]])
    with pytest.raises(DataError, match="at least one"):
        paired_bootstrap_replicates([], [])


def test_chrf_statistics_give_sacrebleus_paired_test_on_the_text():
    """The statistics path holds for chrF too (what `evaluate --hyp B1 B2 --compare S1 S2` tests besides BLEU)."""
    refs, base, system = corpus()
    text = paired_bootstrap(base, system, refs, metrics=("chrf",), samples=300)["chrf"]
    stats = paired_bootstrap_statistics(sufficient_statistics(base, refs, "chrf"),
                                        sufficient_statistics(system, refs, "chrf"), metric="chrf", samples=300)
    assert stats["system"] == pytest.approx(text["system"]["score"], abs=1e-4)
    assert stats["p_value"] == pytest.approx(text["p_value"])


def test_compare_replicates_reports_every_metric_over_the_seeds():
    from multibranch.evaluate.metrics import (
        compare_replicates,
        format_replicates,
        paired_bootstrap_replicates,
    )

    refs, bases, systems = replicate_corpora()
    named = [(f"base{k}", lines) for k, lines in enumerate(bases)], [(f"sys{k}", lines) for k, lines in
                                                                     enumerate(systems)]
    report = compare_replicates(*named, {"ref": refs}, samples=200)
    assert report["replicates"] == 3 and report["baseline_files"] == ["base0", "base1", "base2"]
    assert "|bs:200|seed:12345|" in report["bleu"]["signature"] and report["seed"] == 12345
    for metric in ("bleu", "chrf"):
        expected = paired_bootstrap_replicates([sufficient_statistics(b, refs, metric) for b in bases],
                                               [sufficient_statistics(s, refs, metric) for s in systems],
                                               metric=metric, samples=200)
        assert report[metric]["p_value"] == expected["p_value"] and not report[metric]["no_difference"]
        assert report[metric]["system"]["scores"] == pytest.approx(expected["system_scores"])
    line = format_replicates(report)[0]
    assert line.startswith(f"BLEU: baseline {report['bleu']['baseline']['score']:.2f} (")
    assert f"p = {report['bleu']['p_value']:.4f} (nrefs:1|" in line
    same = compare_replicates(named[0], named[0], {"ref": refs}, metrics=("bleu",), samples=50)
    assert same["bleu"]["no_difference"] and "no difference" in format_replicates(same)[0]
    with pytest.raises(DataError, match="3 baseline and 2 system outputs"):
        compare_replicates(named[0], named[1][:2], {"ref": refs})
    with pytest.raises(DataError, match="sys1 has 79 lines, the references 80"):
        compare_replicates(named[0], [named[1][0], ("sys1", systems[1][:-1]), named[1][2]], {"ref": refs})
