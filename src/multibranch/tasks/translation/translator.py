"""Text in, text out: SentencePiece encoding, longest-first token-budget batches, beam search or sampling.

`Translator.translate(lines)` returns exactly one string per input line, in input order:
- empty / whitespace-only lines give "" without running the model;
- every other line becomes its SentencePiece ids + EOS; a line longer than the input limit (the
  model's `max_positions`, whatever its kind of positions, and `DecodeConfig.max_input_tokens`) is
  truncated, never dropped, with one warning per call naming the lines (`first_line` numbers them:
  a stream translated in chunks passes each chunk's first line number), or, with
  `DecodeConfig.long_inputs = "refuse"`, refused with a DataError naming the first before any is decoded;
- outputs are bounded as well: at most `max_positions - 1` tokens before EOS (`inference.beam.length_limits`);
- lines are sorted longest-first (an out-of-memory error shows up in the first batch) and batched
  so that padded source tokens x beam (x samples when sampling) <= batch_tokens and sentences <= batch_size.

Options (docs/decoding.md): `DecodeConfig.sampling` draws samples instead of searching (one seeded
generator per Translator); `prefixes` (one target-side line per input line) force the start of each
output; `alignment_layer` adds attention-based alignments (`Translation.alignment`, Pharaoh pairs).
The model may be an `inference.ensemble.Ensemble`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from tqdm import tqdm

from multibranch.device import resolve_device
from multibranch.errors import ConfigError, DataError
from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference.alignment import check_alignment_layer, cross_attention, hard_alignment, pharaoh
from multibranch.inference.beam import Hypothesis, forced_scores, length_limits
from multibranch.inference.graphed_search import FixedShapeSearcher
from multibranch.inference.processors import length_penalty
from multibranch.inference.sampling import FixedShapeSampler, sample
from multibranch.inference.search import search

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
    token count, the length-normalised score the beam search would report for it, and per token (EOS last)
    its natural-log probability (fairseq's `positional_scores`)."""

    score: float
    log_prob: float
    tokens: int
    positional_scores: list[float] = field(default_factory=list)


@dataclass
class Translation:
    """One output of a line: detokenised text, normalised score and (when asked) its alignment
    'i-j ...' between source and output SentencePiece pieces."""

    text: str
    score: float
    alignment: str | None = None


def input_limit(model_config: Any, decode: DecodeConfig) -> int | None:
    """Most source tokens (EOS included) a line may keep: the model's `max_positions` (learned positions end
    there; a sinusoidal table extends, but the model never saw such positions, and the time grows with the
    square of the length) and `decode.max_input_tokens`; None = unlimited."""
    limits = [n for n in (getattr(model_config, "max_positions", None), decode.max_input_tokens) if n is not None]
    return min(limits) if limits else None


def long_lines(lengths: Sequence[int], limit: int | None, policy: str, numbers: Sequence[int]) -> list[int]:
    """The positions in `lengths` (source tokens, EOS included) of the lines over `limit`, to truncate; with
    `policy` "refuse" a DataError naming the first of them (its line number in `numbers`) instead."""
    over = [p for p, n in enumerate(lengths) if limit is not None and n > limit]
    if over and policy == "refuse":
        first = over[0]
        raise DataError(f"input line {numbers[first]} has {lengths[first]} tokens (EOS included), more than the "
                        f"model's limit of {limit} (max_positions / max_input_tokens); shorten or split it, or let "
                        "long lines be truncated (--long-inputs truncate)")
    return over


def warn_truncated(numbers: Sequence[int], limit: int | None) -> None:
    """One warning naming the lines (1-based `numbers`) truncated to `limit` tokens."""
    if not numbers:
        return
    shown = ", ".join(map(str, numbers[:5])) + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")
    logger.warning("input line%s %s: more than the model's limit of %d tokens (max_positions / max_input_tokens); "
                   "translated from the first %d only (--long-inputs refuse: an error instead)",
                   "s" if len(numbers) > 1 else "", shown, limit, limit)


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


