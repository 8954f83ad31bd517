"""Rate and learning-rate schedules: defined values at t = 0, T_w, T; monotone where they should be."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multibranch.config import ConfigError, from_dict
from multibranch.schedules import LRConfig, RateConfig, learning_rate_at, rate_at


def rate(**kw) -> RateConfig:
    return from_dict(RateConfig, kw)


def test_v_schedule_hits_start_zero_and_end():
    cfg = rate(schedule="v", rate=0.2)
    assert rate_at(cfg, 0, warmup=4000, total=100_000) == 0.2
    assert rate_at(cfg, 4000, warmup=4000, total=100_000) == 0.0
    assert rate_at(cfg, 100_000, warmup=4000, total=100_000) == 0.2
    assert rate_at(cfg, 250_000, warmup=4000, total=100_000) == 0.2
    assert rate_at(cfg, 2000, warmup=4000, total=100_000) == pytest.approx(0.1)
    assert rate_at(cfg, 52_000, warmup=4000, total=100_000) == pytest.approx(0.1)
    own = rate(schedule="v", start=0.3, end=0.1, warmup=10, total=110)
    assert [rate_at(own, t) for t in (0, 5, 10, 60, 110)] == pytest.approx([0.3, 0.15, 0.0, 0.05, 0.1])


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_curriculum_is_increasing_and_anti_curriculum_decreasing(a, b):
    lo, hi = sorted((a, b))
    cur, anti = rate(schedule="curriculum", rate=0.3), rate(schedule="anti_curriculum", rate=0.3)
    assert rate_at(cur, lo, total=5000) <= rate_at(cur, hi, total=5000)
    assert rate_at(anti, lo, total=5000) >= rate_at(anti, hi, total=5000)
    assert 0.0 <= rate_at(cur, hi, total=5000) <= 0.3 and 0.0 <= rate_at(anti, hi, total=5000) <= 0.3


def test_curriculum_anti_linear_constant_endpoints():
    assert rate_at(rate(schedule="curriculum", rate=0.3), 0, total=100) == 0.0
    assert rate_at(rate(schedule="curriculum", rate=0.3), 100, total=100) == pytest.approx(0.3)
    assert rate_at(rate(schedule="anti_curriculum", rate=0.3), 0, total=100) == 0.3
    assert rate_at(rate(schedule="anti_curriculum", rate=0.3), 100, total=100) == 0.0
    lin = rate(schedule="linear", start=0.0, end=0.3)
    assert [rate_at(lin, t, total=100) for t in (0, 50, 100, 200)] == pytest.approx([0.0, 0.15, 0.3, 0.3])
    assert rate_at(rate(rate=0.25), 12345) == 0.25


def test_schedules_needing_total_fail_clearly_without_it():
    with pytest.raises(ConfigError, match="max_steps"):
        rate_at(rate(schedule="curriculum", rate=0.1), 10)
    with pytest.raises(ConfigError, match="warm-up"):
        rate_at(rate(schedule="v", rate=0.1), 10, total=100)


def test_rate_shorthand_and_bounds():
    assert from_dict(RateConfig, RateConfig.coerce(0.3)) == RateConfig(schedule="constant", rate=0.3)
    with pytest.raises(ConfigError):
        rate(rate=1.0)
    assert rate(rate=0.0).is_zero and not rate(schedule="v", start=0.1, end=0.0).is_zero


def test_learning_rate_schedules():
    inv = LRConfig(schedule="inverse_sqrt", lr=5e-4, warmup=4000, init_lr=1e-7)
    assert learning_rate_at(inv, 4000) == pytest.approx(5e-4)
    assert learning_rate_at(inv, 16000) == pytest.approx(2.5e-4)
    assert learning_rate_at(inv, 2000) == pytest.approx(1e-7 + 2000 * (5e-4 - 1e-7) / 4000)
    noam = LRConfig(schedule="noam", factor=2.0, warmup=4000)
    assert learning_rate_at(noam, 4000, d_model=512) == pytest.approx(2.0 * 512**-0.5 * 4000**-0.5)
    assert learning_rate_at(noam, 100, d_model=512) == pytest.approx(2.0 * 512**-0.5 * 100 * 4000**-1.5)
    cos = LRConfig(schedule="cosine", lr=1e-3, min_lr=1e-7, warmup=10, period=100)
    assert learning_rate_at(cos, 10) == pytest.approx(1e-3)
    assert learning_rate_at(cos, 60) == pytest.approx(1e-7 + 0.5 * (1e-3 - 1e-7))
    assert learning_rate_at(cos, 110) == pytest.approx(1e-3)  # a new period starts (no shrink)
    one_decay = LRConfig(schedule="cosine", lr=3e-5, min_lr=0.0, warmup=45)  # period: the remaining updates
    assert learning_rate_at(one_decay, 45, total=450) == pytest.approx(3e-5)
    assert learning_rate_at(one_decay, 450, total=450) == pytest.approx(0.0, abs=1e-12)  # the last update: min_lr
    assert learning_rate_at(one_decay, 449, total=450) < learning_rate_at(one_decay, 400, total=450)
    assert math.isclose(learning_rate_at(LRConfig(schedule="constant", lr=1e-3, warmup=0), 7), 1e-3)
