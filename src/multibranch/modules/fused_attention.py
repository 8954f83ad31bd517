"""Fused CPU attention for a decoder step (`csrc/decoder_attention.cpp`, built by `cpu_kernels`).

A beam-search step asks one new query per hypothesis. Composed from PyTorch operations, its self-attention
copies every layer's growing K/V cache once a step (the beam reorder, `DecoderState.append`) before
`scaled_dot_product_attention` sets up one small problem per (row, head). The kernels here do that step's
attention in one call each:

- `history_attention`: each row's query over the keys/values of its own history, read in place: step s's
  projections stay where step s wrote them, and row r reads step s at row `ancestors[r, s]`
  (`DecoderState.extend_history`), so a reorder moves a [rows, steps] index table instead of the caches;
- `memory_attention`: cross-attention with g consecutive query rows (a sentence's hypotheses) sharing one
  memory row, padded positions skipped (no mask tensor, no grouping transposes).

Both take rows of all heads side by side ([rows, heads * head_dim], as the projections write them) and
return a new [rows, heads * head_dim] tensor, ready for the output projection. fp32 on the CPU only; the
results equal SDPA's up to summation order (tests/modules/test_fused_attention.py). Where the kernels are
not built (`cpu_kernels.kernels()` None), `cpu_kernels.usable` is False and attention composes PyTorch
operations.
"""

from __future__ import annotations

import torch
from torch import Tensor

from multibranch import cpu_kernels


def history_attention(q: Tensor, keys: list[Tensor], values: list[Tensor], ancestors: Tensor, heads: int) -> Tensor:
    """q [R, H*d] (the step's queries); keys[s], values[s] [R_s, H*d] (step s's projections, rows as
    written then); ancestors [R, L] int64 (row r's row at step s; L = len(keys)) -> [R, H*d]."""
    width = q.shape[1]
    return cpu_kernels.kernels().history_attention(q, keys, values, ancestors, heads, (width // heads) ** -0.5)


def memory_attention(q: Tensor, keys: Tensor, values: Tensor, padding: Tensor | None, heads: int) -> Tensor:
    """q [R, H*d]; keys, values [b, S, H*d] (R = b * g: g consecutive rows share memory row r // g);
    padding [b, S] bool, True at padding (or None) -> [R, H*d]."""
    width = q.shape[1]
    mask = padding.contiguous() if padding is not None else torch.empty(0, dtype=torch.bool)
    return cpu_kernels.kernels().memory_attention(q, keys, values, mask, heads, (width // heads) ** -0.5)
