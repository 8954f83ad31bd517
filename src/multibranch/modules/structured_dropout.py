"""Structured dropout: drop whole parallel paths (branches, heads) and rescale the kept ones.

Both modules return a *scale* tensor (or None when they do nothing) that the owner multiplies into
the paths' outputs, so one fused computation serves every paper:

- `PathDropout` (MAT drop-branch, SEEDS-SPEC §1.2-1.4): path kept iff U >= rho, kept paths scaled by
  1/(1-rho); one mask per call shared by the batch (default) or one per sample. If every path drops,
  the sublayer output is zero and the residual passes through (by design).
- `DropHead` (Scheduled DropHead, §5.1): per-sample head mask xi ~ Bernoulli(1-p), kept heads scaled
  by H/#kept of that sample; a sample that loses every head is redrawn (at most `max_redraws` times,
  then keeps all heads).

Both are identity in eval mode. Their rate is a `ScheduledRate` that the trainer moves along through
`on_update_start`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from multibranch.schedules import RateConfig, ScheduledRate


class _ScheduledDropout(nn.Module):
    may_skip_parameters = True  # a dropped path's parameters get no gradient (see hooks.py)

    def __init__(self, paths: int, rate: RateConfig | float | None):
        super().__init__()
        self.paths = paths
        self.rate = ScheduledRate(rate)

    def on_update_start(self, step: int, warmup: int | None, total: int | None) -> None:
        self.rate.update(step, warmup, total)

    @property
    def p(self) -> float:
        return self.rate.value

    def extra_repr(self) -> str:
        return f"paths={self.paths}, rate={self.rate.config}"


class PathDropout(_ScheduledDropout):
    """MAT drop-branch over `paths` parallel paths; `per_sample=False` shares one mask per batch."""

    def __init__(self, paths: int, rate: RateConfig | float | None, per_sample: bool = False):
        super().__init__(paths, rate)
        self.per_sample = per_sample

    def forward(self, batch_size: int, device: torch.device) -> Tensor | None:
        """Return the path scale, [1 or B, paths] (0 or 1/(1-rho)), or None when inactive."""
        p = self.p
        if not self.training or p <= 0.0:
            return None
        rows = batch_size if self.per_sample else 1
        keep = torch.rand(rows, self.paths, device=device) >= p  # [rows, paths]
        return keep.float() / (1.0 - p)


class DropHead(_ScheduledDropout):
    """Scheduled DropHead: per-sample whole-head dropout with per-sample rescale H/#kept."""

    def __init__(self, heads: int, rate: RateConfig | float | None, max_redraws: int = 10):
        super().__init__(heads, rate)
        self.max_redraws = max_redraws

    def forward(self, batch_size: int, device: torch.device) -> Tensor | None:
        """Return the head scale, [B, heads] (0 or H/#kept per sample), or None when inactive."""
        p = self.p
        if not self.training or p <= 0.0:
            return None
        keep = torch.rand(batch_size, self.paths, device=device) >= p  # [B, H]
        for _ in range(self.max_redraws):
            empty = ~keep.any(dim=1)  # [B]
            if not bool(empty.any()):
                break
            redraw = torch.rand(batch_size, self.paths, device=device) >= p
            keep = torch.where(empty[:, None], redraw, keep)
        keep = keep | ~keep.any(dim=1, keepdim=True)  # still empty after the redraws: keep all heads
        keep = keep.float()
        return keep * (self.paths / keep.sum(dim=1, keepdim=True))
