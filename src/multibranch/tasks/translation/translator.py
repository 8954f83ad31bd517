"""Text in, text out: SentencePiece encoding, longest-first token-budget batches, beam search.

`Translator.translate(lines)` returns exactly one string per input line, in input order:
- empty / whitespace-only lines give "" without running the model;
- every other line becomes its SentencePiece ids + EOS; lines longer than the input limit (the
  model's positional limit for learned positions, and `DecodeConfig.max_input_tokens`) are
  truncated, never dropped, with one warning per call giving the count;
- lines are sorted longest-first (an out-of-memory error shows up in the first batch) and batched
  so that padded source tokens x beam <= batch_tokens and sentences <= batch_size.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from tqdm import tqdm

from multibranch.device import resolve_device
from multibranch.errors import DataError
from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference.beam import Hypothesis, forced_scores, length_penalty, search

logger = logging.getLogger(__name__)


@dataclass
class TranslationStats:
    """Running totals over a Translator's calls (source/target tokens include EOS)."""

    sentences: int = 0
    src_tokens: int = 0
    tgt_tokens: int = 0
    truncated: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        secs = max(self.seconds, 1e-9)
        return (
            f"{self.sentences} sentences, {self.src_tokens} source / {self.tgt_tokens} target tokens in "
            f"{self.seconds:.2f}s: {self.sentences / secs:.1f} sentences/s, {self.tgt_tokens / secs:.1f} target tokens/s"
        )


class ProgressBar(Protocol):
    """What the translator needs from a progress bar (a tqdm bar)."""

    def update(self, n: int = 1) -> object: ...


Progress = bool | ProgressBar  # False: none, True: a bar of its own, or a bar to advance (lines done)


def show_progress(setting: bool | None = None) -> bool:
    """None: a progress bar only when stderr is a terminal."""
    return sys.stderr.isatty() if setting is None else setting


def progress_bar(total: int | None, enabled: bool, unit: str = "line", desc: str | None = None) -> Any:
    """A tqdm bar on stderr (lines done / total with an ETA, or a counter when total is None)."""

    return tqdm(total=total, disable=not enabled, unit=unit, desc=desc, dynamic_ncols=True, leave=False,
                file=sys.stderr)


@dataclass
class ForcedScore:
    """A given translation scored by the model: log-probability of its tokens (EOS included), the
    token count, and the length-normalised score the beam search would report for it."""

    score: float
    log_prob: float
    tokens: int


def input_limit(model_config: Any, decode: DecodeConfig) -> int | None:
    """Most source tokens (EOS included) a line may keep; None = unlimited."""
    limits = []
    if getattr(model_config, "positions", None) == "learned":
        limits.append(model_config.max_positions)
    if decode.max_input_tokens is not None:
        limits.append(decode.max_input_tokens)
    return min(limits) if limits else None