class Abandoned(Exception):
    """A call stopped between two of its batches because its `stop` event was set (nobody waits for it)."""


class Translator:
    """Translate raw text lines with a model and its tokenizer.

    Args:
        model: a Seq2SeqModel (put in eval mode on `device`).
        tokenizer: `multibranch.data.tokenizer.Tokenizer` (encode_src, decode_tgt).
        decode_cfg: beam size, length penalty, limits and batching (default DecodeConfig()).
        device: "cpu", "cuda", "cuda:1", or "auto".
        alignment_layer: decoder layer whose cross-attention gives `Translation.alignment`
          (-1: the last, fairseq's default); None: no alignments.

    `stop` (a threading.Event, unset: never): once set, a call raises Abandoned before its next batch (a server's
    request whose callers have all gone).
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, decode_cfg: DecodeConfig | None = None,
                 device: str | torch.device = "cpu", alignment_layer: int | None = None):
        self.device = resolve_device(device) if isinstance(device, str) else device
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.cfg = decode_cfg if decode_cfg is not None else DecodeConfig()
        self.cfg.validate()
        vocabulary = getattr(model.config, "tgt_vocab_size", 0)
        if not self.cfg.sampling and vocabulary and self.cfg.beam > vocabulary:
            raise ConfigError(f"beam={self.cfg.beam} is more than the model's {vocabulary} target tokens; a beam keeps "
                              "that many different continuations, so at most the vocabulary's size")
        self.max_input_tokens = input_limit(model.config, self.cfg)
        self.stats = TranslationStats()
        if alignment_layer is not None:
            check_alignment_layer(self.model, alignment_layer)
        self.alignment_layer = alignment_layer
        self.stop: threading.Event | None = None
        # the fixed-shape search (on CUDA unless decode.fixed_shapes says otherwise), its buffers and graphs kept
        # across batches
        fixed = self.cfg.fixed_shapes == "on" or (self.cfg.fixed_shapes == "auto" and self.device.type == "cuda")
        self.searcher = FixedShapeSearcher(self.model) if fixed else None
        self.generator = torch.Generator(device=self.device)
        if self.cfg.seed is not None:
            self.generator.manual_seed(self.cfg.seed)
        else:
            self.generator.seed()
        # with the fixed-shape search, the fixed-row sampler drawing from that generator, kept across batches
        self.sampler = FixedShapeSampler(self.model, generator=self.generator) if fixed else None

    def translate(self, lines: list[str], progress: Progress = False, prefixes: Sequence[str] | None = None,
                  first_line: int = 1) -> list[str]:
        """One translation (the best hypothesis) per input line, in input order.

        `progress`: True shows a bar (lines done / total, ETA) on stderr; a bar object is advanced instead.
        `prefixes`: per line a target-side text its translation must start with ("" = none).
        `first_line`: the number of `lines[0]` in the messages about long lines.
        """
        return [entries[0].text for entries in self.translate_full(lines, 1, progress, prefixes, first_line)]

    def translate_nbest(self, lines: list[str], n: int, progress: Progress = False,
                        prefixes: Sequence[str] | None = None, first_line: int = 1) -> list[list[tuple[str, float]]]:
        """Up to `n` (<= beam; any n when sampling) (text, normalised score) pairs per line, best first.
        An empty line gives [("", 0.0)]."""
        return [[(t.text, t.score) for t in entries]
                for entries in self.translate_full(lines, n, progress, prefixes, first_line)]

    def translate_full(self, lines: list[str], n: int, progress: Progress = False,
                       prefixes: Sequence[str] | None = None, first_line: int = 1) -> list[list[Translation]]:
        """`translate_nbest` as `Translation`s (with alignments when the translator makes them)."""
        if n < 1 or (not self.cfg.sampling and n > self.cfg.beam):
            raise ValueError(f"n={n} must be between 1 and beam={self.cfg.beam}")
        return self._run(lines, n, progress, self.encode_prefixes(lines, prefixes, first_line), first_line)

    def encode_prefixes(self, lines: Sequence[str], prefixes: Sequence[str] | None, first_line: int = 1
                        ) -> list[list[int]] | None:
        """Target ids of each line's prefix (None: no prefixes). DataError when the counts differ or a
        prefix is longer than its line's maximum output length (before anything is decoded)."""
        if prefixes is None:
            return None
        if len(prefixes) != len(lines):
            raise DataError(f"line counts differ: {len(lines)} input lines but {len(prefixes)} prefixes")
        ids = [list(p) for p in self.tokenizer.encode_tgt(list(prefixes))]
        keep, sources, _ = self.encode(list(lines), first_line)
        if keep:
            src_lens = torch.tensor([len(s) for s in sources])
            limits = length_limits(self.model.config, src_lens, self.cfg.max_len_a, self.cfg.max_len_b).tolist()
            for i, limit in zip(keep, limits, strict=True):
                if len(ids[i]) > limit:
                    raise DataError(f"prefix line {i + 1} has {len(ids[i])} tokens but its translation may have at "
                                    f"most {limit} (--max-len-a/--max-len-b, the model's positions); shorten the "
                                    "prefix or raise the limit")
        return ids

    def score(self, lines: Sequence[str], references: Sequence[str], progress: Progress = False,
              first_line: int = 1) -> list[ForcedScore | None]:
        """Forced decoding: score `references[i]` as the translation of `lines[i]`.

        Sources are encoded (and truncated) as for translation, references with the target
        SentencePiece model + EOS. Empty source lines give None (translation gives "" for them);
        a reference longer than the model's learned positions allow raises DataError naming its line.
        """
        if len(lines) != len(references):
            raise DataError(f"line counts differ: {len(lines)} input lines but {len(references)} references")
        keep, sources, truncated = self.encode(list(lines), first_line)
        warn_truncated([first_line + i for i in truncated], self.max_input_tokens)
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
                results[keep[i]] = ForcedScore(total / divisor, total, len(lprobs), [float(x) for x in lprobs])
            self._advance(bar, len(members))
        if owned:
            bar.close()
        self.stats.sentences += len(lines)
        self.stats.src_tokens += sum(len(s) for s in sources)
        self.stats.tgt_tokens += sum(len(t) for t in targets)
        self.stats.seconds += time.perf_counter() - start
        return results

    # ---- internals -------------------------------------------------------------------------------

    def check_lengths(self, lines: list[str], first_line: int = 1) -> None:
        """DataError naming the first line over the input limit when `long_inputs` is "refuse" (else nothing)."""
        if self.cfg.long_inputs == "refuse":
            self.encode(lines, first_line)

    def encode(self, lines: list[str], first_line: int = 1) -> tuple[list[int], list[list[int]], list[int]]:
        """(indices of non-empty lines, their source ids + EOS (truncated to the input limit), the indices of
        the truncated lines); DataError for a long line when `long_inputs` is "refuse" (`long_lines`)."""
        keep = [i for i, line in enumerate(lines) if line.strip()]
        ids = self.tokenizer.encode_src([lines[i] for i in keep]) if keep else []
        eos, limit = self.model.config.eos_id, self.max_input_tokens
        over = set(long_lines([len(pieces) + 1 for pieces in ids], limit, self.cfg.long_inputs,
                              [first_line + i for i in keep]))
        out = [list(pieces[: limit - 1] if p in over and limit is not None else pieces) + [eos]
               for p, pieces in enumerate(ids)]
        return keep, out, [keep[p] for p in sorted(over)]

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

    def _prefix_batch(self, prefixes: list[list[int]]) -> torch.Tensor | None:
        """Prefix ids of a batch -> [b, P] right-padded with pad_id (None when all are empty)."""
        width = max((len(p) for p in prefixes), default=0)
        if width == 0:
            return None
        out = torch.full((len(prefixes), width), self.model.config.pad_id, dtype=torch.long)
        for row, ids in enumerate(prefixes):
            out[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out.to(self.device)

    def _decode(self, src: torch.Tensor, n: int, prefix: torch.Tensor | None) -> list[list[Hypothesis]]:
        cfg = self.cfg
        if not cfg.sampling:
            return search(self.model, src, cfg, nbest=n, prefix=prefix, fixed_shapes=self.searcher is not None,
                          searcher=self.searcher)
        return sample(self.model, src, cfg, n, prefix=prefix, sampler=self.sampler, generator=self.generator,
                      fixed_shapes=self.sampler is not None)

    def _alignments(self, src: torch.Tensor, hyps: list[list[Hypothesis]]) -> list[list[str]]:
        """Per sentence of src [b, S] and hypothesis, its Pharaoh alignment."""
        rows = [b for b, sentence in enumerate(hyps) for _ in sentence]
        flat = [h.tokens for sentence in hyps for h in sentence]
        if not flat:
            return [[] for _ in hyps]
        attention = cross_attention(self.model, src[rows], flat, self.alignment_layer)  # per hyp [T, S]
        src_lens = src.ne(self.model.config.pad_id).sum(dim=1).tolist()
        texts = iter(pharaoh(hard_alignment(a, src_lens[b] - 1, len(t)))
                     for a, b, t in zip(attention, rows, flat, strict=True))
        return [[next(texts) for _ in sentence] for sentence in hyps]

    def _run(self, lines: list[str], nbest: int, progress: Progress = False,
             prefixes: list[list[int]] | None = None, first_line: int = 1) -> list[list[Translation]]:
        start = time.perf_counter()
        empty = "" if self.alignment_layer is not None else None
        results: list[list[Translation]] = [[Translation("", 0.0, empty)] for _ in lines]
        keep, sources, truncated = self.encode(list(lines), first_line)
        bar, owned = self._bar(progress, len(lines))
        self._advance(bar, len(lines) - len(keep))
        warn_truncated([first_line + i for i in truncated], self.max_input_tokens)
        order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))  # longest first, stable
        lengths = [len(sources[i]) for i in order]
        tgt_tokens = done = 0
        width = nbest if self.cfg.sampling else self.cfg.beam  # rows per sentence in the decoder
        with torch.inference_mode():
            for positions in make_batches(lengths, width, self.cfg.batch_tokens, self.cfg.batch_size):
                if self.stop is not None and self.stop.is_set():
                    raise Abandoned(f"stopped after {done} of {len(keep)} lines to decode: nobody waits for them")
                members = [order[p] for p in positions]
                src = self._source_batch([sources[i] for i in members])
                prefix = None if prefixes is None else self._prefix_batch([prefixes[keep[i]] for i in members])
                hyps = self._decode(src, nbest, prefix)
                aligned = self._alignments(src, hyps) if self.alignment_layer is not None else [None] * len(hyps)
                for i, nbest_hyps, alignments in zip(members, hyps, aligned, strict=True):
                    results[keep[i]] = self._detokenize(nbest_hyps, alignments)
                    tgt_tokens += len(nbest_hyps[0].tokens) + 1 if nbest_hyps else 0
                self._advance(bar, len(members))
                done += len(members)
        if owned:
            bar.close()
        self.stats.sentences += len(lines)
        self.stats.src_tokens += sum(len(s) for s in sources)
        self.stats.tgt_tokens += tgt_tokens
        self.stats.truncated += len(truncated)
        self.stats.seconds += time.perf_counter() - start
        return results

    def _detokenize(self, hyps: list[Hypothesis], alignments: list[str] | None) -> list[Translation]:
        if not hyps:  # no finished hypothesis (only possible with a degenerate model)
            return [Translation("", float("-inf"), None if alignments is None else "")]
        texts = self.tokenizer.decode_tgt([h.tokens for h in hyps])
        aligned = alignments if alignments is not None else [None] * len(hyps)
        return [Translation(text, h.score, a) for text, h, a in zip(texts, hyps, aligned, strict=True)]
