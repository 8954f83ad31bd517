"""Devices and autocast precision: one strict resolution for every command, the trainer and the translator."""

from __future__ import annotations

from pathlib import Path

import torch

from multibranch.config import ConfigError


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; ConfigError for a device this machine cannot use."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device {name!r} is not a device (use cpu, cuda, cuda:N or auto)") from None
    if device.type == "cuda":
        if torch.version.cuda is None:
            raise ConfigError(f"--device {name}: this PyTorch build ({torch.__version__}) has no CUDA support; "
                              "use --device cpu or install a CUDA build of PyTorch")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            raise ConfigError(f"--device {name}: no such CUDA device ({count} visible); use --device cpu")
    return device


def native_cpu_bf16() -> bool:
    """True on CPUs that compute bf16 natively (AVX512-BF16 or AMX), where bf16 autocast pays off."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_amp(amp: str, device: torch.device) -> str:
    """The autocast precision for `amp` on `device`: "none", "bf16" or "fp16"."""
    if amp != "auto":
        return amp
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if device.type == "cpu" and native_cpu_bf16() else "none"
