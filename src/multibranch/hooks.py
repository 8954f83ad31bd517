"""How modules talk to the trainer without the trainer knowing any paper.

A module may define any of these methods; the trainer finds them by walking `model.modules()`:

- `on_update_start(step, warmup, total)`: move scheduled rates (DropHead, drop-branch, MUTE switch)
  to update `step` (updates done so far); `warmup` is the LR warm-up, `total` the planned updates.
- `after_optimizer_step()`: projections/normalisations after each optimizer step (kappa/alpha onto
  the simplex, AutoShuffle normalisation). Runs under torch.no_grad().
- `extra_losses(update_tokens, world_size) -> dict[str, Tensor]`: auxiliary losses, already weighted,
  on the scale of the per-token training loss; the trainer adds their sum once per update and logs
  each by name. `update_tokens` (target tokens of the whole update, all processes) and `world_size`
  let a module reproduce a reference that adds its loss to a token-summed objective.
- `may_skip_parameters = True` (attribute): some forward passes leave parameters without gradient
  (dropped branches, an unused mask embedding); data-parallel training must then look for them.
- `parameter_groups() -> list[ParamGroupSpec]`: parameters that need their own optimizer group
  (own LR schedule, no weight decay, frozen for the last updates).
- `training_metrics() -> dict[str, float]`: values worth following during training (kappa/alpha,
  unit weights, kernel gates...); logged to metrics.jsonl with each train record, keyed by module name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from multibranch.schedules import LRConfig


@dataclass
class ParamGroupSpec:
    """An optimizer parameter group declared by a module.

    lr: its own LR schedule (None: the main schedule); lr_d_model: the width used by a noam schedule
    (None: the model's d_model); weight_decay: None keeps the main value; freeze_last: LR 0 for the
    final `freeze_last` updates (needs a known number of updates).
    """

    name: str
    params: list[nn.Parameter] = field(default_factory=list)
    lr: LRConfig | None = None
    lr_d_model: float | None = None
    weight_decay: float | None = None
    freeze_last: int = 0


class ModuleHooks:
    """The hook methods found on a model's modules, called in module order."""

    def __init__(self, model: nn.Module):
        modules = list(model.modules())
        self.rate_modules = [m for m in modules if hasattr(m, "on_update_start")]
        self.post_step_modules = [m for m in modules if hasattr(m, "after_optimizer_step")]
        self.loss_modules = [m for m in modules if hasattr(m, "extra_losses")]
        self.group_modules = [m for m in modules if hasattr(m, "parameter_groups")]
        self.metric_modules = [(name, m) for name, m in model.named_modules() if hasattr(m, "training_metrics")]
        self.may_skip_parameters = any(getattr(m, "may_skip_parameters", False) for m in modules)

    def update_start(self, step: int, warmup: int | None, total: int | None) -> None:
        for module in self.rate_modules:
            module.on_update_start(step, warmup, total)

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        for module in self.post_step_modules:
            module.after_optimizer_step()

    def extra_losses(self, update_tokens: float | None = None, world_size: int = 1) -> dict[str, Tensor]:
        losses: dict[str, Tensor] = {}
        for module in self.loss_modules:
            for name, value in module.extra_losses(update_tokens=update_tokens, world_size=world_size).items():
                losses[name] = losses[name] + value if name in losses else value
        return losses

    def parameter_groups(self) -> list[ParamGroupSpec]:
        merged: dict[str, ParamGroupSpec] = {}
        for module in self.group_modules:
            for spec in module.parameter_groups():
                if spec.name in merged:
                    merged[spec.name].params.extend(spec.params)
                else:
                    merged[spec.name] = ParamGroupSpec(**{**spec.__dict__, "params": list(spec.params)})
        return list(merged.values())

    def training_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, module in self.metric_modules:
            for key, value in module.training_metrics().items():
                out[f"{name}.{key}" if name else key] = value
        return out
