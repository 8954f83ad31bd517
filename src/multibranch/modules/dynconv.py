"""Dynamic depthwise convolution with several gated kernel sizes (MUSE eq. 5-7,
docs/papers.md#muse-kernel-prediction).

For the conv input V [B, L, d] (in MUSE: the attention's value projection), channels split into H
contiguous groups of R = d / H channels; every group shares one kernel per position and kernel size:

    logits_k = V W_k                 W_k [d, H*K], no bias, Xavier          -> [B, L, H, K]
    w_k      = DropConnect(softmax_K(logits_k))   (rate p, kept taps * 1/(1-p))
    C_k[b, t, c] = sum_{j=0}^{K-1} w_k[b, t, h(c), j] * V[b, t + j - P_k, c]   (zero outside 0..L-1)
    C = sum_k softmax(g)_k C_k        (kernel_mix="gate", g init 1/|K|)
      or [C_1 ; ... ; C_|K|]          (kernel_mix="concat", the reference without gate)

P_k = floor(K/2) (centred, encoder) or K-1 (causal, decoder: window t-K+1 .. t). Odd K only.

All kernel sizes are first aligned into one Kmax-tap kernel per output (gate mixing is linear, so
mixing kernels == mixing outputs); one contraction then serves every size. Three contractions:
- band:        [L, L] banded matrices, one batched matmul (short sequences);
- unfold:      windows of the zero-padded input, contracted tap by tap (long sequences);
- incremental: the same windows over a rolling buffer of the last Kmax-1 inputs kept in the
               decoder state (zeros before the sequence start == training-time zero padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multibranch.hooks import ParamGroupSpec
from multibranch.modules.dropout import dropout
from multibranch.modules.init import init_blocks
from multibranch.modules.state import StateView

KernelMix = Literal["gate", "concat"]
ConvPath = Literal["auto", "band", "unfold"]


def check_kernel_sizes(sizes: Sequence[int], where: str = "kernel_sizes") -> None:
    """Raise ValueError unless `sizes` is a non-empty list of distinct odd positive integers."""
    if not sizes:
        raise ValueError(f"{where} must list at least one kernel size")
    for k in sizes:
        if not isinstance(k, int) or k < 1 or k % 2 == 0:
            raise ValueError(f"{where}: kernel size {k!r} must be an odd positive integer (even kernels are unsupported)")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"{where}: kernel sizes {list(sizes)} contain duplicates")


def band_matrix(w: Tensor, left: int) -> Tensor:
    """Banded matrices from per-position kernels: w [..., L, K] -> [..., L, L] with
    out[..., t, s] = w[..., t, s - t + left] where 0 <= s - t + left < K, else 0."""
    *lead, L, K = w.shape
    skew = F.pad(w, (0, L))  # [..., L, K + L]
    skew = skew.flatten(-2)[..., : L * (L + K - 1)]  # row t now starts t positions further right
    skew = skew.view(*lead, L, L + K - 1)  # [..., L, L+K-1]: w[t, j] sits at column t + j
    return skew[..., left : left + L]  # [..., L, L]


class DynamicConv(nn.Module):
    """Gated multi-kernel dynamic depthwise convolution, no input/output projection, no bias.

    Args:
        d_model: channels d of the input and of each kernel's output.
        heads: kernel-sharing channel groups H (MUSE: the attention head count).
        kernel_sizes: odd kernel sizes K.
        causal: decoder convolution (window t-K+1 .. t) instead of centred.
        weight_dropout: DropConnect rate p on the normalised kernels.
        kernel_mix: "gate" (softmax(g)-weighted sum) or "concat" (outputs side by side).
        mask_padding: zero padded positions of V before convolving (encoder; docs/papers.md#muse-padding-in-the-encoder-convolution).
        band_max_len: use the band-matrix contraction up to this length, the unfold one beyond.
        kernel_init: "xavier" (the spec) or "torch" (nn.Linear's default, which the reference's
            reset_parameters() actually leaves in place).
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        kernel_sizes: Sequence[int],
        causal: bool,
        weight_dropout: float = 0.1,
        kernel_mix: KernelMix = "gate",
        mask_padding: bool = True,
        band_max_len: int = 512,
        kernel_init: Literal["xavier", "torch"] = "xavier",
    ):
        super().__init__()
        check_kernel_sizes(kernel_sizes)
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        self.d_model, self.heads, self.group = d_model, heads, d_model // heads
        self.kernel_sizes = list(kernel_sizes)
        self.max_kernel = max(self.kernel_sizes)
        self.causal = causal
        self.weight_dropout = weight_dropout
        self.kernel_mix = kernel_mix
        self.outputs = 1 if kernel_mix == "gate" else len(self.kernel_sizes)  # n: outputs of width d
        self.mask_padding = mask_padding
        self.band_max_len = band_max_len
        self.kernel_init = kernel_init
        # rows: kernel blocks in `kernel_sizes` order, each [H*K] head-major
        self.kernel_proj = nn.Linear(d_model, heads * sum(self.kernel_sizes), bias=False)
        gated = kernel_mix == "gate" and len(self.kernel_sizes) > 1
        self.gate = nn.Parameter(torch.empty(len(self.kernel_sizes))) if gated else None
        self.reset_parameters()

    def reset_parameters(self, scheme: str | None = None) -> None:
        """Kernel predictor: one Xavier block per kernel size (fans d, H*K) or nn.Linear's default;
        gate 1/|K|. The model-wide `scheme` does not apply (docs/papers.md#muse-initialisation: the predictor is Xavier under both)."""
        with torch.no_grad():
            init_blocks(self.kernel_proj.weight, [self.heads * k for k in self.kernel_sizes], 0, self.kernel_init)
            if self.gate is not None:
                self.gate.fill_(1.0 / len(self.kernel_sizes))

    # ---- kernels ---------------------------------------------------------------------------------

    def gate_weights(self) -> Tensor:
        """softmax(g) over the kernel sizes, [|K|] (all ones for a single kernel or concat)."""
        if self.gate is None:
            return self.kernel_proj.weight.new_ones(len(self.kernel_sizes))
        return torch.softmax(self.gate, dim=0)

    def normalized_kernels(self, v: Tensor) -> list[Tensor]:
        """softmax-normalised kernels before weight dropout: one [B, L, H, K] per kernel size."""
        B, L, _ = v.shape
        logits = F.linear(v, self.kernel_proj.weight)  # [B, L, H*sum(K)]
        blocks = logits.split([self.heads * k for k in self.kernel_sizes], dim=-1)
        dtype = torch.promote_types(v.dtype, torch.float32)  # fp16/bf16 inputs: softmax in fp32
        return [
            torch.softmax(b.view(B, L, self.heads, k), dim=-1, dtype=dtype).to(v.dtype)
            for b, k in zip(blocks, self.kernel_sizes, strict=True)
        ]

    def mixed_kernels(self, v: Tensor) -> Tensor:
        """Dropped, gated kernels aligned to Kmax taps: [B, L, n, H, Kmax] (n = 1 for the gate).

        Tap j of kernel K (offset j - P_K) lands on tap j + (Kmax-K) (causal) or j + (Kmax-K)/2."""
        gate = self.gate_weights()
        aligned = []
        for i, (w, k) in enumerate(zip(self.normalized_kernels(v), self.kernel_sizes, strict=True)):
            if self.weight_dropout > 0:
                w = dropout(w, self.weight_dropout, self.training)
            left = self.max_kernel - k if self.causal else (self.max_kernel - k) // 2
            w = F.pad(w, (left, self.max_kernel - k - left))  # [B, L, H, Kmax]
            aligned.append(w * gate[i] if self.gate is not None else w)
        if self.kernel_mix == "gate":
            return sum(aligned[1:], aligned[0]).unsqueeze(2)  # [B, L, 1, H, Kmax]
        return torch.stack(aligned, dim=2)  # [B, L, |K|, H, Kmax]

    # ---- the module ------------------------------------------------------------------------------

    def forward(
        self,
        v: Tensor,
        padding_mask: Tensor | None = None,
        cache: StateView | None = None,
        path: ConvPath = "auto",
    ) -> Tensor:
        """v [B, L, d] -> [B, L, n*d] (n = 1 with the gate, |K| with concat).

        padding_mask [B, L] (True at padding) zeroes padded inputs when `mask_padding`. With `cache`
        (causal only) v holds the new positions and the rolling window supplies the earlier ones.
        """
        if self.mask_padding and padding_mask is not None:
            v = v.masked_fill(padding_mask[..., None], 0.0)
        w = self.mixed_kernels(v)  # [B, L, n, H, Kmax]
        if cache is not None:
            return self._incremental(v, w, cache)
        if path == "band" or (path == "auto" and v.shape[1] <= self.band_max_len):
            return self._band(v, w)
        left = self.max_kernel - 1 if self.causal else self.max_kernel // 2
        padded = F.pad(v, (0, 0, left, self.max_kernel - 1 - left))  # [B, L+Kmax-1, d]
        return self._unfold(padded, w)

    def _band(self, v: Tensor, w: Tensor) -> Tensor:
        """Band-matrix contraction: one batched [L, L] @ [L, R] per (sample, output, head)."""
        B, L, n, H, K = w.shape
        left = K - 1 if self.causal else K // 2
        band = band_matrix(w.permute(0, 2, 3, 1, 4), left)  # [B, n, H, L, L]
        heads = v.view(B, L, H, self.group).transpose(1, 2).unsqueeze(1)  # [B, 1, H, L, R]
        out = torch.matmul(band, heads)  # [B, n, H, L, R]
        return out.permute(0, 3, 1, 2, 4).reshape(B, L, n * self.d_model)

    def _unfold(self, padded: Tensor, w: Tensor) -> Tensor:
        """Window contraction over an input already extended by Kmax-1 positions: padded
        [B, L+Kmax-1, d], w [B, L, n, H, Kmax] -> [B, L, n*d].

        out[t] = sum_j w[t, j] * padded[t + j]: the [B, L, d, Kmax] unfold windows contracted tap by
        tap over shifted slices, never materialised (2-4x faster than unfold + matmul on CPU,
        forward and backward, and O(B L d) memory)."""
        B, L, n, H, K = w.shape
        out = None
        for j in range(K):
            tap = padded[:, j : j + L].view(B, L, 1, H, self.group) * w[..., j, None]  # [B, L, n, H, R]
            out = tap if out is None else out + tap
        return out.reshape(B, L, n * self.d_model)

    def _incremental(self, v: Tensor, w: Tensor, cache: StateView) -> Tensor:
        """Causal steps with a rolling window [B, Kmax-1, d] of the previous inputs."""
        if not self.causal:
            raise ValueError("incremental decoding needs a causal convolution")
        window = cache.get("window")
        if window is None:  # positions before the sequence start are zeros
            window = v.new_zeros(v.shape[0], self.max_kernel - 1, self.d_model)
        extended = torch.cat([window, v], dim=1)  # [B, Kmax-1+L, d]
        cache.set("window", extended[:, v.shape[1] :])
        return self._unfold(extended, w)

    # ---- trainer hooks ---------------------------------------------------------------------------

    def training_metrics(self) -> dict[str, float]:
        """The kernel gate softmax(g) per kernel size (for the gate-ratio analysis, docs/papers.md#muse-length-buckets-and-gate-ratios)."""
        if self.gate is None:
            return {}
        probs = torch.softmax(self.gate.detach().float(), dim=0).tolist()
        return {f"gate.k{k}": p for k, p in zip(self.kernel_sizes, probs, strict=True)}

    def parameter_groups(self) -> list[ParamGroupSpec]:
        """Kernel gates are excluded from weight decay (docs/papers.md#muse-kernel-gate)."""
        if self.gate is None:
            return []
        return [ParamGroupSpec("kernel_gates", [self.gate], weight_decay=0.0)]

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, heads={self.heads}, kernel_sizes={self.kernel_sizes}, causal={self.causal}, "
            f"weight_dropout={self.weight_dropout}, kernel_mix={self.kernel_mix}, mask_padding={self.mask_padding}"
        )
