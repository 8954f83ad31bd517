"""Structured dropout: drop whole parallel paths (branches, heads) and rescale the kept ones.

Both modules return a *scale* tensor (or None when they do nothing) that the owner multiplies into
the paths' outputs, so one fused computation serves every paper:

- `PathDropout` (MAT drop-branch, eq. 5-10, docs/papers.md#mat-drop-branch): path kept iff U >= rho, kept paths scaled by
  1/(1-rho); one mask per call shared by the batch (default) or one per sample. If every path drops,
  the sublayer output is zero and the residual passes through (by design).
- `DropHead` (Scheduled DropHead eq. 3 / Algorithm 1, docs/papers.md#drophead-granularity): per-sample head mask xi ~ Bernoulli(1-p), kept heads scaled
  by H/#kept of that sample; a sample that loses every head is redrawn (at most `max_redraws` times,
  then keeps all heads).

Both are identity in eval mode. Their rate is a `ScheduledRate` that the trainer moves along through
`on_update_start`; the forward reads its value from a 0-d device tensor (`rate_value`, a non-persistent
buffer filled in place), never from Python, and draws and rescales without branching on any value. So a
training forward reads nothing back from the device, and a captured CUDA graph (or a compiled graph)
keeps seeing the current rate on every replay. A rate that is 0 at every step (config) builds no module
or returns None; a scheduled rate that is 0 right now gives scales of exactly 1.
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
        # the rate the forward uses: a device scalar changed in place (graph replays see the new value);
        # not in the state dict (a function of the config and the step)
        self.register_buffer("rate_value", torch.tensor(self.rate.value, dtype=torch.float32), persistent=False)

    def on_update_start(self, step: int, warmup: int | None, total: int | None) -> None:
        self.rate.update(step, warmup, total)
        with torch.no_grad():
            self.rate_value.fill_(self.rate.value)

    @property
    def p(self) -> float:
        """The current rate as a Python number (repr, metrics, tests); the forward reads `rate_value`."""
        return self.rate.value

    def _inactive(self) -> bool:
        """True in eval mode and for a rate that is 0 at every step (decided by the config, not the value)."""
        return not self.training or not self.rate.active

    def extra_repr(self) -> str:
        return f"paths={self.paths}, rate={self.rate.config}"


class PathDropout(_ScheduledDropout):
    """MAT drop-branch over `paths` parallel paths; `per_sample=False` shares one mask per batch."""

    def __init__(self, paths: int, rate: RateConfig | float | None, per_sample: bool = False):
        super().__init__(paths, rate)
        self.per_sample = per_sample

    def forward(self, batch_size: int, device: torch.device) -> Tensor | None:
        """Return the path scale, [1 or B, paths] (0 or 1/(1-rho); all 1 at rho = 0), or None when inactive."""
        if self._inactive():
            return None
        p = self.rate_value.to(device)
        rows = batch_size if self.per_sample else 1
        keep = torch.rand(rows, self.paths, device=device) >= p  # [rows, paths]
        return keep.float() / (1.0 - p)


class DropHead(_ScheduledDropout):
    """Scheduled DropHead: per-sample whole-head dropout with per-sample rescale H/#kept."""

    def __init__(self, heads: int, rate: RateConfig | float | None, max_redraws: int = 10):
        super().__init__(heads, rate)
        self.max_redraws = max_redraws

    def forward(self, batch_size: int, device: torch.device) -> Tensor | None:
        """Return the head scale, [B, heads] (0 or H/#kept per sample; all 1 at p = 0), or None when inactive.

        The first draw and the `max_redraws` redraws are drawn at once; each sample takes its first draw
        that keeps a head, or every head when none does (the same distribution as redrawing in a loop,
        without reading back whether a redraw is needed)."""
        if self._inactive():
            return None
        p = self.rate_value.to(device)
        draws = torch.rand(1 + self.max_redraws, batch_size, self.paths, device=device) >= p  # [R+1, B, H]
        usable = draws.any(dim=2)  # [R+1, B]: the draw keeps a head
        first = usable.to(torch.uint8).argmax(dim=0)  # [B]: first usable draw (0 when none is)
        keep = draws.gather(0, first[None, :, None].expand(1, batch_size, self.paths))[0]  # [B, H]
        keep = keep | ~usable.any(dim=0)[:, None]  # no usable draw: keep all heads
        keep = keep.float()
        return keep * (self.paths / keep.sum(dim=1, keepdim=True))
