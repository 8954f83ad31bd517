"""Numeric options out of range, NaN or infinite, and over-long input lines, on the command line: one error line
naming the option (or the line), exit 2, nothing written; by the config's rules (`config.check_value`), so that
the API and the server refuse the same values. A long line is translated from its first tokens with one warning
naming it, or refused with --long-inputs refuse."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from multibranch.cli import main
from tests.helpers.refusals import refusal
from tests.helpers.translation import MAX_POSITIONS, corpus_lines

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

LINES = ["ka lo", "mi ne su", "ta ri", "po ve"]  # a few tokens each
LONG = " ".join(corpus_lines(30, seed=4))  # far more than the tiny model's MAX_POSITIONS tokens


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "src.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(("args", "message"), [
    (["--max-steps", "-3"], "--max-steps -3: must be >= 1"),
    (["--lr", "0"], "--lr 0.0: must be > 0"),
    (["--warmup", "-1"], "--warmup -1: must be >= 0"),
    (["--threads", "0"], "--threads 0: must be >= 1"),
    (["--max-minutes", "nan"], "--max-minutes: expected a finite number, got nan"),
    (["--set", "train.max_steps=-3"], "max_steps=-3 must be >= 1"),  # a config key is named as written
])
def test_a_training_value_out_of_range_is_refused_before_the_run_directory_exists(tiny_data, tmp_path, capfd,
                                                                                  caplog, args, message):
    out = tmp_path / "run"
    line = refusal(["train", "--data", tiny_data, "--out", out, "--preset", "transformer-tiny", *args], capfd, caplog)
    assert message in line
    assert not out.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--lenpen", "nan"], "--lenpen: expected a finite number, got nan"),
    (["--lenpen", "inf"], "--lenpen: expected a finite number, got inf"),
    (["--max-len-a=-inf"], "--max-len-a: expected a finite number, got -inf"),
    (["--max-len-b", "-5"], "--max-len-b -5: must be >= 0"),
    (["--beam", "0"], "--beam 0: must be >= 1"),
    (["--batch-size", "0"], "--batch-size 0: must be >= 1"),
    (["--max-input-tokens", "1"], "--max-input-tokens 1: must be >= 2"),
    (["--sampling", "--temperature", "nan"], "--temperature: expected a finite number, got nan"),
    (["--sampling", "--seed", "-1"], "--seed -1: must be in [0, "),
])
def test_a_decoding_value_out_of_range_is_one_line_before_the_model_loads(checkpoint, source, tmp_path, capfd,
                                                                          caplog, monkeypatch, args, message):
    from multibranch.loading.model import LoadedModel

    def no_loading(*args, **kwargs):
        raise AssertionError("the checkpoint must not be loaded for a bad option")

    monkeypatch.setattr(LoadedModel, "load", classmethod(no_loading))
    out = tmp_path / "out.txt"
    line = refusal(["translate", "--ckpt", checkpoint, "-i", source, "-o", out, "--device", "cpu", *args], capfd,
                   caplog)
    assert message in line
    assert not out.exists()


def test_a_long_line_is_truncated_with_one_warning_naming_it(checkpoint, tmp_path, caplog):
    source = tmp_path / "src.txt"
    source.write_text("\n".join([LINES[0], LINES[1], LONG, LINES[2]]) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    with caplog.at_level(logging.WARNING):
        assert main(["translate", "--ckpt", str(checkpoint), "-i", str(source), "-o", str(out), "--device", "cpu",
                     "--no-progress"]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"input line 3: more than the model's limit of {MAX_POSITIONS} tokens")


@pytest.mark.parametrize("mode", ["file", "score"])
def test_long_inputs_refuse_names_the_line_before_anything_is_written(checkpoint, tmp_path, capfd, caplog, mode):
    source = tmp_path / "src.txt"
    source.write_text("\n".join([LINES[0], LINES[1], LONG, LINES[2]]) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    extra = ["--score-reference", str(source)] if mode == "score" else []
    line = refusal(["translate", "--ckpt", checkpoint, "-i", source, "-o", out, "--device", "cpu",
                    "--long-inputs", "refuse", *extra], capfd, caplog)
    assert f"input line 3 has {MAX_POSITIONS + 1}" not in line  # the whole line counted, not its truncation
    assert line.startswith("multibranch translate: error: input line 3 has ")
    assert f"more than the model's limit of {MAX_POSITIONS}" in line and "--long-inputs truncate" in line
    assert not out.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--max-body-bytes", "10"], "--max-body-bytes 10: must be >= 1024"),
    (["--timeout", "nan"], "--timeout: expected a finite number, got nan"),
    (["--max-wait-ms", "-1"], "--max-wait-ms -1.0: must be >= 0"),
    (["--beam", "0"], "--beam 0: must be >= 1"),
])
def test_serve_limits_out_of_range_are_one_line_naming_the_option(checkpoint, capfd, caplog, args, message):
    pytest.importorskip("fastapi")
    line = refusal(["serve", "--ckpt", checkpoint, "--port", "0", "--device", "cpu", *args], capfd, caplog)
    assert message in line
