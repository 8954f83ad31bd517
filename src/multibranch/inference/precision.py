"""Numeric precision of decoding: `fp32` (the model as trained) or `int8` (CPU, dynamic quantization).

int8 quantizes, on a copy of the model, every projection that dominates a decoder step: attention
Q/K/V and output projections, the FFN and the output layer (`modules/int8.py`: int8 weights with a
scale per output row, inputs quantized per call, fbgemm kernels). Normalisation, softmax, the
attention itself and the layer kinds' own extras (MUSE's convolution, Weighted's branch mixing,
MUTE's unit attention) stay fp32. The caller's model is left untouched (training, analysis and
fp32 decoding keep using it). Inputs are quantized over a whole call's tensor (PyTorch's dynamic
quantization), so in int8 a sentence's translation may depend on the sentences batched with it.

bf16 is not offered: without AVX512-BF16/AMX a CPU emulates bf16 matmuls, slower than fp32.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch

from multibranch.config import ConfigError
from multibranch.modules.int8 import int8_supported

Precision = Literal["fp32", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "int8")


def check_precision(precision: str, device: torch.device) -> None:
    """ConfigError when `precision` is unknown or cannot run on `device` (before any loading)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "int8":
        if device.type != "cpu":
            raise ConfigError(f"--precision int8 runs on the CPU only (device is {device}); use --device cpu "
                              "or --precision fp32")
        if not int8_supported():
            raise ConfigError("--precision int8 needs PyTorch's fbgemm kernels, which this build/CPU lacks "
                              f"(quantized engines: {', '.join(torch.backends.quantized.supported_engines)})")


def for_decoding(model: torch.nn.Module, precision: str = "fp32") -> torch.nn.Module:
    """The model to decode with: `model` itself for fp32, an int8 copy (eval mode) for int8."""
    device = next(model.parameters()).device
    check_precision(precision, device)
    if precision == "fp32":
        return model
    quantized = copy.deepcopy(model).eval()
    for module in quantized.modules():
        quantize = getattr(module, "quantize_int8", None)
        if quantize is not None:
            quantize()
    return quantized
