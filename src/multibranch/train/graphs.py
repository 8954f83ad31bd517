"""A training update replayed as a few CUDA graphs: one per micro-batch shape, one for the optimizer step.

PyTorch's whole-network capture (`torch.cuda.graph`): the kernels of each piece of an update are recorded
once and then replayed with a single launch, so the GPU no longer waits for Python to launch a few thousand
small operations. The pieces are a micro-batch's forward and backward (keyed by the batch's shape, and by
whether it is the update's first: that one adds the modules' auxiliary losses) and the step (gradient
clipping, optimizer step, the modules' post-step projections, zeroing the gradients). So an update of
`update_freq` micro-batches replays `update_freq + 1` graphs, and a run keeps at most twice as many graphs
as it has batch shapes, plus one. Between the pieces, the gradients stay in place (train/gradients.py);
collectives of data-parallel runs (the update's size, the gradients' mean) run eagerly between graphs, so
that what each process captures, and whether a capture fails, concerns that process alone.

A graph reads its inputs from static device buffers that every replay overwrites, and everything else that
changes between updates must be a device tensor changed in place before the replay: the learning rates
(capturable AdamW with tensor learning rates), the loss normaliser, the modules' scheduled rates. Whatever
the update reports is accumulated on the device. The trainer keeps these rules on every path; this module
only records and replays.

Each piece is first run eagerly `warmup` times on a side stream (so that cuBLAS handles, workspaces and the
optimizer's state exist before the capture), then captured and replayed. A capture that fails (an operation
that reads the device or changes shape) switches the run to eager updates for good, with one warning that
names the reason: never a crash mid-run. Dropout inside a graph draws from the CUDA generator's Philox
stream at the offsets the eager kernels would use, so a run that changes path (warm-up, capture, fallback)
keeps the same random numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger("multibranch.train")

Shape = tuple[tuple[int, ...], ...]


def batch_tensors(batch: Any) -> dict[str, Tensor]:
    """The tensor fields of a batch dataclass, by name."""
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch) if isinstance(getattr(batch, f.name), Tensor)}


def upload(batch: Any, device: torch.device) -> Any:
    """`batch` (a dataclass of CPU tensors) on `device`: through pinned memory without blocking on CUDA."""
    if device.type != "cuda":
        return batch.to(device)
    moved = {name: t.pin_memory().to(device, non_blocking=True) for name, t in batch_tensors(batch).items()}
    return dataclasses.replace(batch, **moved)


def shape_of(batch: Any) -> Shape:
    return tuple(tuple(t.shape) for t in batch_tensors(batch).values())


Key = tuple[str, Shape]  # (piece, shape of its batch's tensors)


@dataclasses.dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: Any  # the batch whose tensors the graph reads (static device buffers); None for the step


class GraphedUpdates:
    """Runs the pieces of a training update (`work(batch)` on a batch of device tensors, or `work(None)`) as
    replayed CUDA graphs, one per (piece, batch shape), after `warmup` eager runs of each; eager for good after a
    failed capture. `on_failure` restores what a failed capture may have left (e.g. the gradients' buffer)."""

    def __init__(self, device: torch.device, on_failure: Callable[[], None], warmup: int = 1):
        self.device = device
        self.on_failure = on_failure
        self.warmup = warmup
        self.graphs: dict[Key, _Captured] = {}
        self.eager_runs: Counter[Key] = Counter()
        self.failed: str | None = None
        self.side = torch.cuda.Stream(device)
        # One memory pool for every graph: they never run at the same time, and what outlives a piece (weights,
        # gradients, optimizer state, input buffers, the logged sums) is allocated outside the captures.
        self.pool = torch.cuda.graph_pool_handle()

    @property
    def shapes(self) -> int:
        """Distinct batch shapes captured so far."""
        return len({shape for (_, shape) in self.graphs if shape})

    def run(self, piece: str, work: Callable[[Any], None], batch: Any = None) -> None:
        if self.failed is not None:
            work(batch)
            return
        key = (piece, shape_of(batch) if batch is not None else ())
        captured = self.graphs.get(key)
        if captured is None:
            if self.eager_runs[key] < self.warmup:
                self.eager_runs[key] += 1
                self._on_side_stream(lambda: work(batch))
                return
            captured = self._capture(key, work, batch)
            if captured is None:  # failed: this piece runs eagerly
                work(batch)
                return
        # (right after a capture, the buffers already hold this batch: a capture records, it does not run)
        if batch is not None:
            for name, t in batch_tensors(batch).items():
                getattr(captured.inputs, name).copy_(t, non_blocking=True)
        captured.graph.replay()

    def _on_side_stream(self, work: Callable[[], None]) -> None:
        current = torch.cuda.current_stream(self.device)
        self.side.wait_stream(current)
        with torch.cuda.stream(self.side):
            work()
        current.wait_stream(self.side)

    def _capture(self, key: Key, work: Callable[[Any], None], batch: Any) -> _Captured | None:
        """Record `work` on static copies of `batch`'s tensors; None after a failure, which turns graphs off for
        the rest of the run."""
        inputs = None if batch is None else dataclasses.replace(
            batch, **{n: t.clone() for n, t in batch_tensors(batch).items()})
        graph = torch.cuda.CUDAGraph()
        try:
            torch.cuda.synchronize(self.device)
            with torch.cuda.graph(graph, pool=self.pool, stream=self.side):
                work(inputs)
        except Exception as error:  # any capture failure: eager from now on, the run goes on
            self.failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".strip()
            log.warning("CUDA graphs turned off for this run, updates continue eagerly: capturing the %s of an "
                        "update failed (%s)", key[0], self.failed)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(self.device)
            self.on_failure()
            return None
        captured = _Captured(graph, inputs)
        self.graphs[key] = captured
        return captured
