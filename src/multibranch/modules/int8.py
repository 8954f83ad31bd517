"""Int8 linear layers for CPU decoding: weights quantized once, activations per call (dynamic).

`Int8Linear(weight, bias)` computes x W^T + b like `F.linear`, with W stored as int8 (symmetric,
one scale per output row) and packed for fbgemm, and x quantized to 8 bits (per tensor, from its own
range) on every call: PyTorch's dynamic quantization of `nn.Linear` (`torch.ao.quantization.
quantize_dynamic`), applied to the fused projections our modules compute with `F.linear`, which
`quantize_dynamic` cannot see. The modules that own such projections (attention, FFN, the output
layer) build them in `quantize_int8()`, on a copy made for decoding (`inference/precision.py`), and
use them in eval mode only; training and the fp32 model never touch them.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor


def int8_supported() -> bool:
    """Whether this PyTorch build has the fbgemm kernels the int8 linear needs (x86 CPUs)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


class Int8Linear:
    """y = x W^T + b with int8 weights (per output row scale) and dynamically quantized inputs.

    weight [out, in], bias [out] or None, both float; called on x [..., in] (float32) -> [..., out].
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        weight = weight.detach().float().contiguous()
        scale = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12)  # [out]
        zero = torch.zeros(weight.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # the quantized-tensor constructors warn that they are deprecated
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scale.double(), zero, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(
                qweight, None if bias is None else bias.detach().float().contiguous())
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def __call__(self, x: Tensor) -> Tensor:
        # reduce_range: 7-bit activations, as quantize_dynamic uses with fbgemm (its AVX2 kernels
        # saturate int16 intermediate sums with full 8-bit ranges)
        return torch.ops.quantized.linear_dynamic(x.float().contiguous(), self._packed, True)

    def __repr__(self) -> str:
        return f"Int8Linear(in_features={self.in_features}, out_features={self.out_features})"
