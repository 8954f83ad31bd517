"""Schedules: pure functions of the update number.

Two families live here:
- regularisation *rates* (DropHead, drop-branch, MUTE's bias switch): `rate_at(config, t, ...)`,
  with `t` = number of updates already done (0 for the first update), docs/papers.md#drophead-rate-schedules;
- *learning rates*: `learning_rate_at(config, t, ...)`, with `t` = 1-based update number, docs/papers.md#shared-learning-rate-schedules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from multibranch.config import ConfigError, bounded, check_fields

RateSchedule = Literal["constant", "linear", "v", "curriculum", "anti_curriculum"]


@dataclass
class RateConfig:
    """A scalar rate that may change with the update number.

    - constant:        p(t) = rate
    - linear:          p(t) = start + (end - start) * min(t / T, 1)
    - v (Scheduled DropHead): p_start * (1 - t/T_w) before T_w, then p_end * (t - T_w)/(T - T_w), p_end after T
    - curriculum:      p(t) = rate * min(t / T, 1)
    - anti_curriculum: p(t) = rate * max(1 - t / T, 0)

    `start`/`end` default to `rate`; `warmup` (T_w) defaults to `warmup_ratio * T` when that is set
    (the DropHead paper's 0.1 for text classification), else to the LR warm-up; `total` (T) defaults to
    the run's `max_steps`. A bare number in YAML means a constant rate.
    """

    schedule: RateSchedule = "constant"
    rate: float = bounded(0.0, ge=0, lt=1)
    start: float | None = bounded(None, ge=0, lt=1)
    end: float | None = bounded(None, ge=0, lt=1)
    warmup: int | None = bounded(None, ge=0)
    warmup_ratio: float | None = bounded(None, gt=0, lt=1)
    total: int | None = bounded(None, ge=1)

    @classmethod
    def coerce(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return {"schedule": "constant", "rate": float(value)}
        return value

    def validate(self) -> None:
        check_fields(self)
        if self.warmup_ratio is not None and self.warmup is not None:
            raise ConfigError("give at most one of warmup and warmup_ratio")

    @property
    def is_zero(self) -> bool:
        """True when the rate is 0 at every step (the mechanism can be skipped entirely)."""
        if self.schedule in ("linear", "v"):
            start = self.rate if self.start is None else self.start
            end = self.rate if self.end is None else self.end
            return start == 0.0 and end == 0.0
        return self.rate == 0.0

    @property
    def needs_total(self) -> bool:
        return self.schedule != "constant"


def rate_at(cfg: RateConfig, t: int, warmup: int | None = None, total: int | None = None) -> float:
    """Value of the rate schedule `cfg` before update `t` (t = updates done so far)."""
    start = cfg.rate if cfg.start is None else cfg.start
    end = cfg.rate if cfg.end is None else cfg.end
    if cfg.schedule == "constant":
        return cfg.rate
    total = cfg.total if cfg.total is not None else total
    if t == 0 and cfg.schedule in ("linear", "v"):
        return start
    if t == 0:
        return 0.0 if cfg.schedule == "curriculum" else cfg.rate
    if not total:
        raise ConfigError(
            f"the {cfg.schedule!r} rate schedule needs the total number of updates: set train.max_steps "
            "or the schedule's `total`"
        )
    if cfg.schedule == "linear":
        return start + (end - start) * min(t / total, 1.0)
    if cfg.schedule == "curriculum":
        return cfg.rate * min(t / total, 1.0)
    if cfg.schedule == "anti_curriculum":
        return cfg.rate * max(1.0 - t / total, 0.0)
    # V-shaped
    if cfg.warmup is not None:
        tw = cfg.warmup
    elif cfg.warmup_ratio is not None:
        tw = round(cfg.warmup_ratio * total)
    else:
        tw = warmup
    if tw is None:
        raise ConfigError("the 'v' rate schedule needs a warm-up length: set its `warmup` or train.lr.warmup")
    if t < tw:
        return start * (1.0 - t / tw)
    if t >= total:
        return end
    return end * (t - tw) / max(total - tw, 1)


class ScheduledRate:
    """Holds a RateConfig and its current value; `update(t, warmup, total)` moves it along."""

    def __init__(self, cfg: RateConfig | float | None):
        if cfg is None:
            cfg = RateConfig()
        elif not isinstance(cfg, RateConfig):
            cfg = RateConfig(rate=float(cfg))
        self.config = cfg
        self.value = rate_at(cfg, 0)

    @property
    def active(self) -> bool:
        """False when the rate is 0 at every step, so the mechanism can be left out."""
        return not self.config.is_zero

    def update(self, t: int, warmup: int | None = None, total: int | None = None) -> None:
        self.value = rate_at(self.config, t, warmup, total)


# --------------------------------------------------------------------------------------------------
# Learning-rate schedules
# --------------------------------------------------------------------------------------------------


@dataclass
class LRConfig:
    """Learning-rate schedule (docs/papers.md#shared-learning-rate-schedules); `t` is the 1-based update number.

    - inverse_sqrt: lr0 + t (lr - lr0) / W for t < W, then lr * sqrt(W / t)
    - noam:         factor * d_model^-0.5 * min(t^-0.5, t W^-1.5)   (`lr` unused)
    - cosine:       warm-up from lr0 to lr over W, then min_lr + (lr - min_lr)(1 + cos(pi t_c / P)) / 2,
                    t_c = (t - W) mod P with a `period` P (warm restarts); without one, P is the remaining
                    updates and t_c = min(t - W, P), so the last update ends at min_lr
    - constant:     lr after a linear warm-up
    """

    schedule: Literal["inverse_sqrt", "noam", "cosine", "constant"] = "inverse_sqrt"
    lr: float = bounded(5e-4, gt=0)
    warmup: int = bounded(4000, ge=0)
    init_lr: float = bounded(1e-7, ge=0)
    min_lr: float = bounded(1e-7, ge=0)
    period: int | None = bounded(None, ge=1)
    factor: float = bounded(1.0, gt=0)

    def validate(self) -> None:
        check_fields(self)


def learning_rate_at(cfg: LRConfig, t: int, d_model: int | None = None, total: int | None = None) -> float:
    """Learning rate for the 1-based update `t`."""
    t = max(t, 1)
    w = cfg.warmup
    if cfg.schedule == "noam":
        if d_model is None:
            raise ConfigError("the noam schedule needs d_model")
        return cfg.factor * d_model**-0.5 * min(t**-0.5, t * max(w, 1) ** -1.5)
    if t < w:
        return cfg.init_lr + t * (cfg.lr - cfg.init_lr) / w
    if cfg.schedule == "inverse_sqrt":
        return cfg.lr * math.sqrt(w / t) if w > 0 else cfg.lr * t**-0.5
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.period:
        period, tc = cfg.period, (t - w) % cfg.period  # warm restarts
    else:  # one decay over the remaining updates, ending at min_lr (never back to the peak)
        period = max((total or 0) - w, 1)
        tc = min(t - w, period)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * tc / period))
