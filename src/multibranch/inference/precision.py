"""Numeric precision of decoding: `fp32`, `int8`, `bf16` or `fp16`; on the CPU each decodes with a packed copy.

On the CPU, `for_decoding` returns a copy of the model (eval mode) whose projections that dominate a
decoder step (attention Q/K/V and output projections, the FFN, the output layer) are packed once
(`modules/packed_linear.py`):

- fp32: the weights reordered for oneDNN: fp32 arithmetic, as trained, up to summation order;
- int8: int8 weights with a scale per output row, inputs quantized per call, fbgemm's kernels and oneDNN's for
  the output layer; inputs take 7 bits, or 8 in oneDNN's where the CPU sums int8 products in 32 bits
  (`device.native_cpu_int8`). Inputs are quantized over a whole call's tensor (PyTorch's dynamic
  quantization), so in int8 a sentence's translation may depend on the sentences batched with it;
- bf16: bf16 weights and inputs with fp32 sums and outputs, only where the CPU runs bf16 natively
  (AVX512-BF16/AMX; elsewhere oneDNN emulates bf16, slower than fp32).

Normalisation, softmax, the attention itself and the layer kinds' own extras (MUSE's convolution,
Weighted's branch mixing, MUTE's unit attention) stay fp32; modules with a `fused` flag (attention, post-norm
residuals) use the CPU kernels of `cpu_kernels.py` for them. The caller's model is left untouched
(training, analysis keep using it). Off the CPU (or without oneDNN), fp32 is the model itself.

On CUDA, `bf16` and `fp16` decode with the model's weights cast to that type (what a Hugging Face user gets
from `torch_dtype=torch.bfloat16`): every matmul and the attention run in half precision on tensor cores,
while the search's log-softmax and scores stay fp32 (`beam.normalized_log_probs`). `int8` runs on the CPU
only and `fp16` on CUDA only (the CPU has no fast fp16 matmul).
"""

from __future__ import annotations

import copy
from typing import Literal

import torch

from multibranch import cpu_kernels
from multibranch.config import ConfigError
from multibranch.modules.packed_linear import bf16_supported, int8_supported, onednn_supported

Precision = Literal["fp32", "int8", "bf16", "fp16"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "int8", "bf16", "fp16")
HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: torch.device) -> None:
    """ConfigError when `precision` is unknown or cannot run on `device` (before any loading)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return
    if device.type == "cuda":
        if precision == "int8":
            raise ConfigError(f"--precision int8 runs on the CPU only (device is {device}); on CUDA use bf16 or "
                              "fp16")
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            raise ConfigError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16 support; use "
                              "fp16")
        return
    if device.type != "cpu":
        raise ConfigError(f"--precision {precision} runs on the CPU or CUDA only (device is {device}); use "
                          "--precision fp32")
    if precision == "fp16":
        raise ConfigError("--precision fp16 runs on CUDA only (the CPU has no fast fp16 matmul); on the CPU use "
                          "bf16 or int8")
    if precision == "int8" and not int8_supported():
        raise ConfigError("--precision int8 needs PyTorch's fbgemm kernels, which this build/CPU lacks "
                          f"(quantized engines: {', '.join(torch.backends.quantized.supported_engines)})")
    if precision == "bf16" and not bf16_supported():
        raise ConfigError("--precision bf16 needs a CPU with native bf16 matmuls (AVX512-BF16 or AMX) and "
                          "PyTorch's oneDNN; this one would emulate them, slower than fp32: use fp32 or int8")


def for_decoding(model: torch.nn.Module, precision: str = "fp32", *, in_place: bool = False) -> torch.nn.Module:
    """The model to decode with: a packed copy (eval mode) on the CPU, a half-precision copy for bf16/fp16 on
    CUDA, the model itself for fp32 elsewhere.

    `in_place`: pack (or cast) `model` itself instead of a copy (for a caller that loaded it only to decode:
    one copy of the weights fewer). On the CPU its training-mode forward still uses its own weights."""
    device = next(model.parameters()).device
    check_precision(precision, device)
    if device.type == "cuda" and precision in HALF_DTYPES:
        return cast_for_decoding(model, HALF_DTYPES[precision], in_place=in_place)
    if precision == "fp32" and (device.type != "cpu" or not onednn_supported()):
        return model
    packed = (model if in_place else copy.deepcopy(model)).eval()
    for module in packed.modules():
        pack = getattr(module, "pack_linears", None)
        if pack is not None:
            pack(precision)
        if hasattr(module, "fused"):  # modules with a CPU-kernel path (cpu_kernels.py) take it
            module.fused = True
    cpu_kernels.kernels()  # built (first time on a machine) or loaded now, not inside the first timed decode
    return packed


def cast_for_decoding(model: torch.nn.Module, dtype: torch.dtype, *, in_place: bool = False) -> torch.nn.Module:
    """The model (eval mode) with its parameters and buffers cast to `dtype` (bf16/fp16 decoding on CUDA;
    any device runs it, which is how the CPU tests check it)."""
    return (model if in_place else copy.deepcopy(model)).eval().to(dtype)
