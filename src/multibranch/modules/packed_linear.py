"""Linear layers packed once for decoding: the eval projections of a decoding copy of a model.

`pack_linear(weight, bias, kind)` returns a callable computing x W^T + b like `F.linear`, with the
weight prepared once for one kernel:

- `"int8"`: W stored as int8 (symmetric, one scale per output row, `int8_rows`), x quantized per tensor
  from its own range on every call, int32 sums scaled back to fp32. Two kernels, picked by the width of the
  projection (`ONEDNN_INT8_MIN_OUT`):
  `Int8Linear`, fbgemm's dynamic quantization (PyTorch's `quantize_dynamic` of `nn.Linear`, applied to the
  fused projections our modules compute with `F.linear`, which `quantize_dynamic` cannot see), with 7-bit
  inputs; and for wide projections (the vocabulary's output layer) `OneDnnInt8Linear`, oneDNN's int8 GEMM on
  8-bit inputs where the CPU sums u8 x s8 products in 32 bits (AVX512-VNNI, AMX) and on 7-bit inputs elsewhere
  (`device.native_cpu_int8`: on AVX2 the products are added in pairs into 16 bits with saturation, which 8-bit
  inputs overflow). Timed call by call in the same beam search (1 thread, AMD EPYC; docs/benchmarks.md), oneDNN
  took 0.84x fbgemm's time on the 8000x256 output layer, while on the 256..1024-wide projections of a layer
  fbgemm's call, which quantizes the input inside, was faster (oneDNN needs a separate quantize call, ~40 us).
- `"fp32"` (`OneDnnLinear`): W reordered once into oneDNN's blocked layout (the prepacking PyTorch's
  own CPU compiler does, `torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise`). The same
  fp32 arithmetic as `F.linear` up to summation order (which dispatches to MKL's sgemm; on AMD CPUs
  MKL takes a slower code path): docs/benchmarks.md has the measured ratio.
- `"bf16"` (`OneDnnLinear` with bf16 weights): x is rounded to bf16 per call, products are summed in
  fp32 by oneDNN's AVX512-BF16/AMX kernels, and the output is returned as fp32. Only offered where the
  CPU has native bf16 (`bf16_supported`); elsewhere oneDNN would emulate it, slower than fp32.

The modules that own such projections (attention, FFN, the output layer) build them in
`pack_linears(kind)`, on a copy made for decoding (`inference/precision.py`), and use them in eval mode
only; training and the caller's model never touch them. A packed projection may fuse a ReLU
(`relu=True`): oneDNN applies it as a post-op in the same pass.
"""

from __future__ import annotations

import warnings
from typing import Literal, Protocol

import torch
from torch import Tensor

from multibranch.device import native_cpu_int8

PackKind = Literal["fp32", "int8", "bf16"]


class PackedLinear(Protocol):
    in_features: int
    out_features: int

    def __call__(self, x: Tensor) -> Tensor:
        """x [..., in] (float32) -> [..., out] float32."""
        ...


def int8_supported() -> bool:
    """Whether this PyTorch build has the fbgemm kernels the int8 linear needs (x86 CPUs)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def onednn_supported() -> bool:
    """Whether this PyTorch build can prepack linear weights for oneDNN (CPU builds with mkldnn)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def bf16_supported() -> bool:
    """Whether oneDNN runs bf16 matmuls natively on this CPU (AVX512-BF16 or AMX), not emulated."""
    return onednn_supported() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


ONEDNN_INT8_MIN_OUT = 4096  # int8 projections with at least this many outputs use oneDNN (see the module docstring)


def onednn_int8_supported() -> bool:
    """Whether this PyTorch build has oneDNN's int8 linear (`torch.ops.onednn.qlinear_pointwise`)."""
    return onednn_supported() and hasattr(torch.ops.onednn, "qlinear_prepack")


def int8_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [out, in] float -> (int8 [out, in], scale [out] float32): symmetric, one scale per output row,
    scale = max|W_row| / 127, so that W ~= int8 * scale[:, None] (the quantization CTranslate2 uses too)."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12)  # [out]
    return torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


