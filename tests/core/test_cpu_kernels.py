"""Building and loading multibranch's CPU kernels (cpu_kernels.py); the kernels themselves are tested where
they are used (tests/modules/test_fused_attention.py)."""

from __future__ import annotations

import pytest
import torch

from multibranch import cpu_kernels

needs_kernels = pytest.mark.usefixtures("cpu_kernels_built")


@needs_kernels
def test_loading_the_kernels_leaves_denormals_alone():
    """They are compiled with -ffast-math (compile flags only): linking that way would set flush-to-zero for
    the whole process when the library loads, changing every other computation's numerics."""
    assert cpu_kernels.kernels() is not None
    assert (torch.tensor([1e-40]) * 1.0).item() != 0.0


BROKEN_COMPILER = """#!/bin/sh
case " $* " in *" -dumpfullversion "*) echo 13.3.0; exit 0 ;; esac
echo "fake-g++: fatal error: no compiler here" >&2
exit 1
"""


def test_a_failed_build_warns_once_and_leaves_the_kernels_off(monkeypatch, tmp_path):
    """The real build (its child, PyTorch's cpp_extension and ninja) with a compiler that fails: one warning
    naming the failure and the build's log, which holds the compiler's message; no second attempt."""
    compiler = tmp_path / "fake-g++"
    compiler.write_text(BROKEN_COMPILER)
    compiler.chmod(0o755)
    monkeypatch.delenv(cpu_kernels.ENV_SWITCH, raising=False)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setattr(cpu_kernels, "_build_name", lambda: "multibranch_cpu_kernels_never_built")
    cpu_kernels.kernels.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"could not be built \(Error building extension "
                                             r"'multibranch_cpu_kernels_never_built'") as caught:
            assert cpu_kernels.kernels() is None
        log = tmp_path / "extensions" / "multibranch_cpu_kernels_never_built" / cpu_kernels.BUILD_LOG
        assert len(caught) == 1 and str(log) in str(caught[0].message)
        assert "no compiler here" in log.read_text()
        assert cpu_kernels.kernels() is None  # cached: no second attempt, no second warning
        assert not cpu_kernels.usable(torch.zeros(1))
    finally:
        cpu_kernels.kernels.cache_clear()


def test_the_environment_switch_turns_the_kernels_off(monkeypatch):
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "0")
    cpu_kernels.kernels.cache_clear()
    try:
        assert not cpu_kernels.enabled() and cpu_kernels.kernels() is None
    finally:
        cpu_kernels.kernels.cache_clear()


def test_the_build_name_changes_with_the_sources(monkeypatch, tmp_path):
    """A changed source is a new extension (never a stale build from PyTorch's cache)."""
    before = cpu_kernels._build_name()
    changed = tmp_path / "decoder_attention.cpp"
    changed.write_text(cpu_kernels.SOURCES[-1].read_text() + "\n// changed\n")
    monkeypatch.setattr(cpu_kernels, "SOURCES", [*cpu_kernels.SOURCES[:-1], changed])
    assert cpu_kernels._build_name() != before
