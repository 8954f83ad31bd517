"""multibranch's CPU kernels (`csrc/`), compiled with PyTorch's `cpp_extension` on first use.

A beam-search step composed of PyTorch operations pays per-operation overhead on many small tensors. These
kernels do a step's small parts in one call each, fp32 on the CPU:

- `csrc/decoder_attention.cpp`: a decoder step's self-attention over each hypothesis' own history and its
  cross-attention over a memory shared by a sentence's hypotheses (`modules/fused_attention.py`);
- `csrc/beam_step.cpp`: a beam step's log-softmax normaliser per row and its best (score + token
  log-probability) candidates per sentence (`inference/beam.py`, `inference/candidates.py`);
- `csrc/layer_norm.cpp`: a post-norm residual sublayer's LayerNorm(x + y) in one pass (`models/layers/common.py`);
- `csrc/bindings.cpp`: the Python module.

The extension is built (a C++ compiler and ninja; the `ninja` package is a dependency) into PyTorch's
extension cache the first time it is needed (about a minute, once per machine and source version; a
one-line note says so on stderr). Where it cannot be built, `kernels()` returns None after one warning and decoding
composes PyTorch operations as before; `MULTIBRANCH_CPU_KERNELS=0` turns the kernels off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

SOURCES = [Path(__file__).with_name("csrc") / name
           for name in ("bindings.cpp", "decoder_attention.cpp", "beam_step.cpp", "layer_norm.cpp")]
# -ffast-math: vectorised expf (glibc's libmvec); compile flags only, so the library does not set
# flush-to-zero for the whole process (tests/test_cpu_kernels.py checks)
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd"]


def _capability_flags() -> list[str]:
    """ATen's vector width for `at::vec::Vectorized` (csrc/beam_step.cpp), as PyTorch picked it for this CPU."""
    capability = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2", "DEFAULT", ...
    if capability in ("AVX512", "AVX2"):
        return [f"-DCPU_CAPABILITY={capability}", f"-DCPU_CAPABILITY_{capability}"]
    return ["-DCPU_CAPABILITY=DEFAULT"]
ENV_SWITCH = "MULTIBRANCH_CPU_KERNELS"


def _build_name() -> str:
    """The extension's name: the sources, the flags and this CPU's instruction sets (-march=native) in a
    hash, so a changed source, or a cache shared by machines of different CPUs, never loads a stale build."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    digest.update(" ".join(CFLAGS + _capability_flags()).encode())
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        flags = next((line for line in cpuinfo.read_text(errors="replace").splitlines()
                      if line.startswith("flags")), "")
        digest.update(flags.encode())
    return f"multibranch_cpu_kernels_{digest.hexdigest()[:12]}"


def enabled() -> bool:
    """Whether the kernels may be used at all (the environment switch; default on)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


@functools.cache
def kernels() -> ModuleType | None:
    """The compiled extension, built on the first call (then loaded from PyTorch's extension cache); None
    when switched off or when it cannot be built (one warning with the reason)."""
    if not enabled():
        return None
    try:
        from torch.utils.cpp_extension import _get_build_directory, load

        name = _build_name()
        if not any(Path(_get_build_directory(name, verbose=False)).glob("*.so")):
            print("building multibranch's CPU kernels (once per machine, about a minute)", file=sys.stderr)
        return load(name=name, sources=[str(s) for s in SOURCES], extra_cflags=CFLAGS + _capability_flags(),
                    extra_ldflags=["-lm"], verbose=False)
    except Exception as error:  # noqa: BLE001 - any build failure means "decode without the kernels"
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        warnings.warn(f"multibranch's CPU kernels could not be built ({first_line}); decoding composes PyTorch "
                      f"operations instead (set {ENV_SWITCH}=0 to skip the attempt)", stacklevel=2)
        return None


def usable(*tensors: Tensor) -> bool:
    """Whether these tensors can go through the kernels: fp32 CPU tensors, and the kernels built."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and kernels() is not None
