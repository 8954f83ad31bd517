"""Fused CPU attention for a decoder step (`csrc/decoder_attention.cpp`), compiled on first use.

A beam-search step asks one new query per hypothesis. Composed from PyTorch operations, its self-attention
copies every layer's growing K/V cache once a step (the beam reorder, `DecoderState.append`) before
`scaled_dot_product_attention` sets up one small problem per (row, head). The kernels here do that step's
attention in one call each:

- `history_attention`: each row's query over the keys/values of its own history, read in place: step s's
  projections stay where step s wrote them, and row r reads step s at row `ancestors[r, s]`
  (`DecoderState.ancestors`), so a reorder moves a [rows, steps] index table instead of the caches;
- `memory_attention`: cross-attention with g consecutive query rows (a sentence's hypotheses) sharing one
  memory row, padded positions skipped (no mask tensor, no grouping transposes).

Both take rows of all heads side by side ([rows, heads * head_dim], as the projections write them) and
return a new [rows, heads * head_dim] tensor, ready for the output projection. fp32 on the CPU only; the
results equal SDPA's up to summation order (tests/modules/test_fused_attention.py).

The extension is built with PyTorch's `cpp_extension` (a C++ compiler and ninja; the `ninja` package is a
dependency) into PyTorch's extension cache the first time a packed decoding copy decodes (~30 s, once per
machine and source version). Where it cannot be built, `kernels()` returns None after one warning and
decoding uses the composed path; `MULTIBRANCH_FUSED_ATTENTION=0` turns the kernels off.
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

SOURCE = Path(__file__).with_name("csrc") / "decoder_attention.cpp"
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd"]  # -ffast-math: vectorised expf (libmvec)
ENV_SWITCH = "MULTIBRANCH_FUSED_ATTENTION"


def _build_name() -> str:
    """The extension's name: the source, the flags and this CPU's instruction sets (-march=native) in a hash,
    so a changed source, or a cache shared by machines of different CPUs, never loads a stale build."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join(CFLAGS).encode())
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        flags = next((line for line in cpuinfo.read_text(errors="replace").splitlines()
                      if line.startswith("flags")), "")
        digest.update(flags.encode())
    return f"multibranch_decoder_attention_{digest.hexdigest()[:12]}"


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
            print(f"building the fused decoder attention ({SOURCE.name}; once per machine, ~30 s)", file=sys.stderr)
        return load(name=name, sources=[str(SOURCE)], extra_cflags=CFLAGS, extra_ldflags=["-lm"],
                    verbose=False)
    except Exception as error:  # noqa: BLE001 - any build failure means "decode without the kernels"
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        warnings.warn(f"the fused decoder attention could not be built ({first_line}); decoding composes "
                      f"PyTorch operations instead (set {ENV_SWITCH}=0 to skip the attempt)", stacklevel=2)
        return None


def usable(*tensors: Tensor) -> bool:
    """Whether these activations can go through the kernels: fp32 CPU tensors, and the kernels built."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and kernels() is not None


def history_attention(q: Tensor, keys: list[Tensor], values: list[Tensor], ancestors: Tensor, heads: int) -> Tensor:
    """q [R, H*d] (the step's queries); keys[s], values[s] [R_s, H*d] (step s's projections, rows as
    written then); ancestors [R, L] int64 (row r's row at step s; L = len(keys)) -> [R, H*d]."""
    width = q.shape[1]
    return kernels().history_attention(q, keys, values, ancestors, heads, (width // heads) ** -0.5)


def memory_attention(q: Tensor, keys: Tensor, values: Tensor, padding: Tensor | None, heads: int) -> Tensor:
    """q [R, H*d]; keys, values [b, S, H*d] (R = b * g: g consecutive rows share memory row r // g);
    padding [b, S] bool, True at padding (or None) -> [R, H*d]."""
    width = q.shape[1]
    mask = padding.contiguous() if padding is not None else torch.empty(0, dtype=torch.bool)
    return kernels().memory_attention(q, keys, values, mask, heads, (width // heads) ** -0.5)
