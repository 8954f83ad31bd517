"""metrics.jsonl is strict JSON: non-finite numbers are written as null, by `write` and by a resume's rewrite."""

from __future__ import annotations

import json
import math

import pytest

from multibranch.train.metrics_log import MetricsLog, finite_or_null


def strict(line: str) -> dict:
    def refuse(word: str) -> None:
        raise AssertionError(f"bare {word} in {line!r}")

    return json.loads(line, parse_constant=refuse)


def test_non_finite_numbers_become_null_at_any_depth_and_the_sinks_get_them_as_they_are(tmp_path):
    seen = []

    class Sink:
        def write(self, record):
            seen.append(record)

        def close(self):
            pass

    log = MetricsLog(tmp_path / "metrics.jsonl", sinks=[Sink()])
    record = {"type": "train", "step": 1, "loss": math.nan, "grad_norm": math.inf,
              "modules": {"kappa": [0.5, -math.inf]}, "lr": 1e-3, "tokens": 7}
    log.write(record)
    (line,) = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert strict(line) == {"type": "train", "step": 1, "loss": None, "grad_norm": None,
                            "modules": {"kappa": [0.5, None]}, "lr": 1e-3, "tokens": 7}
    assert seen == [record] and math.isnan(seen[0]["loss"])
    assert finite_or_null((1.0, math.nan, "x")) == [1.0, None, "x"]


def test_a_resume_rewrites_an_older_log_with_bare_nans_as_strict_json(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"type": "valid", "step": 1, "loss": NaN}\n{"type": "train", "step": 2, "loss": 1.5}\n'
                    '{"type": "train", "step": 3, "loss": Infinity}\n{"type": "tr', encoding="utf-8")
    MetricsLog(path).truncate_after(2)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [strict(line) for line in lines] == [{"type": "valid", "step": 1, "loss": None},
                                                {"type": "train", "step": 2, "loss": 1.5}]


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_write_never_falls_back_to_bare_constants(tmp_path, value):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1, "deep": [[{"x": value}]]})
    assert strict((tmp_path / "metrics.jsonl").read_text(encoding="utf-8")) == {"step": 1, "deep": [[{"x": None}]]}
