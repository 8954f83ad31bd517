"""Memory settings of a decoding process: keep freed memory for reuse (glibc's malloc only; elsewhere a
no-op), and keep Python's cyclic garbage collector off the loaded model's objects.

Each decoding step allocates a few buffers of [hypotheses, vocabulary] floats (logits, log-probabilities,
candidate scores: 5 MB each at 160 hypotheses and 8k tokens). glibc serves allocations above its mmap
threshold with fresh mappings and returns freed memory at the top of the heap to the OS, so every step
page-faults those buffers in again (about 110k minor faults per 320 Multi30k sentences, beam 5). Raising
both thresholds keeps the memory in the heap for the next step: about 5% less CPU time for `translate` on
these machines (docs/benchmarks.md). The cost is that a decoding process keeps its peak heap.

A decoding step creates and drops a few hundred Python tensor objects, so the cyclic collector runs often,
and each of its older-generation passes walked every object the loaded model and tokenizer consist of (about
2% of `translate`'s CPU time in a perf profile of steady decoding, 1 thread). `loaded_objects_frozen`, entered
once the model is loaded, moves them to the collector's permanent generation (`gc.freeze`): they are never
garbage, and the collector then only scans what decoding creates.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

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


def freeze_loaded_objects() -> None:
    """Move every Python object alive now to the collector's permanent generation (for good: a process that
    only decodes from here on; `loaded_objects_frozen` undoes it on exit)."""
    gc.collect()  # what is garbage already goes now, not into the permanent generation
    gc.freeze()


@contextmanager
def loaded_objects_frozen() -> Iterator[None]:
    """While inside: every Python object alive on entry (the loaded model, tokenizer, ...) is left out of cyclic
    garbage collections (see the module docstring). On exit they are collectable again (`gc.unfreeze`), so
    a caller in a longer-lived process (tests, a notebook) loses nothing."""
    freeze_loaded_objects()
    try:
        yield
    finally:
        gc.unfreeze()
