"""The parameters' gradients as views into one flat buffer per dtype: zeroed in place, all-reduced in one call.

What the fixed-shape update needs from its gradients. A captured CUDA graph reads and writes the same memory on
every replay, so the gradients must live at fixed addresses between the graphs of one update (each micro-batch's
forward/backward, then the optimizer step): autograd accumulates into an existing `.grad` in place, and the
buffer is zeroed in place instead of the gradients being set to None. Data-parallel processes then average their
gradients with one collective over the buffer (what DDP does in buckets during the backward), which runs between
the graphs and keeps collectives out of them.

The buffer holds the parameters that received a gradient in the first update (`adopt`): a parameter that no
forward uses keeps `grad=None` and, as before, the optimizer leaves it alone.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn


class FlatGradients:
    """Gradients of `params` as views into one contiguous buffer per dtype (built by `adopt`)."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.buffers: list[Tensor] = []
        self._views: list[tuple[nn.Parameter, Tensor]] = []
        by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, group in by_dtype.items():
            buffer = torch.zeros(sum(p.numel() for p in group), dtype=dtype, device=group[0].device)  # [n]
            offset = 0
            for p in group:
                self._views.append((p, buffer[offset : offset + p.numel()].view_as(p)))
                offset += p.numel()
            self.buffers.append(buffer)

    @classmethod
    def adopt(cls, params: Iterable[nn.Parameter]) -> FlatGradients:
        """A buffer for the parameters that hold a gradient now, holding those gradients; each `.grad` becomes
        its view (call after the first backward)."""
        held = [p for p in params if p.grad is not None]
        flat = cls(held)
        for p, view in flat._views:
            view.copy_(p.grad)
        flat.attach()
        return flat

    def attach(self) -> None:
        """Point every parameter's `.grad` at its view again (after anything that replaced or dropped it)."""
        for p, view in self._views:
            p.grad = view

    def attached(self) -> bool:
        """Whether every `.grad` is still its view (a capture that allocated a new one would break a graph)."""
        return all(p.grad is view for p, view in self._views)

    def zero_(self) -> None:
        for buffer in self.buffers:
            buffer.zero_()

    def average_over_processes(self, world_size: int) -> None:
        """Sum the buffers over the process group, then divide by its size (DDP's mean), one collective each."""
        for buffer in self.buffers:
            dist.all_reduce(buffer)
            buffer.div_(world_size)


def broadcast_from_first_process(module: nn.Module) -> None:
    """Every process starts from process 0's parameters and buffers (what DDP does when it wraps a model)."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)
