"""Corpus-level and sentence-level scores and paired bootstrap resampling with sacreBLEU, always
reported with their signatures.

Hypotheses are detokenised system output, references raw text: sacreBLEU tokenises both (default
"13a"). Tokenisers that download a model on first use (spm, flores101, flores200, spBLEU-1K) are
refused unless `allow_download=True`; test sets (`sacrebleu -t`) are never fetched here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.bleu import _TOKENIZERS
from sacrebleu.significance import PairedTest, _compute_p_value

from multibranch.errors import DataError
from multibranch.evaluate.tokenized import tokenized_bleu

METRICS = ("bleu", "chrf", "chrf++", "ter")
DOWNLOADING_TOKENIZERS = ("spm", "flores101", "flores200", "spBLEU-1K")


def _reference_streams(references: Sequence[str] | Sequence[Sequence[str]]) -> list[list[str]]:
    """One stream (list of lines) or several streams -> list of streams."""
    if len(references) and isinstance(references[0], str):
        return [list(references)]  # type: ignore[arg-type]
    return [list(stream) for stream in references]


def _metric(name: str, tokenize: str, lowercase: bool) -> Any:
    if name == "bleu":
        try:
            return BLEU(tokenize=tokenize, lowercase=lowercase)
        except RuntimeError as err:  # a tokenizer whose extra is not installed (ja-mecab, ko-mecab)
            raise DataError(f"tokenizer {tokenize!r} is not usable here: {' '.join(str(err).split())}") from None
    if name == "chrf":
        return CHRF(lowercase=lowercase)
    if name == "chrf++":
        return CHRF(word_order=2, lowercase=lowercase)
    if name == "ter":
        return TER()  # sacreBLEU's default: case-insensitive (`case:lc`), whatever `lowercase` says
    raise DataError(f"unknown metric {name!r}; choose from {', '.join(METRICS)}")


def check_tokenizer(tokenize: str, allow_download: bool = False) -> None:
    """Refuse unknown tokenisers and, unless allowed, those that download a model."""

    if tokenize not in _TOKENIZERS:
        raise DataError(f"unknown sacreBLEU tokenizer {tokenize!r}; choose from {', '.join(_TOKENIZERS)}")
    if tokenize in DOWNLOADING_TOKENIZERS and not allow_download:
        raise DataError(
            f"tokenizer {tokenize!r} downloads a SentencePiece model on first use; pass allow_download=True "
            "(--allow-download) if that is intended"
        )


def _checked_streams(
    hypotheses: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]], what: str = "hypotheses"
) -> list[list[str]]:
    """The reference streams, after checking there is something to score and the line counts agree."""
    streams = _reference_streams(references)
    if not streams:
        raise DataError("no references given")
    for i, stream in enumerate(streams, start=1):
        if len(stream) != len(hypotheses):
            raise DataError(f"line counts differ: {len(hypotheses)} {what} but {len(stream)} lines in reference {i}")
    if not hypotheses:
        raise DataError("nothing to score: the hypotheses and references have no lines")
    return streams


def _check_metrics(metrics: Sequence[str], tokenize: str, allow_download: bool) -> None:
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise DataError(f"unknown metric {unknown[0]!r}; choose from {', '.join(METRICS)}")
    if "bleu" in metrics:
        check_tokenizer(tokenize, allow_download)


def score_corpus(
    hypotheses: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    metrics: Sequence[str] = ("bleu", "chrf"),
    tokenize: str = "13a",
    lowercase: bool = False,
    allow_download: bool = False,
) -> dict[str, Any]:
    """Score hypotheses against one reference stream (a list of lines) or several (a list of streams).

    Returns {"lines": n, "references": r, "<metric>": {"name", "score", "signature", "text", ...}}
    where "text" is sacreBLEU's formatted score line; BLEU also gives its n-gram precisions,
    brevity penalty and lengths. Empty hypothesis lines are allowed; unequal line counts raise
    DataError naming the stream.
    """
    streams = _checked_streams(hypotheses, references)
    hypotheses = list(hypotheses)
    _check_metrics(metrics, tokenize, allow_download)
    result: dict[str, Any] = {"lines": len(hypotheses), "references": len(streams)}
    for name in metrics:
        metric = _metric(name, tokenize, lowercase)
        score = metric.corpus_score(hypotheses, streams)
        entry: dict[str, Any] = {
            "name": score.name,
            "score": float(score.score),
            "signature": str(metric.get_signature()),
            "text": str(score),
        }
        if name == "bleu":
            entry.update(precisions=[float(p) for p in score.precisions], bp=float(score.bp),
                         sys_len=int(score.sys_len), ref_len=int(score.ref_len))
        result[name] = entry
    return result


def format_scores(result: dict[str, Any]) -> list[str]:
    """One line per metric: sacreBLEU's score text followed by the signature in parentheses; then, if the
    report has it, the tokenised BLEU with its warning."""
    lines = [f"{result[name]['text']} ({result[name]['signature']})" for name in METRICS if name in result]
    if "tokenized_bleu" in result:
        entry = result["tokenized_bleu"]
        lines.append(f"{entry['text']} ({entry['signature']}) [{entry['note']}]")
    return lines


def score_sentences(
    hypotheses: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    tokenize: str = "13a",
    lowercase: bool = False,
    allow_download: bool = False,
) -> dict[str, Any]:
    """Per-line BLEU (sacreBLEU's sentence BLEU: exponential smoothing, effective order) and chrF.

    Returns {"bleu": [score per line], "chrf": [...], "bleu_signature": ..., "chrf_signature": ...}.
    """

    streams = _checked_streams(hypotheses, references)
    check_tokenizer(tokenize, allow_download)
    bleu = BLEU(tokenize=tokenize, lowercase=lowercase, smooth_method="exp", effective_order=True)
    chrf = CHRF(lowercase=lowercase)
    rows = [[stream[i] for stream in streams] for i in range(len(hypotheses))]
    return {
        "bleu": [float(bleu.sentence_score(hyp, refs).score) for hyp, refs in zip(hypotheses, rows, strict=True)],
        "chrf": [float(chrf.sentence_score(hyp, refs).score) for hyp, refs in zip(hypotheses, rows, strict=True)],
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def paired_bootstrap(
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    metrics: Sequence[str] = ("bleu", "chrf"),
    tokenize: str = "13a",
    lowercase: bool = False,
    allow_download: bool = False,
    samples: int = 1000,
) -> dict[str, Any]:
    """Paired bootstrap resampling (sacreBLEU's `PairedTest`, Koehn 2004) of `system` against `baseline`.

    Per metric: both corpus scores, the bootstrap mean and 95% confidence half-width of each, and the
    p-value of the difference (small p: the difference is unlikely to be chance). sacreBLEU seeds its
    RNG with $SACREBLEU_SEED (default 12345), so results are reproducible; the signature records it.
    Two outputs with the same per-line statistics of a metric (identical lines, or lines that differ only
    where the metric's tokenizer does not look, e.g. in spacing) have no difference to test: that metric's
    entry says so ("no_difference": true) with p = 1, where sacreBLEU would quote 1 / (samples + 1) (it
    counts resampled differences strictly above the observed one, and every one is exactly 0).
    """

    if samples < 1:
        raise DataError(f"bootstrap samples must be >= 1, got {samples}")
    streams = _checked_streams(baseline, references, "baseline lines")
    if len(system) != len(baseline):
        raise DataError(f"line counts differ: {len(baseline)} baseline lines but {len(system)} system lines")
    _check_metrics(metrics, tokenize, allow_download)
    named = {name: _metric(name, tokenize, lowercase) for name in metrics}
    sacrebleu_logger = logging.getLogger("sacrebleu")
    level = sacrebleu_logger.level
    sacrebleu_logger.setLevel(logging.WARNING)  # its per-step INFO lines are noise here
    try:
        test = PairedTest([("baseline", list(baseline)), ("system", list(system))], named, streams,
                          test_type="bs", n_samples=samples)
        signatures, table = test()
    finally:
        sacrebleu_logger.setLevel(level)
    result: dict[str, Any] = {"lines": len(baseline), "samples": samples}
    for name, score_name in zip(metrics, test.metrics, strict=True):  # score names: BLEU, chrF2, ...
        base, other = table[score_name]
        same = _same_statistics(named[name], baseline, system, streams)
        result[name] = {
            "name": score_name,
            "baseline": {"score": float(base.score), "mean": float(base.mean), "ci95": float(base.ci)},
            "system": {"score": float(other.score), "mean": float(other.mean), "ci95": float(other.ci)},
            "p_value": 1.0 if same else float(other.p_value),
            "no_difference": same,
            "signature": str(signatures[score_name]),
        }
    return result


def sufficient_statistics(hypotheses: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]],
                          metric: str = "bleu", tokenize: str = "13a", lowercase: bool = False,
                          allow_download: bool = False) -> list[list[float]]:
    """sacreBLEU's per-line sufficient statistics of `metric` (BLEU: hypothesis and reference length, then the
    matches and totals of each n-gram order): all that a corpus score and a paired bootstrap need, without the
    text itself. `references`: one stream of lines or several."""
    streams = _checked_streams(hypotheses, references)
    _check_metrics([metric], tokenize, allow_download)
    return [list(map(float, row)) for row in _metric(metric, tokenize, lowercase)._extract_corpus_statistics(
        list(hypotheses), streams)]


def paired_bootstrap_statistics(baseline: Sequence[Sequence[float]], system: Sequence[Sequence[float]],
                                metric: str = "bleu", tokenize: str = "13a", lowercase: bool = False,
                                samples: int = 1000) -> dict[str, Any]:
    """`paired_bootstrap` of one metric from `sufficient_statistics` of both outputs: the same resamples, scores
    and p-value as sacreBLEU's paired test on the text ($SACREBLEU_SEED, default 12345)."""
    result = paired_bootstrap_replicates([baseline], [system], metric, tokenize, lowercase, samples)
    return {key: result[key] for key in ("lines", "samples", "baseline", "system", "p_value")}


def bootstrap_seed() -> int | None:
    """The resampling seed sacreBLEU's paired test uses: $SACREBLEU_SEED (default 12345; `none` or 0: fresh
    entropy, as sacreBLEU reads it); DataError for anything else."""
    text = os.environ.get("SACREBLEU_SEED", "12345")
    if text.lower() == "none":
        return None
    try:
        seed = int(text)
    except ValueError:
        raise DataError(f"SACREBLEU_SEED={text!r}: give an integer, or 'none' for an unseeded bootstrap") from None
    return seed or None


def paired_bootstrap_replicates(baselines: Sequence[Sequence[Sequence[float]]],
                                systems: Sequence[Sequence[Sequence[float]]], metric: str = "bleu",
                                tokenize: str = "13a", lowercase: bool = False, samples: int = 1000
                                ) -> dict[str, Any]:
    """sacreBLEU's paired bootstrap extended to replicates: `baselines[k]` and `systems[k]` are the per-line
    `sufficient_statistics` of replicate k (a training seed) of each system on one test set.

    Each resample draws test lines once, as sacreBLEU does (`bootstrap_seed`), scores every replicate on those
    lines and averages the scores over the replicates; the p-value is sacreBLEU's, computed on those averages. It
    weighs the test set's sampling with every seed's output at once, and treats the seeds as given: the spread
    between seeds is to be reported beside it. One replicate each is sacreBLEU's paired test
    (`paired_bootstrap_statistics`). Returns {"lines", "samples", "seed", "replicates", "baseline", "system" (mean
    corpus scores), "baseline_scores", "system_scores" (per replicate), "p_value", "no_difference" (every
    replicate's two outputs have the same statistics: p = 1)}."""
    if samples < 1:
        raise DataError(f"bootstrap samples must be >= 1, got {samples}")
    if len(baselines) != len(systems) or not len(baselines):
        raise DataError(f"{len(baselines)} baseline and {len(systems)} system replicates: give one of each per "
                        "replicate, at least one")
    lines = len(baselines[0])
    for k, (baseline, system) in enumerate(zip(baselines, systems, strict=True)):
        if len(baseline) != lines or len(system) != lines or not lines:
            raise DataError(f"statistics of {len(baseline)} baseline lines and {len(system)} system lines in "
                            f"replicate {k + 1} (the first has {lines}): give all for the same, non-empty test set")
    scorer = _metric(metric, tokenize, lowercase)

    def score(totals: np.ndarray) -> float:  # totals [stats]
        return float(scorer._compute_score_from_stats(totals).score)

    seed = bootstrap_seed()
    idxs = np.random.default_rng(seed).choice(lines, size=(samples, lines), replace=True)  # [samples, lines]
    observed, resampled = {}, {}
    for side, replicates in (("baseline", baselines), ("system", systems)):
        stats = [np.array(replicate, dtype="float32") for replicate in replicates]  # [lines, stats] each
        observed[side] = [score(s.sum(0)) for s in stats]
        # [samples]: the mean over replicates of each resample's corpus score
        resampled[side] = np.mean([[score(totals) for totals in s[idxs].sum(1)] for s in stats], axis=0)
    base_score, system_score = float(np.mean(observed["baseline"])), float(np.mean(observed["system"]))
    diffs = np.abs(resampled["system"] - resampled["baseline"])
    same = all(same_statistics(b, s) for b, s in zip(baselines, systems, strict=True))
    p_value = 1.0 if same else _compute_p_value(diffs - diffs.mean(), abs(base_score - system_score))
    return {"lines": lines, "samples": samples, "seed": seed, "replicates": len(baselines), "baseline": base_score,
            "system": system_score, "baseline_scores": observed["baseline"], "system_scores": observed["system"],
            "p_value": float(p_value), "no_difference": same}


def _same_statistics(metric: Any, baseline: Sequence[str], system: Sequence[str],
                     streams: list[list[str]]) -> bool:
    """Whether the two outputs have the same per-line sufficient statistics of `metric` (sacreBLEU's, what its
    resampling sums): then every resample scores both alike, and no difference exists."""
    if list(system) == list(baseline):
        return True
    return same_statistics(*(metric._extract_corpus_statistics(list(lines), streams) for lines in (baseline, system)))


def same_statistics(baseline: Sequence[Sequence[float]], system: Sequence[Sequence[float]]) -> bool:
    """Whether two outputs' per-line statistics are equal: every resample then scores both alike, and no
    difference exists to test."""
    return len(baseline) == len(system) and all(list(a) == list(b) for a, b in zip(baseline, system, strict=True))


def format_bootstrap(result: dict[str, Any]) -> list[str]:
    """One line per metric: both scores with mean +- 95% CI, the p-value, and the signature; for outputs with
    the same per-line statistics, that no difference exists instead."""
    lines = []
    for name in METRICS:
        if name not in result:
            continue
        entry = result[name]
        base, other = entry["baseline"], entry["system"]
        if entry.get("no_difference"):
            lines.append(f"{entry['name']}: baseline {base['score']:.2f}, system {other['score']:.2f}: no "
                         f"difference (every line has the same {entry['name']} statistics in both; nothing to test)")
            continue
        lines.append(
            f"{entry['name']}: baseline {base['score']:.2f} ({base['mean']:.2f} +- {base['ci95']:.2f}), "
            f"system {other['score']:.2f} ({other['mean']:.2f} +- {other['ci95']:.2f}), "
            f"p = {entry['p_value']:.4f} ({entry['signature']})"
        )
    return lines


def compare_replicates(baselines: Sequence[tuple[str, Sequence[str]]], systems: Sequence[tuple[str, Sequence[str]]],
                       references: dict[str, Sequence[str]], *, metrics: Sequence[str] = ("bleu", "chrf"),
                       tokenize: str = "13a", lowercase: bool = False, allow_download: bool = False,
                       samples: int = 1000) -> dict[str, Any]:
    """`evaluate --hyp B1 B2 ... --compare S1 S2 ...`: two systems trained several times (replicates, e.g. seeds;
    B_k is paired with S_k, in order), compared on every metric by `paired_bootstrap_replicates`. Each output is
    (its name, its lines); one output may stand for several replicates (a fixed baseline). `references` maps each
    reference file's name to its lines.

    Returns {"replicates", "samples", "seed", "baseline_files", "system_files", "refs", and per metric {"name",
    "baseline": {"score" (the mean), "scores" (per replicate)}, "system": {...}, "p_value", "no_difference",
    "signature" (the metric's, with the resamples and the seed, as sacreBLEU signs its paired test)}}."""
    if len(baselines) != len(systems) or not baselines:
        raise DataError(f"{len(baselines)} baseline and {len(systems)} system outputs: give one system output per "
                        "baseline output, the same replicate (seed) at the same place")
    refs = list(references.values())
    lines = len(refs[0]) if refs else 0
    for name, output in [*baselines, *systems]:
        if len(output) != lines:
            raise DataError(f"line counts differ: {name} has {len(output)} lines, the references {lines}")
    _check_metrics(metrics, tokenize, allow_download)
    report: dict[str, Any] = {"replicates": len(baselines), "samples": samples, "seed": bootstrap_seed(),
                              "baseline_files": [name for name, _ in baselines],
                              "system_files": [name for name, _ in systems], "refs": list(references)}
    for metric in metrics:
        base = [sufficient_statistics(output, refs, metric, tokenize, lowercase, allow_download)
                for _, output in baselines]
        other = [sufficient_statistics(output, refs, metric, tokenize, lowercase, allow_download)
                 for _, output in systems]
        result = paired_bootstrap_replicates(base, other, metric=metric, tokenize=tokenize, lowercase=lowercase,
                                             samples=samples)
        signed = _bootstrap_signature(metric, tokenize, lowercase, baselines[0][1], refs, samples, result["seed"])
        report[metric] = {
            "name": signed["name"], "baseline": {"score": result["baseline"], "scores": result["baseline_scores"]},
            "system": {"score": result["system"], "scores": result["system_scores"]},
            "p_value": result["p_value"], "no_difference": result["no_difference"], "signature": signed["signature"],
        }
    return report


def _bootstrap_signature(metric: str, tokenize: str, lowercase: bool, hypotheses: Sequence[str],
                         refs: list[Sequence[str]], samples: int, seed: int | None) -> dict[str, str]:
    """{"name", "signature"} of `metric` on these references, signed with the resamples and the seed as
    sacreBLEU signs its paired test (`bs:N|seed:S`)."""
    scorer = _metric(metric, tokenize, lowercase)
    name = scorer.corpus_score(list(hypotheses), [list(r) for r in refs]).name  # the signature needs the refs' count
    signature = scorer.get_signature()
    signature.update("seed", str(seed).lower())
    signature.update("bs", samples)
    return {"name": name, "signature": str(signature)}


def _mean_and_replicates(side: dict[str, Any]) -> str:
    """'30.12 (29.80, 30.41, 30.15)': the mean score, then each replicate's."""
    return f"{side['score']:.2f} ({', '.join(f'{value:.2f}' for value in side['scores'])})"


def format_replicates(report: dict[str, Any]) -> list[str]:
    """One line per metric: each system's mean score with the replicates' in brackets, and the p-value."""
    lines = []
    for metric in METRICS:
        if metric not in report:
            continue
        entry = report[metric]
        verdict = ("no difference (every line has the same statistics in both, in every replicate)"
                   if entry["no_difference"] else f"p = {entry['p_value']:.4f}")
        lines.append(f"{entry['name']}: baseline {_mean_and_replicates(entry['baseline'])}, system "
                     f"{_mean_and_replicates(entry['system'])}, {verdict} ({entry['signature']})")
    return lines


def evaluate_translation(hypotheses: Sequence[str], references: dict[str, Sequence[str]], *, hyp_name: str = "<hyp>",
                         metrics: Sequence[str] = ("bleu", "chrf"), tokenize: str = "13a", lowercase: bool = False,
                         allow_download: bool = False, sentence_level: bool = False,
                         compare: tuple[str, Sequence[str]] | None = None,
                         bootstrap_samples: int = 1000, tokenized: bool = False,
                         split_compounds: bool = False) -> dict[str, Any]:
    """`evaluate --task translate` as one report: {"hyp", "refs", "tokenize", "lowercase", corpus scores
    by metric, and "sentences" (per-line BLEU and chrF) if `sentence_level`, "compare" (paired bootstrap
    of system `compare` = (name, lines) against the baseline `hypotheses`) if given, "tokenized_bleu"
    (multi-bleu style on the given tokens, optionally compound-split; `evaluate.tokenized`) if
    `tokenized`}. `references` maps each reference file's name to its lines; DataError when a line count
    differs."""
    for name, lines in [*references.items(), *([compare] if compare is not None else [])]:
        if len(lines) != len(hypotheses):
            raise DataError(f"line counts differ: {hyp_name} has {len(hypotheses)} lines, {name} has {len(lines)}")
    refs = list(references.values())
    options: dict[str, Any] = dict(tokenize=tokenize, lowercase=lowercase, allow_download=allow_download)
    result = score_corpus(hypotheses, refs, metrics=metrics, **options)
    report: dict[str, Any] = {"hyp": hyp_name, "refs": list(references), "tokenize": tokenize, "lowercase": lowercase,
                              **result}
    if tokenized:
        report["tokenized_bleu"] = tokenized_bleu(hypotheses, refs, split_compounds=split_compounds, lowercase=lowercase)
    if sentence_level:
        report["sentences"] = score_sentences(hypotheses, refs, **options)
    if compare is not None:
        system_name, system = compare
        report["compare"] = {"system": system_name, **paired_bootstrap(hypotheses, system, refs, metrics=metrics,
                                                                        samples=bootstrap_samples, **options)}
    return report
