"""One checkpoint (or `convert export` directory) rebuilt: its model in eval mode, tokenizer and config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multibranch.checkpoint.format import load_checkpoint, load_state_strict
from multibranch.data.tokenizer import tokenizer_from_state
from multibranch.errors import CheckpointError
from multibranch.experiment import ExperimentConfig
from multibranch.tasks.registry import TASKS, build_task_model


@dataclass
class LoadedCheckpoint:
    """A rebuilt checkpoint: the model (eval mode), its tokenizer (None if it kept none), its experiment
    config and the whole payload (meta, optimiser state where kept)."""

    model: nn.Module
    tokenizer: Any
    config: ExperimentConfig
    payload: dict[str, Any]


def load_model(path: str | Path, device: str | torch.device = "cpu",
               task: str | tuple[str, ...] | None = None) -> LoadedCheckpoint:
    """Rebuild the model of a checkpoint (eval mode) with its tokenizer and experiment config.

    `task`: the task (or tasks) the caller can use ("translation", "classification", "code"; the message
    counts code generation as translation where both are wanted); a checkpoint of another task is a
    CheckpointError naming the command that uses it, before any weights are built.
    """
    payload = load_checkpoint(path)
    config = ExperimentConfig.from_dict(payload["config"])
    wanted = (task,) if isinstance(task, str) else task
    if wanted is not None and config.task not in wanted:
        hint = f"; use `{TASKS[config.task].command}`" if config.task in TASKS else ""
        named = [kind for kind in wanted if not (kind == "code" and "translation" in wanted)]
        raise CheckpointError(f"{path} is a {config.task} model, not a {' or '.join(named)} model{hint}")
    with torch.random.fork_rng(devices=[]):  # the initial weights, overwritten next, leave the caller's RNG alone
        model = build_task_model(config)
    load_state_strict(model, payload["model"], str(path))
    model.to(device).eval()
    tokenizer = tokenizer_from_state(payload["tokenizer"]) if payload.get("tokenizer") else None
    return LoadedCheckpoint(model, tokenizer, config, payload)
