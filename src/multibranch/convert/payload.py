"""Helpers shared by every checkpoint conversion: reading, validating and re-packing payloads.

A payload is the dict stored in a checkpoint file (see `multibranch.checkpoint.format`): `config`
(ExperimentConfig dict), `model` (state dict), `tokenizer`, `meta`, optional `training`. Every
conversion produces a *weights-only* payload: training state (optimizer, schedules, RNG, data
position) never survives a conversion.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from multibranch.checkpoint.format import CheckpointError, state_mismatch
from multibranch.config import to_dict
from multibranch.experiment import ExperimentConfig
from multibranch.tasks import build_task_model

if TYPE_CHECKING:
    from multibranch.experiment import ExperimentConfig

# meta keys that describe the training run's progress; they stop being true after surgery
RUN_META_KEYS = ("valid", "config_hash")


def experiment_config(payload: dict[str, Any]) -> ExperimentConfig:
    """The payload's config, validated (unknown keys or bad values raise ConfigError)."""

    return ExperimentConfig.from_dict(payload["config"])


def weights_only(
    payload: dict[str, Any], config: dict[str, Any], state: dict[str, Tensor], meta: dict[str, Any]
) -> dict[str, Any]:
    """A new payload: given config/state/meta, the source's tokenizer, no training state."""
    out = {"config": config, "model": state, "tokenizer": payload.get("tokenizer"), "meta": meta}
    return out


def describe_source(payload: dict[str, Any], source: str | None) -> dict[str, Any]:
    """What meta records about the checkpoint a conversion started from."""
    meta = payload.get("meta") or {}
    return {
        "path": source,
        "step": meta.get("step"),
        "epoch": meta.get("epoch"),
        "valid": meta.get("valid"),
        "config_hash": meta.get("config_hash"),
    }


def check_state(config: ExperimentConfig, state: dict[str, Tensor], source: str) -> None:
    """Raise CheckpointError unless `state` has exactly the keys and shapes of the model (of its task)
    built from `config`. The reference model is built on the meta device, so this costs no memory."""

    with torch.device("meta"):
        reference = build_task_model(config).state_dict()
    problems = state_mismatch(reference, state)
    if problems:
        raise CheckpointError("\n".join([f"{source}: converted weights do not fit the converted config", *problems]))


def imported_payload(config: ExperimentConfig, state: dict[str, Tensor], tokenizer: Any, kind: str,
                     source: str | Path, summary: str, **details: Any) -> dict[str, Any]:
    """The checkpoint payload of a model imported from another toolkit: step 0, and `meta.conversion`
    saying what it came from (`details` add to it; the installed transformers version is recorded)."""
    import transformers


    conversion = {"kind": kind, "source": str(source), "summary": summary, **details,
                  "transformers_version": transformers.__version__}
    return {"config": to_dict(config), "model": state, "tokenizer": tokenizer,
            "meta": {"step": 0, "epoch": 0, "conversion": conversion}}


def refuse_overwrite(path: str | Path, force: bool) -> None:
    """FileExistsError (a one-line user error in the CLI) unless `force`."""
    if Path(path).exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force to overwrite it")


def token_strings(model: Any, tok: Any, where: str) -> tuple[list[str], list[str]]:
    """The token strings of our source and target ids for an exported vocabulary: SentencePiece pieces, then
    (ids beyond SentencePiece, e.g. of imported models) unique placeholder names that no tokenizer produces.
    `model` is a ModelConfig, `tok` a Tokenizer; CheckpointError when an embedding is smaller than its model."""

    def side(processor: Any, size: int, name: str) -> list[str]:
        pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
        if size < len(pieces):
            raise CheckpointError(f"{where}: the {name} embedding has {size} rows but its SentencePiece model "
                                  f"{len(pieces)} pieces")
        return pieces + [f"<multibranch_extra_{i}>" for i in range(len(pieces), size)]

    return side(tok.src, model.src_vocab_size, "source"), side(tok.tgt, model.tgt_vocab_size, "target")
