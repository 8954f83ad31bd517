"""An exponential moving average of the weights (Polyak averaging): fairseq's `--ema-decay`, Marian's exponential
smoothing.

With `train.ema_decay` = d, after update u the average is

    a_u = w_u                            for u <= train.ema_start (it follows the weights until then)
    a_u = d * a_(u-1) + (1 - d) * w_u    after

over the floating-point parameters (buffers are the model's own). It is what a run validates, and what its
checkpoints hold as their weights (best.pt, the step checkpoints, last.pt's `model`); last.pt also keeps the
trained weights themselves (`training.raw_model`), which a resume continues from. The average lives on the
model's device in float32 and is updated after the optimizer step without any read back to the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn


class WeightAverage:
    """The moving average of `model`'s floating-point parameters, decay `decay`, averaging after update `start`."""

    def __init__(self, model: nn.Module, decay: float, start: int = 0):
        self.decay, self.start = decay, start
        named = [(name, p) for name, p in model.named_parameters() if p.is_floating_point()]
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]
        self.average = [p.detach().float().clone() for p in self.params]  # (shape of each parameter,) fp32

    def update(self, step: int) -> None:
        """After update `step` (counted from 1): follow the weights up to `start`, average them after it."""
        weights = [p.detach().float() for p in self.params]  # the parameters themselves where they are fp32
        if step <= self.start:
            torch._foreach_copy_(self.average, weights)
        else:
            torch._foreach_lerp_(self.average, weights, 1.0 - self.decay)

    def model_state(self, model: nn.Module) -> dict[str, Tensor]:
        """`model.state_dict()` with the average in place of each averaged parameter (in the parameter's dtype),
        under every name the parameter has (tied embeddings have several)."""
        state = model.state_dict()
        averages = {id(p): average.to(p.dtype, copy=True) for p, average in zip(self.params, self.average, strict=True)}
        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) in averages:
                state[name] = averages[id(p)]  # one tensor for all its names, as in the model's own state dict
        return state

    def load(self, state: dict[str, Any]) -> None:
        """Take the average from a state dict `model_state` wrote (a checkpoint's `model`)."""
        for name, average in zip(self.names, self.average, strict=True):
            average.copy_(state[name])

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the average inside the block (to validate it) and its own weights again after it."""
        weights = [p.detach() for p in self.params]
        kept = [w.clone() for w in weights]
        torch._foreach_copy_(weights, self.average)
        try:
            yield
        finally:
            torch._foreach_copy_(weights, kept)
