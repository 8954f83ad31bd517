"""Position information: absolute (sinusoidal, learned) and relative (Shaw et al., 2018)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(num_positions: int, dim: int) -> Tensor:
    """[num_positions, dim]: sin in the first half of the channels, cos in the second (Marian/fairseq layout).

    Channel j of each half uses frequency 10000^(-2j / dim), as HF Marian does, so imported
    checkpoints match exactly (fairseq uses 10000^(-j / (half - 1)); only consistency matters).
    """
    half = dim // 2
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]  # [P, 1]
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) * 2 / dim)  # [half]
    angles = position * freq[None, :]  # [P, half]
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, :half] = torch.sin(angles)
    table[:, half : 2 * half] = torch.cos(angles)
    return table.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal absolute positions; positions start at 0 and grow on demand."""

    def __init__(self, dim: int, max_positions: int = 1024):
        super().__init__()
        self.dim = dim
        self.register_buffer("table", sinusoidal_table(max_positions, dim), persistent=False)

    def forward(self, length: int, offset: int | Tensor = 0) -> Tensor:
        """[length, dim] encodings of positions offset .. offset+length-1. A tensor `offset` (0-d, on the
        device: a static decoding step) reads the table without a host read; `reserve` the positions first."""
        if isinstance(offset, Tensor):
            return self.table.index_select(0, offset + torch.arange(length, device=self.table.device))
        self.reserve(offset + length)
        return self.table[offset : offset + length]

    def reserve(self, positions: int) -> None:
        """Make the table hold at least `positions` positions."""
        if positions > self.table.shape[0]:
            self.table = sinusoidal_table(max(positions, 2 * self.table.shape[0]), self.dim).to(self.table.device)


class LearnedPositions(nn.Module):
    """Learned absolute positions, at most `max_positions`."""

    def __init__(self, dim: int, max_positions: int = 1024):
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, dim))
        nn.init.normal_(self.weight, std=dim**-0.5)

    def forward(self, length: int, offset: int | Tensor = 0) -> Tensor:
        if isinstance(offset, Tensor):  # a static decoding step: the search keeps it below max_positions
            return self.weight.index_select(0, offset + torch.arange(length, device=self.weight.device))
        end = offset + length
        if end > self.max_positions:
            raise ValueError(
                f"sequence position {end} exceeds model.max_positions={self.max_positions} (learned positions)"
            )
        return self.weight[offset:end]


class RelativePositions(nn.Module):
    """Shaw et al. relative-position tables for one attention module (shared by its heads).

    Distances j - i are clipped to [-k, k]. `keys` enter the attention logits as q_i . a^K_{ij};
    `values` add sum_j p_ij a^V_{ij} to the output. `share_kv` uses one table for both (MUTE's code).
    """

    def __init__(self, max_distance: int, head_dim: int, share_kv: bool = False):
        super().__init__()
        self.max_distance = max_distance
        size = 2 * max_distance + 1
        self.key_table = nn.Parameter(torch.empty(size, head_dim))
        self.value_table = None if share_kv else nn.Parameter(torch.empty(size, head_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for table in (self.key_table, self.value_table):
            if table is not None:
                nn.init.xavier_uniform_(table)

    @property
    def values(self) -> Tensor:
        return self.key_table if self.value_table is None else self.value_table

    def bucket_index(self, query_len: int, key_len: int, query_offset: int | Tensor, device: torch.device) -> Tensor:
        """[L, S] table row of each (query, key) pair: clip(j - i, -k, k) + k."""
        q_pos = (torch.arange(query_len, device=device) + query_offset)[:, None]  # query_offset: int or 0-d tensor
        k_pos = torch.arange(key_len, device=device)[None, :]
        return (k_pos - q_pos).clamp(-self.max_distance, self.max_distance) + self.max_distance
