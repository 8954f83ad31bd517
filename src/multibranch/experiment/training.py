"""Training settings: batching, optimisation, schedules, stopping, validation, checkpoints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from multibranch.config import ConfigError, bounded, check_fields
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

    `ema_decay`: keep an exponential moving average of the weights with this decay (0.999 to 0.9999 are usual),
    following the weights up to update `ema_start`; the average is what the run validates and what its checkpoints
    hold (train/ema.py).
    """

    seed: int = bounded(1, ge=0)
    max_tokens: int = bounded(4096, ge=1)
    max_sentences: int | None = bounded(None, ge=1)
    update_freq: int = bounded(1, ge=1)
    lr: LRConfig = field(default_factory=LRConfig)
    betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = bounded(1e-8, gt=0)
    weight_decay: float = bounded(0.0, ge=0)
    clip_norm: float = bounded(0.0, ge=0, note="0: no clipping")
    label_smoothing: float = bounded(0.1, ge=0, lt=1)
    label_smoothing_kind: Literal["fairseq", "onmt"] = "fairseq"
    max_steps: int | None = bounded(None, ge=1)
    max_epochs: int | None = bounded(None, ge=1)
    max_minutes: float | None = bounded(None, gt=0)
    patience: int | None = bounded(None, ge=1)
    best_metric: Literal["bleu", "loss", "accuracy", "macro_f1", "pov", "sentence_bleu"] = "bleu"
    valid_every: int = bounded(1000, ge=1)
    valid_bleu: bool = True
    valid_max_sentences: int | None = bounded(None, ge=1)
    keep_last: int = bounded(5, ge=0)
    log_every: int = bounded(50, ge=1)
    amp: Literal["none", "bf16", "fp16", "auto"] = "none"
    threads: int | None = bounded(None, ge=1)
    deterministic: bool = False
    graphs: Literal["auto", "on", "off"] = "auto"
    length_buckets: int | None = bounded(None, ge=1, note="or null: chosen by train.graphs")
    length_multiple: int = bounded(8, ge=1, note="1: any length")
    ema_decay: float | None = bounded(None, gt=0, lt=1, note="or null: no moving average")
    ema_start: int = bounded(0, ge=0)

    def validate(self) -> None:
        check_fields(self)
        if not all(0.0 <= beta < 1.0 for beta in self.betas):
            raise ConfigError(f"betas={list(self.betas)} must each be in [0, 1)")
        if self.max_steps is None and self.max_epochs is None and self.max_minutes is None:
            raise ConfigError("set at least one of max_steps, max_epochs, max_minutes")


# Fields that may change between a run and its resumption without invalidating it.
RESUMABLE_CHANGES = frozenset(
    {"max_steps", "max_epochs", "max_minutes", "patience", "valid_every", "valid_bleu", "valid_max_sentences",
     "keep_last", "log_every", "threads", "graphs"}
)
