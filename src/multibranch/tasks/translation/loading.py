"""A Translator from a checkpoint or a `convert export` directory; a Ct2Translator from a `convert ct2` directory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from multibranch.device import resolve_device
from multibranch.errors import CheckpointError, UserError
from multibranch.inference.precision import check_precision, for_decoding
from multibranch.tasks.loading import load_model
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
    return Translator(for_decoding(loaded.model, precision), loaded.tokenizer, cfg, device)
