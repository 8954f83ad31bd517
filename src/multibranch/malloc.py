"""glibc's malloc set for CPU training: freed large blocks are kept for the next update, not returned to the system.

glibc serves a request above its mmap threshold (adjusted at run time, never above 32 MiB) with a fresh mapping that
`free` unmaps, and returns the free top of the heap to the system above its trim threshold. An update allocates and
frees the same large tensors every step (activations, the wide FFNs' hidden layers, the output layer's logits
chunk), so each update touches new pages: one page fault per 4 KiB, each page zeroed by the kernel. Setting both
thresholds (`mallopt`) keeps such blocks in the heap to be reused; bench/train_speed.py --system-malloc measures the
difference side by side (docs/benchmarks.md). The cost: a process keeps up to `LIMIT` of freed memory mapped.

Applied where the toolkit trains on the CPU, once per process, on Linux with glibc only, and never when the user
chose: glibc's own settings in the environment (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`,
`GLIBC_TUNABLES`), another allocator preloaded (`LD_PRELOAD`), or `MULTIBRANCH_MALLOC=0`.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

LIMIT = 1 << 30  # bytes: blocks below this stay in the heap, and so may this much free memory at its top
SWITCH = "MULTIBRANCH_MALLOC"  # 0 (false, no, off) leaves the C library's settings alone
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def blocker() -> str | None:
    """Why this process keeps the C library's malloc settings (None: `keep_large_blocks` may set them)."""
    switch = os.environ.get(SWITCH, "1")
    if switch.strip().lower() in ("0", "false", "no", "off"):
        return f"{SWITCH}={switch}"
    chosen = [name for name in USER_SETTINGS if os.environ.get(name)]
    if chosen:
        return f"{chosen[0]} is set"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "the C library is not glibc"
    return None


@functools.cache
def keep_large_blocks() -> str:
    """Set glibc's mmap and trim thresholds to LIMIT (once per process); returns what was done, for the run's log."""
    reason = blocker()
    if reason is not None:
        return f"malloc: the C library's settings ({reason})"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "malloc: the C library's settings (libc.so.6 has no mallopt)"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(_M_MMAP_THRESHOLD, LIMIT) and mallopt(_M_TRIM_THRESHOLD, LIMIT)):
        return "malloc: the C library's settings (mallopt refused)"
    return f"malloc: blocks under {LIMIT >> 20} MiB reused, not unmapped ({SWITCH}=0 keeps glibc's)"
