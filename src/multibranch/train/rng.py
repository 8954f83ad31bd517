"""Capture and restore every random-number generator a run uses (for an exact resume)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Plain containers only (loadable with torch.load(weights_only=True))."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": list(random.getstate()[1]) + [random.getstate()[2] if random.getstate()[2] is not None else -1],
        "python_version": random.getstate()[0],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = list(state["python"])
    gauss = None if py[-1] == -1 else py[-1]
    random.setstate((state["python_version"], tuple(int(x) for x in py[:-1]), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
