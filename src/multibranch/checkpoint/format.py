"""The checkpoint file format: one self-contained file per save, written atomically, loadable with weights_only=True.

Layout (plain containers and tensors only):
    format: "multibranch-checkpoint", version: 1
    config: the resolved ExperimentConfig as a dict
    model: the unwrapped model's state dict
    tokenizer: serialized SentencePiece protos (uint8 tensors), so the file alone translates text
    meta: step, epoch, validation scores, config hash, data fingerprint, versions
    training: (optional) optimizer, schedules, data position and RNG states for an exact resume
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from multibranch.atomic import atomic_write
from multibranch.checkpoint.export import CONFIG_FILE, WEIGHTS_FILE, load_export
from multibranch.checkpoint.payload import FORMAT, VERSION, tied_groups
from multibranch.errors import CheckpointError

__all__ = ["FORMAT", "VERSION", "CheckpointError", "load_checkpoint", "save_checkpoint", "tied_groups"]



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
    """torch.save through `multibranch.atomic.atomic_write` (temporary beside `path`, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as handle:
        torch.save(obj, handle)


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    atomic_torch_save({"format": FORMAT, "version": VERSION, **payload}, path)


# The first bytes of a torch.save file: a zip archive (the default since torch 1.6) or a legacy pickle.
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")
RUN_DIR_MARKERS = ("last.pt", "best.pt", "checkpoints")
CT2_SETTINGS_FILE = "multibranch_ct2.json"  # in every `convert ct2` directory (convert/ct2.py writes it)
HF_MARKER_FILE = "multibranch_hf.json"  # in every `convert to-hf` folder (convert/hf_marian_export.py writes it)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read and sanity-check a checkpoint file, or an export directory (on CPU)."""
    path = Path(path)
    if path.is_dir():
        return _load_directory(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    with path.open("rb") as handle:
        head = handle.read(4)
    if not head.startswith(_TORCH_MAGIC):  # a text file, a YAML config, a SentencePiece model...
        raise CheckpointError(f"{path} is not a multibranch checkpoint")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated file, unpickling refused...
        reason = (str(err).strip().splitlines() or [""])[0].split(". ")[0]  # torch's advice on corruption is ours
        raise CheckpointError(f"{path} is corrupted or not a multibranch checkpoint ({type(err).__name__}: {reason})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a multibranch checkpoint (no '{FORMAT}' header)")
    if payload.get("version", 0) > VERSION:
        raise CheckpointError(f"{path} was written by a newer multibranch (format version {payload['version']})")
    for key in ("config", "model"):
        if key not in payload:
            raise CheckpointError(f"{path} is incomplete: missing '{key}'")
    return payload


def _load_directory(path: Path) -> dict[str, Any]:
    """An export directory (`multibranch convert export`); a run directory gets a pointer to its best.pt."""
    if (path / CT2_SETTINGS_FILE).is_file():
        raise CheckpointError(f"{path} is a CTranslate2 model directory (`multibranch convert ct2`), not a multibranch "
                              "checkpoint; `translate --ckpt` and `serve --engine ct2` run it")
    if (path / CONFIG_FILE).is_file() or (path / WEIGHTS_FILE).is_file():
        return load_export(path)
    if any((path / name).exists() for name in RUN_DIR_MARKERS):
        raise CheckpointError(f"{path} is a run directory; did you mean {path / 'best.pt'}?")
    raise CheckpointError(f"{path} is a directory, not a multibranch checkpoint or exported model")


def config_differences(old: Any, new: Any, path: str, old_label: str, new_label: str) -> list[str]:
    """Every leaf where two config dicts differ, one line each: "PATH: OLD_LABEL X, NEW_LABEL Y"."""
    if isinstance(old, dict) and isinstance(new, dict):
        lines = []
        for key in [*old, *(k for k in new if k not in old)]:
            lines += config_differences(old.get(key), new.get(key), f"{path}.{key}", old_label, new_label)
        return lines
    return [] if old == new else [f"{path}: {old_label} {old!r}, {new_label} {new!r}"]


def same_tokenizer(a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor] | None) -> bool:
    """Whether two checkpoint tokenizer states (serialized SentencePiece protos) are identical."""
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


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
