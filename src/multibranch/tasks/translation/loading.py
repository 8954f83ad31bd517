"""A Translator from a checkpoint or a `convert export` directory; a Ct2Translator from a `convert ct2` directory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from multibranch.device import resolve_device
from multibranch.errors import CheckpointError, UserError
from multibranch.inference.ensemble import Ensemble
from multibranch.inference.precision import check_precision, for_decoding
from multibranch.tasks.loading import LoadedModel, load_model
from multibranch.tasks.translation.ct2 import Ct2Translator, is_ct2_directory
from multibranch.tasks.translation.translator import Translator


def load_translator(path: str | Path, device: str | torch.device = "cpu", precision: str = "fp32",
                    **overrides: Any) -> Translator | Ct2Translator:
    """Load a checkpoint; `overrides` replace fields of its decode config (e.g. beam=4);
    `precision` "int8" decodes with an int8 copy of the model (inference/precision.py). A `convert ct2`
    directory gives a Ct2Translator (same interface; its precision is the one it was converted with)."""
    device = resolve_device(device) if isinstance(device, str) else device
    if is_ct2_directory(path):
        if precision != "fp32":
            raise UserError(f"precision {precision!r}: {path} is a CTranslate2 directory, which decodes with the "
                            "quantization it was converted with (`multibranch convert ct2 --quantization int8`)")
        return Ct2Translator(path, device, **overrides)
    check_precision(precision, device)
    loaded = load_model(path, device, task="translation")
    if loaded.tokenizer is None:
        raise CheckpointError(f"{path} has no tokenizer, so it cannot translate raw text")
    cfg = replace(loaded.config.decode, **overrides)
    return Translator(for_decoding(loaded.model, precision, in_place=True), loaded.tokenizer, cfg, device)


def _same_state(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two checkpoint tokenizer entries hold the same tokenizer (equal keys and tensors)."""
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def load_ensemble(paths: list[str], device: str | torch.device = "cpu", task: str | tuple[str, ...] = "translation",
                  mean: str = "prob") -> LoadedModel:
    """Several checkpoints as one model (`inference.ensemble.Ensemble`; one path: that model itself),
    with the first one's tokenizer and config. Members must be of one task and share one tokenizer
    and vocabulary: CheckpointError naming the first member that does not."""
    members = [load_model(path, device, task=task) for path in paths]
    if len(members) == 1:
        return members[0]
    first = members[0]
    for path, member in zip(paths[1:], members[1:], strict=True):
        if member.config.task != first.config.task:
            raise CheckpointError(f"ensemble members must be of one task: {path} is a {member.config.task} model, "
                                  f"{paths[0]} a {first.config.task} model")
        if not _same_state(member.payload.get("tokenizer"), first.payload.get("tokenizer")):
            raise CheckpointError(f"ensemble members must share one vocabulary: {path} has a different tokenizer "
                                  f"than {paths[0]}")
    ensemble = Ensemble([m.model for m in members], mean=mean, names=[str(p) for p in paths])  # type: ignore[arg-type]
    return LoadedModel(ensemble, first.tokenizer, first.config, first.payload)
