"""Keep freed memory for reuse in a decoding process (glibc's malloc only; elsewhere a no-op).

Each decoding step allocates a few buffers of [hypotheses, vocabulary] floats (logits, log-probabilities,
candidate scores: 5 MB each at 160 hypotheses and 8k tokens). glibc serves allocations above its mmap
threshold with fresh mappings and returns freed memory at the top of the heap to the OS, so every step
page-faults those buffers in again (about 110k minor faults per 320 Multi30k sentences, beam 5). Raising
both thresholds keeps the memory in the heap for the next step: about 5% less CPU time for `translate` on
these machines (docs/benchmarks.md). The cost is that a decoding process keeps its peak heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
KEEP_BYTES = 512 * 2**20  # allocations up to this size come from the heap, and up to this much freed is kept


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory (see the module docstring); True when it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))
