"""bench/bad_line_at_scale.py at a small line number: the bad corpus fails with file:line and leaves nothing,
its clean prefix prepares, both through the CLI as the benchmark runs them. A `prepare` that stops its encoding
workers without waiting for the chunks in flight can hang in `Pool.terminate`; a hang fails this test at the
subprocess timeout instead of stalling the suite."""

from __future__ import annotations

from bench import bad_line_at_scale as bench


def test_the_bad_line_is_named_and_nothing_is_left(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "PREPARE_TIMEOUT", 120)
    pool = bench._pool()
    model = tmp_path / "spm.model"
    bench._spm_model(pool, model)
    bench._write(tmp_path / "valid", pool, 200, False, 0)
    bench._write(tmp_path / "bad", pool, 30_000, True, 50)  # more than one pool block before the bad line
    bench._write(tmp_path / "clean", pool, 30_000, False, 0)
    assert (tmp_path / "bad.tgt").read_bytes().count(b"\n") == 30_051
    out = tmp_path / "out"
    failed = bench._prepare("bad", tmp_path / "bad", tmp_path / "valid", out, ["--spm-model", str(model)])
    assert failed["exit"] == 2 and failed["stderr_lines"] == 1 and not failed["output_left"]
    assert "bad.tgt:30001: invalid UTF-8" in failed["error"]
    clean = bench._prepare("clean", tmp_path / "clean", tmp_path / "valid", out, ["--spm-model", str(model)])
    assert clean["exit"] == 0 and clean["output_left"]
