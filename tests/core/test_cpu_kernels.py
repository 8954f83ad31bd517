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


def test_a_failed_build_warns_once_and_leaves_the_kernels_off(monkeypatch):
    import torch.utils.cpp_extension as cpp_extension

    def broken(**_):
        raise RuntimeError("Ninja is required to load C++ extensions\nmore detail")

    monkeypatch.delenv(cpu_kernels.ENV_SWITCH, raising=False)
    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.setattr(cpu_kernels, "_build_name", lambda: "multibranch_cpu_kernels_never_built")
    cpu_kernels.kernels.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"could not be built \(Ninja is required to load C\+\+ extensions\)"):
            assert cpu_kernels.kernels() is None
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
