"""torchrun-based data parallelism: gloo on CPU, nccl on GPU; rank 0 does all I/O."""

from __future__ import annotations

import datetime
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from multibranch.errors import ConfigError


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_type: str, timeout_minutes: float = 30.0) -> DistInfo:
    """Join the process group torchrun set up (env://); a plain run is rank 0 of 1.

    On CUDA each process of a node takes the GPU of its local rank: a node with more processes than GPUs is
    a ConfigError before any process group is joined (NCCL would fail later, in a raw CUDA error)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda" and local_rank >= torch.cuda.device_count():
        raise ConfigError(f"--device cuda under torchrun: local rank {local_rank} needs GPU {local_rank}, but this "
                          f"node has {torch.cuda.device_count()}; start at most that many processes a node "
                          "(--nproc-per-node), or use --device cpu (gloo)")
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)


def all_reduce_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    if not info.enabled:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def all_reduce_(tensor: torch.Tensor, info: DistInfo) -> None:
    """Sum `tensor` over the processes in place, on its device (no host read)."""
    if info.enabled:
        dist.all_reduce(tensor)


def all_gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def is_worker_of_a_job() -> bool:
    """Whether this process is one of several torchrun started (WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def exit_worker(code: int) -> NoReturn:
    """End a torchrun worker whose work is done and written: flush the console and the logs, then leave
    without running C++ static destructors. In multi-node runs a finished worker was seen (about one run in
    ten, tests/train/test_multinode.py) to abort after Python's own shutdown ("terminate called without an
    active exception", no Python frame left) when a thread PyTorch's distributed runtime started was still
    joinable; torchrun then reported the whole job as failed although every checkpoint was complete."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
