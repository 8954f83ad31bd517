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
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from multibranch.inference.beam import Hypothesis, search
from multibranch.inference.config import DecodeConfig

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


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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

    @classmethod
    def from_checkpoint(cls, path: str, device: str | torch.device = "cpu", **overrides: Any) -> Translator:
        """Load a checkpoint; `overrides` replace fields of its decode config (e.g. beam=4)."""
        from multibranch.train.checkpoint import CheckpointError, load_model

        device = resolve_device(device) if isinstance(device, str) else device
        loaded = load_model(path, device)
        if loaded.tokenizer is None:
            raise CheckpointError(f"{path} has no tokenizer, so it cannot translate raw text")
        cfg = replace(loaded.config.decode, **overrides)
        return cls(loaded.model, loaded.tokenizer, cfg, device)

    def translate(self, lines: list[str]) -> list[str]:
        """One translation (the best hypothesis) per input line, in input order."""
        return [entries[0][0] for entries in self._run(lines, 1)]

    def translate_nbest(self, lines: list[str], n: int) -> list[list[tuple[str, float]]]:
        """Up to `n` (<= beam) (text, normalised score) pairs per line, best first. An empty line
        gives [("", 0.0)]."""
        if not 1 <= n <= self.cfg.beam:
            raise ValueError(f"n={n} must be between 1 and beam={self.cfg.beam}")
        return self._run(lines, n)

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

    def _run(self, lines: list[str], nbest: int) -> list[list[tuple[str, float]]]:
        start = time.perf_counter()
        results: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in lines]
        keep, sources, truncated = self.encode(list(lines))
        if truncated:
            logger.warning(
                "truncated %d of %d input line(s) to %d tokens (model positional limit / max_input_tokens); "
                "their translations cover only the beginning of the line", truncated, len(keep), self.max_input_tokens,
            )
        order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))  # longest first, stable
        lengths = [len(sources[i]) for i in order]
        pad = self.model.config.pad_id
        tgt_tokens = 0
        with torch.inference_mode():
            for positions in make_batches(lengths, self.cfg.beam, self.cfg.batch_tokens, self.cfg.batch_size):
                members = [order[p] for p in positions]
                width = len(sources[members[0]])
                src = torch.full((len(members), width), pad, dtype=torch.long)  # [b, S], right-padded
                for row, i in enumerate(members):
                    src[row, : len(sources[i])] = torch.tensor(sources[i])
                hyps = search(self.model, src.to(self.device), self.cfg, nbest=nbest)
                for i, nbest_hyps in zip(members, hyps, strict=True):
                    results[keep[i]] = self._detokenize(nbest_hyps)
                    tgt_tokens += len(nbest_hyps[0].tokens) + 1 if nbest_hyps else 0
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
