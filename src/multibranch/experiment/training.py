"""Training settings: batching, optimisation, schedules, stopping, validation, checkpoints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from multibranch.config import ConfigError
from multibranch.schedules import LRConfig


@dataclass
class TrainConfig:
    """Everything `multibranch train` needs beyond the model and the data.

    Batches hold at most `max_tokens` padded tokens (source or target side, whichever is larger);
    gradients of `update_freq` batches are accumulated per update. Training stops at the first of
    `max_steps` updates, `max_epochs` epochs, `max_minutes` minutes, or `patience` validations
    without improvement of `best_metric` (the task's own metric when the task does not report it).
    `amp`: autocast precision; "auto" is bf16 where the
    hardware computes it natively (CUDA with bf16, CPUs with AVX512-BF16/AMX), else fp16 on CUDA and
    fp32 on other CPUs.

    `graphs`: replay each update as one CUDA graph per batch shape ("auto": on a single CUDA device
    where the run allows it, see train/graphs.py; "on": refuse to start where it cannot; "off": eager).
    `length_buckets`: pad every batch to one of at most this many fixed (rows, length) shapes, the
    loss counting pad positions with weight 0 (None: 8 when graphs are on, else batches of their own
    shape); fixed shapes are what graphs need, and they run on any device. `length_multiple`: every bucket
    length is a multiple of it (8 suits tensor cores; 4 pads Multi30k's short sentences 20% instead of 32%).
    """

    seed: int = 1
    max_tokens: int = 4096
    max_sentences: int | None = None
    update_freq: int = 1
    lr: LRConfig = field(default_factory=LRConfig)
    betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    label_smoothing: float = 0.1
    label_smoothing_kind: Literal["fairseq", "onmt"] = "fairseq"
    max_steps: int | None = None
    max_epochs: int | None = None
    max_minutes: float | None = None
    patience: int | None = None
    best_metric: Literal["bleu", "loss", "accuracy", "macro_f1", "pov", "sentence_bleu"] = "bleu"
    valid_every: int = 1000
    valid_bleu: bool = True
    valid_max_sentences: int | None = None
    keep_last: int = 5
    log_every: int = 50
    amp: Literal["none", "bf16", "fp16", "auto"] = "none"
    threads: int | None = None
    deterministic: bool = False
    graphs: Literal["auto", "on", "off"] = "auto"
    length_buckets: int | None = None
    length_multiple: int = 8

    def validate(self) -> None:
        if self.seed < 0:
            raise ConfigError(f"seed={self.seed} must be >= 0")
        if self.max_tokens < 1 or self.update_freq < 1:
            raise ConfigError("max_tokens and update_freq must be >= 1")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing={self.label_smoothing} must be in [0, 1)")
        if self.length_buckets is not None and self.length_buckets < 1:
            raise ConfigError(f"length_buckets={self.length_buckets} must be >= 1 (or null: chosen by train.graphs)")
        if self.length_multiple < 1:
            raise ConfigError(f"length_multiple={self.length_multiple} must be >= 1 (1: any length)")
        if self.max_steps is None and self.max_epochs is None and self.max_minutes is None:
            raise ConfigError("set at least one of max_steps, max_epochs, max_minutes")


# Fields that may change between a run and its resumption without invalidating it.
RESUMABLE_CHANGES = frozenset(
    {"max_steps", "max_epochs", "max_minutes", "patience", "valid_every", "valid_bleu", "valid_max_sentences",
     "keep_last", "log_every", "threads", "graphs"}
)
