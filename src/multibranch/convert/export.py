"""`convert export`: a checkpoint as a release directory (checkpoint/export.py writes the files), its weights
optionally stored in half precision (`--dtype fp16|bf16`: half the download; the loaded model is fp32 again,
holding the rounded values, which is what `translate --precision fp16|bf16` on CUDA computes with anyway)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from multibranch.checkpoint.export import export
from multibranch.checkpoint.payload import storage_key
from multibranch.config import to_dict
from multibranch.convert.payload import experiment_config
from multibranch.data.directories import EXPORT, check_output_directory
from multibranch.errors import ConfigError

EXPORT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def export_release(payload: dict[str, Any], out_dir: str | Path, *, force: bool = False,
                   dtype: str = "fp32", source: str | Path | None = None) -> list[Path]:
    """Write `payload` (read from `source`, when given) to `out_dir` with its config validated and every default
    resolved, its floating-point weights in `dtype` (fp32, fp16 or bf16); the written files. Nothing is written if
    the weights do not fit, if `out_dir` holds `source`, or if `out_dir` is not empty and not a release export
    (--force replaces only output of its own kind)."""
    check_output_directory(out_dir, EXPORT, force=force, inputs=[source] if source is not None else [])
    config = to_dict(experiment_config(payload))
    model = cast_weights(payload["model"], dtype)
    meta = {**(payload.get("meta") or {}), "export_dtype": dtype}
    return export({**payload, "config": config, "model": model, "meta": meta}, out_dir, force=force)


def cast_weights(state: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """The state dict with every floating-point tensor in `dtype` (others as they are); tensors shared by several
    keys (tied embeddings) stay shared. ConfigError for an unknown dtype or a value beyond the dtype's range."""
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not one of {', '.join(EXPORT_DTYPES)}")
    target = EXPORT_DTYPES[dtype]
    cast: dict[tuple[Any, ...], torch.Tensor] = {}  # one cast per shared (tied) tensor
    out = {}
    for key, tensor in state.items():
        if not tensor.is_floating_point() or tensor.dtype == target:
            out[key] = tensor
            continue
        ident = storage_key(tensor)
        if ident not in cast:
            converted = tensor.detach().to(target)
            if not torch.isfinite(converted).all() and torch.isfinite(tensor).all():
                biggest = float(tensor.detach().abs().max())
                raise ConfigError(f"--dtype {dtype}: {key} holds values up to {biggest:g}, beyond {dtype}'s range "
                                  f"({torch.finfo(target).max:g}); export it in fp32 or bf16")
            cast[ident] = converted
        out[key] = cast[ident]
    return out
