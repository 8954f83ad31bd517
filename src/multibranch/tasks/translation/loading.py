"""A Translator from a checkpoint or an export directory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from multibranch.device import resolve_device
from multibranch.errors import CheckpointError
from multibranch.inference.precision import check_precision, for_decoding
from multibranch.tasks.loading import load_model
from multibranch.tasks.translation.translator import Translator


def load_translator(path: str | Path, device: str | torch.device = "cpu", precision: str = "fp32",
                    **overrides: Any) -> Translator:
    """Load a checkpoint; `overrides` replace fields of its decode config (e.g. beam=4);
    `precision` "int8" decodes with an int8 copy of the model (inference/precision.py)."""
    device = resolve_device(device) if isinstance(device, str) else device
    check_precision(precision, device)
    loaded = load_model(path, device, task="translation")
    if loaded.tokenizer is None:
        raise CheckpointError(f"{path} has no tokenizer, so it cannot translate raw text")
    cfg = replace(loaded.config.decode, **overrides)
    return Translator(for_decoding(loaded.model, precision), loaded.tokenizer, cfg, device)
