"""A dispatch-mode counter of the operations that make the host read the device: `.item()`, `bool(tensor)`,
`nonzero`, boolean-mask indexing and anything else whose output shape depends on the data. What CUDA graphs
and `torch.compile(fullgraph=True)` cannot take; the training update and the fixed-shape search use it."""

from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "equal", "allclose",
              "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim"}


def reads_the_host(func, args, kwargs) -> bool:
    """Whether an ATen call reads a device value on the host or returns a shape that depends on the data."""
    if func.overloadpacket.__name__ in HOST_READS or torch.Tag.data_dependent_output in func.tags:
        return True
    if torch.Tag.dynamic_output_shape not in func.tags:
        return False
    name = func.overloadpacket.__name__
    if name in ("index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_"):  # shape from bool masks only
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] if i is not None)
    if name == "repeat_interleave":  # a tensor of repeats without output_size
        return kwargs.get("output_size") is None
    return True


class HostReads(TorchDispatchMode):
    """Collects every ATen call that makes the host read the device, with where in multibranch it came from.
    `ignore`: path fragments of callers whose reads do not count (e.g. "/torch/optim/": the CPU's foreach
    AdamW reads its step counters, CUDA's fused one does not)."""

    def __init__(self, ignore: tuple[str, ...] = ()):
        super().__init__()
        self.found: list[str] = []
        self.ignore = ignore

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if reads_the_host(func, args, kwargs):
            stack = traceback.extract_stack()
            if not any(part in frame.filename for frame in stack for part in self.ignore):
                where = next((f"{f.filename.split('/src/')[-1]}:{f.lineno}" for f in reversed(stack)
                              if "/multibranch/" in f.filename and "/tests/" not in f.filename), "?")
                self.found.append(f"{func.overloadpacket.__name__} at {where}")
        return func(*args, **kwargs)
