"""What a payload is: the format tag and version every checkpoint and export carries, and tied tensors."""

from __future__ import annotations

from typing import Any

import torch

FORMAT = "multibranch-checkpoint"
VERSION = 1


def storage_key(t: torch.Tensor) -> tuple[Any, ...]:
    """Identity of the memory a tensor views: equal keys = the same (tied) tensor."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def tied_groups(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """Map every key whose tensor is tied to an earlier key onto that earlier (canonical) key."""
    first: dict[tuple[Any, ...], str] = {}
    aliases: dict[str, str] = {}
    for key, tensor in state.items():
        if tensor.device.type == "meta" or tensor.numel() == 0:
            continue
        ident = storage_key(tensor)
        if ident in first:
            aliases[key] = first[ident]
        else:
            first[ident] = key
    return aliases
