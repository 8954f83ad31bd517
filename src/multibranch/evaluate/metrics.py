"""Corpus-level scores with sacreBLEU, always reported with their signatures.

Hypotheses are detokenised system output, references raw text: sacreBLEU tokenises both (default
"13a"). Tokenisers that download a model on first use (spm, flores101, flores200, spBLEU-1K) are
refused unless `allow_download=True`; test sets (`sacrebleu -t`) are never fetched here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from multibranch.data.errors import DataError

METRICS = ("bleu", "chrf", "chrf++", "ter")
DOWNLOADING_TOKENIZERS = ("spm", "flores101", "flores200", "spBLEU-1K")


def _reference_streams(references: Sequence[str] | Sequence[Sequence[str]]) -> list[list[str]]:
    """One stream (list of lines) or several streams -> list of streams."""
    if len(references) and isinstance(references[0], str):
        return [list(references)]  # type: ignore[arg-type]
    return [list(stream) for stream in references]


def _metric(name: str, tokenize: str, lowercase: bool) -> Any:
    from sacrebleu.metrics import BLEU, CHRF, TER

    if name == "bleu":
        return BLEU(tokenize=tokenize, lowercase=lowercase)
    if name == "chrf":
        return CHRF(lowercase=lowercase)
    if name == "chrf++":
        return CHRF(word_order=2, lowercase=lowercase)
    if name == "ter":
        return TER(case_sensitive=not lowercase)
    raise DataError(f"unknown metric {name!r}; choose from {', '.join(METRICS)}")


def check_tokenizer(tokenize: str, allow_download: bool = False) -> None:
    """Refuse unknown tokenisers and, unless allowed, those that download a model."""
    from sacrebleu.metrics.bleu import _TOKENIZERS

    if tokenize not in _TOKENIZERS:
        raise DataError(f"unknown sacreBLEU tokenizer {tokenize!r}; choose from {', '.join(_TOKENIZERS)}")
    if tokenize in DOWNLOADING_TOKENIZERS and not allow_download:
        raise DataError(
            f"tokenizer {tokenize!r} downloads a SentencePiece model on first use; pass allow_download=True "
            "(--allow-download) if that is intended"
        )


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
    streams = _reference_streams(references)
    if not streams:
        raise DataError("no references given")
    hypotheses = list(hypotheses)
    for i, stream in enumerate(streams, start=1):
        if len(stream) != len(hypotheses):
            raise DataError(
                f"line counts differ: {len(hypotheses)} hypotheses but {len(stream)} lines in reference {i}"
            )
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise DataError(f"unknown metric {unknown[0]!r}; choose from {', '.join(METRICS)}")
    if "bleu" in metrics:
        check_tokenizer(tokenize, allow_download)
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
    """One line per metric: sacreBLEU's score text followed by the signature in parentheses."""
    return [f"{result[name]['text']} ({result[name]['signature']})" for name in METRICS if name in result]