def make_batches(lengths: list[int], beam: int, batch_tokens: int, batch_size: int) -> list[list[int]]:
    """Split positions 0..n-1 of `lengths` (sorted longest-first) into consecutive batches whose
    padded size (first length x sentences x beam) fits `batch_tokens` and that hold at most
    `batch_size` sentences; a sentence over budget on its own still gets a batch."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i, length in enumerate(lengths):
        width = lengths[current[0]] if current else length
        if current and (len(current) + 1 > batch_size or width * (len(current) + 1) * beam > batch_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class Translator:
    """Translate raw text lines with a model and its tokenizer.

    Args:
        model: a Seq2SeqModel (put in eval mode on `device`).
        tokenizer: `multibranch.data.tokenizer.Tokenizer` (encode_src, decode_tgt).
        decode_cfg: beam size, length penalty, limits and batching (default DecodeConfig()).
        device: "cpu", "cuda", "cuda:1", or "auto".
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, decode_cfg: DecodeConfig | None = None,
                 device: str | torch.device = "cpu"):
        self.device = resolve_device(device) if isinstance(device, str) else device
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.cfg = decode_cfg if decode_cfg is not None else DecodeConfig()
        self.cfg.validate()
        self.max_input_tokens = input_limit(model.config, self.cfg)
        self.stats = TranslationStats()

    def translate(self, lines: list[str], progress: Progress = False) -> list[str]:
        """One translation (the best hypothesis) per input line, in input order.

        `progress`: True shows a bar (lines done / total, ETA) on stderr; a bar object is advanced instead.
        """
        return [entries[0][0] for entries in self._run(lines, 1, progress)]

    def translate_nbest(self, lines: list[str], n: int, progress: Progress = False) -> list[list[tuple[str, float]]]:
        """Up to `n` (<= beam) (text, normalised score) pairs per line, best first. An empty line
        gives [("", 0.0)]."""
        if not 1 <= n <= self.cfg.beam:
            raise ValueError(f"n={n} must be between 1 and beam={self.cfg.beam}")
        return self._run(lines, n, progress)

    def score(self, lines: Sequence[str], references: Sequence[str], progress: Progress = False
              ) -> list[ForcedScore | None]:
        """Forced decoding: score `references[i]` as the translation of `lines[i]`.

        Sources are encoded (and truncated) as for translation, references with the target
        SentencePiece model + EOS. Empty source lines give None (translation gives "" for them);
        a reference longer than the model's learned positions allow raises DataError naming its line.
        """
        if len(lines) != len(references):
            raise DataError(f"line counts differ: {len(lines)} input lines but {len(references)} references")
        keep, sources, truncated = self.encode(list(lines))
        self._warn_truncated(truncated, len(keep))
        eos = self.model.config.eos_id
        targets = [list(ids) + [eos] for ids in self.tokenizer.encode_tgt([references[i] for i in keep])]
        if getattr(self.model.config, "positions", None) == "learned":
            limit = self.model.config.max_positions
            for i, target in zip(keep, targets, strict=True):
                if len(target) > limit:
                    raise DataError(f"reference line {i + 1} has {len(target)} tokens (EOS included); the model's "
                                    f"learned positions allow at most {limit}")
        start = time.perf_counter()
        results: list[ForcedScore | None] = [None] * len(lines)
        bar, owned = self._bar(progress, len(lines))
        self._advance(bar, len(lines) - len(keep))
        order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))  # longest first
        for positions in make_batches([len(sources[i]) for i in order], 1, self.cfg.batch_tokens,
                                      self.cfg.batch_size):
            members = [order[p] for p in positions]
            src = self._source_batch([sources[i] for i in members])
            batch_lprobs = forced_scores(self.model, src, [targets[i] for i in members])
            for i, lprobs in zip(members, batch_lprobs, strict=True):
                total = float(sum(lprobs))
                divisor = length_penalty(len(lprobs), self.cfg.length_penalty, self.cfg.length_penalty_kind)
                results[keep[i]] = ForcedScore(total / divisor, total, len(lprobs))
            self._advance(bar, len(members))
        if owned:
            bar.close()
        self.stats.sentences += len(lines)
        self.stats.src_tokens += sum(len(s) for s in sources)
        self.stats.tgt_tokens += sum(len(t) for t in targets)
        self.stats.seconds += time.perf_counter() - start
        return results

    # ---- internals -------------------------------------------------------------------------------

    def encode(self, lines: list[str]) -> tuple[list[int], list[list[int]], int]:
        """(indices of non-empty lines, their source ids + EOS (truncated), number truncated)."""
        keep = [i for i, line in enumerate(lines) if line.strip()]
        ids = self.tokenizer.encode_src([lines[i] for i in keep]) if keep else []
        eos, limit = self.model.config.eos_id, self.max_input_tokens
        truncated = 0
        out = []
        for pieces in ids:
            if limit is not None and len(pieces) + 1 > limit:
                pieces = pieces[: limit - 1]
                truncated += 1
            out.append(list(pieces) + [eos])
        return keep, out, truncated

    def _warn_truncated(self, truncated: int, lines: int) -> None:
        if truncated:
            logger.warning(
                "truncated %d of %d input line(s) to %d tokens (model positional limit / max_input_tokens); "
                "their translations cover only the beginning of the line", truncated, lines, self.max_input_tokens,
            )

    @staticmethod
    def _bar(progress: Progress, total: int) -> tuple[Any, bool]:
        """(bar or None, whether this call owns and must close it)."""
        if progress is True:
            return progress_bar(total, True), True
        return (None if progress is False else progress), False

    @staticmethod
    def _advance(bar: Any, n: int) -> None:
        if bar is not None and n:
            bar.update(n)

    def _source_batch(self, sources: list[list[int]]) -> torch.Tensor:
        """Source ids (longest first) -> src [b, S] right-padded with pad_id, on the device."""
        src = torch.full((len(sources), len(sources[0])), self.model.config.pad_id, dtype=torch.long)
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = torch.tensor(ids)
        return src.to(self.device)

    def _run(self, lines: list[str], nbest: int, progress: Progress = False) -> list[list[tuple[str, float]]]:
        start = time.perf_counter()
        results: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in lines]
        keep, sources, truncated = self.encode(list(lines))
        bar, owned = self._bar(progress, len(lines))
        self._advance(bar, len(lines) - len(keep))
        self._warn_truncated(truncated, len(keep))
        order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))  # longest first, stable
        lengths = [len(sources[i]) for i in order]
        tgt_tokens = 0
        with torch.inference_mode():
            for positions in make_batches(lengths, self.cfg.beam, self.cfg.batch_tokens, self.cfg.batch_size):
                members = [order[p] for p in positions]
                hyps = search(self.model, self._source_batch([sources[i] for i in members]), self.cfg, nbest=nbest)
                for i, nbest_hyps in zip(members, hyps, strict=True):
                    results[keep[i]] = self._detokenize(nbest_hyps)
                    tgt_tokens += len(nbest_hyps[0].tokens) + 1 if nbest_hyps else 0
                self._advance(bar, len(members))
        if owned:
            bar.close()
        self.stats.sentences += len(lines)
        self.stats.src_tokens += sum(len(s) for s in sources)
        self.stats.tgt_tokens += tgt_tokens
        self.stats.truncated += truncated
        self.stats.seconds += time.perf_counter() - start
        return results

    def _detokenize(self, hyps: list[Hypothesis]) -> list[tuple[str, float]]:
        if not hyps:  # no finished hypothesis (only possible with a degenerate model)
            return [("", float("-inf"))]
        texts = self.tokenizer.decode_tgt([h.tokens for h in hyps])
        return [(text, h.score) for text, h in zip(texts, hyps, strict=True)]
