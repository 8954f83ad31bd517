"""Decoding settings (a preset carries the ones its paper used)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from multibranch.config import ConfigError


@dataclass
class DecodeConfig:
    """Beam search / greedy decoding (fairseq semantics; beam = 1 is greedy).

    length_penalty_kind: "fairseq" (score / len^alpha) or "gnmt" (score / ((5 + len) / 6)^alpha),
      alpha = length_penalty; len counts the output tokens *including* EOS (as fairseq does).
    Maximum output length (tokens before EOS): floor(max_len_a * source_length + max_len_b), where
      source_length counts the source tokens including its EOS; capped by the model's positional
      limit when it has learned positions. EOS is forbidden before min_len output tokens.
    nbest: hypotheses returned per sentence (<= beam).
    no_repeat_ngram_size: n > 0 forbids any output n-gram from occurring twice in a hypothesis
      (fairseq's --no-repeat-ngram-size); 0 (default) allows repeats.
    batch_tokens: padded source tokens x beam per translation batch (longest-first batching);
      batch_size: sentences per batch.
    max_input_tokens: source tokens (including EOS) kept per line, longer lines are truncated
      (None: only the model's positional limit applies).
    sampling: draw `nbest` outputs per sentence at random instead of searching (beam is then unused
      and nbest is not bounded by it): each step samples from softmax(logits / temperature) restricted
      to the top_k most probable tokens (0: all) and then to the smallest set whose probability
      reaches top_p (1.0: all), renormalised. seed: the generator's seed (None: a random one).
    fixed_shapes: which engine searches (or samples). "on": every batch keeps its rows until all its sentences
      are done, in buffers of fixed shape that a GPU replays as one CUDA graph a step (on a CPU the same steps
      run eagerly); "off": finished sentences leave the batch (the faster engine on a CPU); "auto": on on CUDA,
      off on a CPU. Both find the same hypotheses (docs/decoding.md).
    """

    beam: int = 5
    length_penalty: float = 1.0
    length_penalty_kind: Literal["fairseq", "gnmt"] = "fairseq"
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_len: int = 1
    nbest: int = 1
    batch_tokens: int = 4096
    batch_size: int = 128
    max_input_tokens: int | None = None
    no_repeat_ngram_size: int = 0
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    fixed_shapes: Literal["auto", "on", "off"] = "auto"

    def validate(self) -> None:
        if self.fixed_shapes not in ("auto", "on", "off"):
            raise ConfigError(f"fixed_shapes={self.fixed_shapes!r} must be auto, on or off")
        if self.beam < 1:
            raise ConfigError(f"beam={self.beam} must be >= 1")
        if self.sampling:
            if self.nbest < 1:
                raise ConfigError(f"nbest={self.nbest} must be >= 1 (samples per sentence)")
        elif not 1 <= self.nbest <= self.beam:
            raise ConfigError(f"nbest={self.nbest} must be between 1 and beam={self.beam}")
        check_sampling(self.temperature, self.top_k, self.top_p)
        if self.max_len_a < 0:
            raise ConfigError(f"max_len_a={self.max_len_a} must be >= 0")
        if self.no_repeat_ngram_size < 0:
            raise ConfigError(f"no_repeat_ngram_size={self.no_repeat_ngram_size} must be >= 0 (0: allow repeats)")
        if self.min_len < 0:
            raise ConfigError(f"min_len={self.min_len} must be >= 0")
        if self.batch_tokens < 1 or self.batch_size < 1:
            raise ConfigError(f"batch_tokens={self.batch_tokens} and batch_size={self.batch_size} must be >= 1")
        if self.max_input_tokens is not None and self.max_input_tokens < 2:
            raise ConfigError(f"max_input_tokens={self.max_input_tokens} must be >= 2 (one token plus EOS)")


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """ConfigError unless temperature > 0, top_k >= 0 and 0 < top_p <= 1."""
    if not temperature > 0:
        raise ConfigError(f"temperature={temperature} must be > 0 (1: the model's distribution)")
    if top_k < 0:
        raise ConfigError(f"top_k={top_k} must be >= 0 (0: no top-k restriction)")
    if not 0 < top_p <= 1:
        raise ConfigError(f"top_p={top_p} must be in (0, 1] (1: no nucleus restriction)")
