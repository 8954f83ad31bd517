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
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name}: multibranch runs on cpu or cuda (cuda:N), not {device.type}")
    if device.type == "cuda":
        if torch.version.cuda is None:
            raise ConfigError(f"--device {name}: this PyTorch build ({torch.__version__}) has no CUDA support; "
                              "use --device cpu or install a CUDA build of PyTorch")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            raise ConfigError(f"--device {name}: no such CUDA device ({count} visible); use --device cpu")
    return device


def cpu_flags() -> frozenset[str]:
    """This CPU's instruction-set flags as Linux lists them (/proc/cpuinfo); empty where they cannot be read,
    so every capability below then reads as absent and the portable path is taken."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def native_cpu_bf16() -> bool:
    """True on CPUs that compute bf16 natively (AVX512-BF16 or AMX), where bf16 autocast pays off."""
    return not cpu_flags().isdisjoint({"avx512_bf16", "amx_bf16"})


def native_cpu_int8() -> bool:
    """True on CPUs whose int8 dot products sum u8 x s8 products in 32 bits (AVX512-VNNI's vpdpbusd, AMX-INT8),
    so that int8 kernels may take 8-bit unsigned inputs. Elsewhere (AVX2, AVX-512 without VNNI) they multiply
    with vpmaddubsw, which adds two adjacent products into 16 bits with saturation: 255 x 127 x 2 overflows, so
    inputs are quantized to 7 bits (127 x 127 x 2 < 2^15), as PyTorch's fbgemm does (`reduce_range`). AVX-VNNI
    (the 256-bit form) alone is not counted: oneDNN is not known to use it for these kernels."""
    return not cpu_flags().isdisjoint({"avx512_vnni", "amx_int8"})


def resolve_amp(amp: str, device: torch.device) -> str:
    """The autocast precision for `amp` on `device`: "none", "bf16" or "fp16"."""
    if amp != "auto":
        return amp
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if device.type == "cpu" and native_cpu_bf16() else "none"
