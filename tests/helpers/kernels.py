"""The CPU kernels (multibranch/cpu_kernels.py) as a test requirement: `require_kernels()` skips the calling
test where they cannot be built, or fails it when MULTIBRANCH_REQUIRE_CPU_KERNELS=1 (CI, where a compiler and
ninja are present: a build that broke must not pass as a skip)."""

from __future__ import annotations

import os

import pytest

from multibranch import cpu_kernels

REASON = ("multibranch's CPU kernels cannot be built here (no C++ compiler or ninja, or MULTIBRANCH_CPU_KERNELS=0); "
          "MULTIBRANCH_REQUIRE_CPU_KERNELS=1 makes this an error")


def require_kernels() -> None:
    if cpu_kernels.kernels() is not None:
        return
    if os.environ.get("MULTIBRANCH_REQUIRE_CPU_KERNELS") == "1":
        pytest.fail(REASON)
    pytest.skip(REASON)
