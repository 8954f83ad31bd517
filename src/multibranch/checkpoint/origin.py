"""A run's origin: which training run a checkpoint comes from, and which weights that run started from.

Every checkpoint's meta holds `origin = {"run_id": ..., "init_fingerprint": ..., "init": ...}`:
    run_id            a random id made at the run's first start and kept across every resume
    init_fingerprint  SHA-256 of the weights at update 0 (the random init, or the --init-from weights)
    init              "random" or "checkpoint" (--init-from)

Averaging needs weights that lie in one basin. `shared_origin` accepts checkpoints of the same run,
or of runs fine-tuned from the same --init-from weights (a "model soup"). Two runs from the same
*random* init (same preset and seed) are not enough: different data or settings send them to
different basins, and their average is no model.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import torch


def new_run_id() -> str:
    return uuid.uuid4().hex


def weights_fingerprint(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the state dict's keys, dtypes, shapes and bytes (in key order)."""
    digest = hashlib.sha256()
    for key, tensor in state.items():
        t = tensor.detach().cpu()
        digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def make_origin(run_id: str, init_fingerprint: str, from_checkpoint: bool) -> dict[str, str]:
    return {"run_id": run_id, "init_fingerprint": init_fingerprint, "init": "checkpoint" if from_checkpoint else "random"}


def origin_of(meta: dict[str, Any] | None) -> dict[str, str] | None:
    """The origin recorded in a checkpoint's meta, or None for checkpoints written before origins existed."""
    origin = (meta or {}).get("origin")
    if isinstance(origin, dict) and origin.get("run_id") and origin.get("init_fingerprint"):
        return origin
    return None


def shared_origin(a: dict[str, str], b: dict[str, str]) -> bool:
    """Same run, or runs fine-tuned from the same checkpoint's weights."""
    if a["run_id"] == b["run_id"]:
        return True
    fine_tuned = a.get("init") == b.get("init") == "checkpoint"
    return fine_tuned and a["init_fingerprint"] == b["init_fingerprint"]