class Int8Linear:
    """y = x W^T + b with int8 weights (per output row scale) and dynamically quantized 7-bit inputs (fbgemm).

    weight [out, in], bias [out] or None, both float; called on x [..., in] (float32) -> [..., out].
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None, relu: bool = False):
        qint, scale = int8_rows(weight)
        zero = torch.zeros(weight.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # the quantized-tensor constructors warn that they are deprecated
            warnings.simplefilter("ignore")
            qweight = torch._make_per_channel_quantized_tensor(qint, scale.double(), zero, 0)
            self._packed = torch.ops.quantized.linear_prepack(
                qweight, None if bias is None else bias.detach().float().contiguous())
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.relu = relu

    def int8_weight(self) -> tuple[Tensor, Tensor]:
        """(int8 weight [out, in], scale [out]) as packed."""
        qweight, _ = torch.ops.quantized.linear_unpack(self._packed)
        return qweight.int_repr(), qweight.q_per_channel_scales().float()

    def __call__(self, x: Tensor) -> Tensor:
        # reduce_range: 7-bit activations, as quantize_dynamic uses with fbgemm (its AVX2 kernels
        # saturate int16 intermediate sums with full 8-bit ranges)
        out = torch.ops.quantized.linear_dynamic(x.float().contiguous(), self._packed, True)
        return torch.relu_(out) if self.relu else out

    def __repr__(self) -> str:
        return f"Int8Linear(in_features={self.in_features}, out_features={self.out_features}, relu={self.relu})"


class OneDnnInt8Linear:
    """y = x W^T + b (optionally ReLU'd) with int8 weights (per output row scale) prepacked for oneDNN, inputs
    quantized per call to `input_levels` + 1 unsigned values (affine over their range including 0): 8 bits where
    the CPU sums u8 x s8 products in 32 bits, 7 bits elsewhere (`device.native_cpu_int8`); int32 sums scaled to
    fp32.

    weight [out, in], bias [out] or None, both float; called on x [..., in] (float32) -> [..., out].
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None, relu: bool = False):
        self._qweight, self._scale = int8_rows(weight)
        self._packed = torch.ops.onednn.qlinear_prepack(self._qweight, None)
        self._zero = torch.zeros(weight.shape[0], dtype=torch.long)
        self._bias = None if bias is None else bias.detach().float().contiguous()
        self._post_op = "relu" if relu else "none"
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self._reduce_range = not native_cpu_int8()
        self.input_levels = 127 if self._reduce_range else 255  # steps of the inputs' quantization grid

    def int8_weight(self) -> tuple[Tensor, Tensor]:
        """(int8 weight [out, in], scale [out]) as packed."""
        return self._qweight, self._scale

    def __call__(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()  # [N, in]
        if rows.shape[0] == 0:
            return x.new_zeros(*x.shape[:-1], self.out_features, dtype=torch.float32)
        with warnings.catch_warnings():  # quantized tensors warn that they are deprecated
            warnings.simplefilter("ignore")
            q = torch.quantize_per_tensor_dynamic(rows, torch.quint8, self._reduce_range)
        out = torch.ops.onednn.qlinear_pointwise(q.int_repr(), q.q_scale(), q.q_zero_point(), self._packed,
                                                 self._scale, self._zero, self._bias, 1.0, 0, torch.float32,
                                                 self._post_op, [], "")  # [N, out]
        return out.view(*x.shape[:-1], self.out_features)

    def __repr__(self) -> str:
        return (f"OneDnnInt8Linear(in_features={self.in_features}, out_features={self.out_features}, "
                f"input_levels={self.input_levels}, post_op={self._post_op})")


class OneDnnLinear:
    """y = x W^T + b (optionally ReLU'd) with W prepacked for oneDNN, in fp32 or bf16 (`dtype`).

    weight [out, in], bias [out] or None; called on x [..., in] float32 -> [..., out] float32.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None, relu: bool = False,
                 dtype: torch.dtype = torch.float32):
        self.dtype = dtype
        weight = weight.detach().to(dtype).contiguous()
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self._bias = None if bias is None else bias.detach().to(dtype).contiguous()
        self._post_op = "relu" if relu else "none"
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def __call__(self, x: Tensor) -> Tensor:
        if self.dtype == torch.float32:  # no dtype conversions (each a dispatched no-op, ~40 per decoder step)
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self._bias, self._post_op, [], "")
        out = torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self._packed, self._bias, self._post_op, [], "")
        return out.float()

    def __repr__(self) -> str:
        return (f"OneDnnLinear(in_features={self.in_features}, out_features={self.out_features}, "
                f"dtype={self.dtype}, post_op={self._post_op})")


def pack_linear(weight: Tensor, bias: Tensor | None, kind: PackKind, relu: bool = False) -> PackedLinear:
    """The packed form of the projection (weight [out, in], bias [out] or None) for decoding in `kind`."""
    if kind == "int8":
        if weight.shape[0] >= ONEDNN_INT8_MIN_OUT and onednn_int8_supported():
            return OneDnnInt8Linear(weight, bias, relu)
        return Int8Linear(weight, bias, relu)
    if kind == "fp32":
        return OneDnnLinear(weight, bias, relu)
    if kind == "bf16":
        return OneDnnLinear(weight, bias, relu, dtype=torch.bfloat16)
    raise ValueError(f"unknown packing {kind!r} (expected fp32, int8 or bf16)")
