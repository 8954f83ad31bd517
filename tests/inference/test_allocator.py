"""`keep_freed_memory`: after it, a decoding-sized buffer freed and allocated again is not page-faulted in anew
(counted with getrusage in a fresh interpreter, so the test process's own allocator is not changed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys
import numpy as np
from multibranch.inference.allocator import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):  # a beam step's logits, log-probabilities and candidate scores (5 MB each), then freed
    buffers = [np.ones(160 * 8000, dtype=np.float32) for _ in range(4)]
    del buffers
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True).stdout
    took, faults = out.split()
    return took, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_step_buffers_are_reused_instead_of_faulted_in_again():
    took, kept = _faults("keep")
    if took != "True":
        pytest.skip("this C library has no mallopt (not glibc)")
    _, default = _faults("default")
    pages = 4 * 160 * 8000 * 4 // 4096  # one step's buffers, in pages
    assert default > 10 * pages  # glibc's default: most of the 40 steps fault their buffers in again
    assert kept < 3 * pages  # kept: the first step's pages, then reuse


def test_objects_alive_on_entry_are_frozen_inside_and_collectable_after():
    """`loaded_objects_frozen`: a cycle alive on entry sits in the permanent generation inside (a collection
    leaves it even once unreachable), and is collected after the block; a cycle made inside is collected
    inside. Compared by weak reference, so nothing is inferred from counts."""
    import gc
    import weakref

    from multibranch.inference.allocator import loaded_objects_frozen

    class Node:
        pass

    def cycle() -> weakref.ref:
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    before_inside = [Node()]
    before_inside[0].self = before_inside  # a cycle alive on entry
    loaded = weakref.ref(before_inside[0])
    with loaded_objects_frozen():
        assert gc.get_freeze_count() > 0
        del before_inside  # unreachable now, but frozen: a collection leaves it
        gc.collect()
        assert loaded() is not None
        made_inside = cycle()  # not frozen: collected as usual
        gc.collect()
        assert made_inside() is None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert loaded() is None
