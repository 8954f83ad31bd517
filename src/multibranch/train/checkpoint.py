"""Checkpoints: one self-contained file per save, written atomically, loadable with weights_only=True.

Layout (plain containers and tensors only):
    format: "multibranch-checkpoint", version: 1
    config: the resolved ExperimentConfig as a dict
    model: the unwrapped model's state dict
    tokenizer: serialized SentencePiece protos (uint8 tensors), so the file alone translates text
    meta: step, epoch, validation scores, config hash, data fingerprint, versions
    training: (optional) optimizer, schedules, data position and RNG states for an exact resume
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORMAT = "multibranch-checkpoint"
VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupted, or does not fit the model/run it is loaded into."""


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP / torch.compile wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """torch.save to a temporary file in the same directory, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    atomic_torch_save({"format": FORMAT, "version": VERSION, **payload}, path)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read and sanity-check a checkpoint file (on CPU)."""
    path = Path(path)
    if path.is_dir():  # a release directory written by `multibranch convert export`
        from multibranch.convert.export import load_export

        return load_export(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated file, not a torch file, unpickling refused...
        raise CheckpointError(f"{path} is corrupted or not a multibranch checkpoint ({type(err).__name__}: {err})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a multibranch checkpoint (no '{FORMAT}' header)")
    if payload.get("version", 0) > VERSION:
        raise CheckpointError(f"{path} was written by a newer multibranch (format version {payload['version']})")
    for key in ("config", "model"):
        if key not in payload:
            raise CheckpointError(f"{path} is incomplete: missing '{key}'")
    return payload


def state_mismatch(expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> list[str]:
    """What keeps `state` from loading where `expected` lives: missing / unexpected keys and shape
    mismatches, one line each (empty when it fits)."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [f"{k}: given {tuple(state[k].shape)} vs expected {tuple(expected[k].shape)}"
              for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    lines = []
    for label, items, sep in (("missing keys", missing, ", "), ("unexpected keys", unexpected, ", "),
                              ("shape mismatches", shapes, "; ")):
        if items:
            lines.append(f"  {label} ({len(items)}): {sep.join(items[:5])}{' ...' if len(items) > 5 else ''}")
    return lines


def load_state_strict(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """load_state_dict that explains a mismatch (missing/unexpected keys, wrong shapes)."""
    problems = state_mismatch(model.state_dict(), state)
    if problems:
        raise CheckpointError("\n".join([f"{source} does not match the model it is loaded into:", *problems]))
    model.load_state_dict(state)


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any
    config: Any  # ExperimentConfig
    payload: dict[str, Any]


def load_model(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Rebuild the model of a checkpoint (eval mode) with its tokenizer and experiment config."""
    from multibranch.data.tokenizer import Tokenizer
    from multibranch.experiment import ExperimentConfig
    from multibranch.models import build_model

    payload = load_checkpoint(path)
    config = ExperimentConfig.from_dict(payload["config"])
    model = build_model(config.model)
    load_state_strict(model, payload["model"], str(path))
    model.to(device).eval()
    tokenizer = Tokenizer.from_state(payload["tokenizer"]) if payload.get("tokenizer") else None
    return LoadedModel(model, tokenizer, config, payload)
