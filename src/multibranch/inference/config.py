"""Decoding settings (a preset carries the ones its paper used)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from multibranch.config import ConfigError


@dataclass
class DecodeConfig:
    """Beam search / greedy decoding.

    length_penalty_kind: "fairseq" (score / len^alpha) or "gnmt" (score / ((5 + len) / 6)^alpha).
    Maximum output length: max_len_a * source_length + max_len_b.
    batch_tokens: source tokens per translation batch (longest-first batching).
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

    def validate(self) -> None:
        if self.beam < 1:
            raise ConfigError(f"beam={self.beam} must be >= 1")
        if not 1 <= self.nbest <= self.beam:
            raise ConfigError(f"nbest={self.nbest} must be between 1 and beam={self.beam}")
