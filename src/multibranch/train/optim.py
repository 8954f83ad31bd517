"""Optimizer with per-group learning-rate schedules (AdamW; fairseq's Adam is decoupled too)."""

from __future__ import annotations

import torch
from torch import nn

from multibranch.experiment.training import TrainConfig
from multibranch.hooks import ParamGroupSpec
from multibranch.schedules import LRConfig, learning_rate_at


def build_optimizer(model: nn.Module, cfg: TrainConfig, specs: list[ParamGroupSpec]) -> torch.optim.Optimizer:
    """AdamW over the main group plus the groups modules declared (each parameter in one group)."""
    claimed = {id(p) for spec in specs for p in spec.params}
    seen: set[int] = set()
    main = []
    for p in model.parameters():
        if p.requires_grad and id(p) not in claimed and id(p) not in seen:
            seen.add(id(p))
            main.append(p)
    groups = [{"params": main, "name": "main", "weight_decay": cfg.weight_decay}]
    for spec in specs:
        wd = cfg.weight_decay if spec.weight_decay is None else spec.weight_decay
        groups.append({"params": spec.params, "name": spec.name, "weight_decay": wd})
    kwargs = {"lr": cfg.lr.lr, "betas": tuple(cfg.betas), "eps": cfg.adam_eps}
    if all(p.device.type == "cpu" for p in model.parameters()):
        kwargs["foreach"] = True
    elif all(p.device.type == "cuda" and p.is_floating_point() for p in model.parameters()):
        kwargs["fused"] = True  # one fused kernel per parameter group, not foreach's several per step
    return torch.optim.AdamW(groups, **kwargs)


class LRScheduler:
    """Sets every group's learning rate from its schedule; state is just the update number."""

    def __init__(self, optimizer: torch.optim.Optimizer, main: LRConfig, d_model: int,
                 specs: list[ParamGroupSpec], total_updates: int | None):
        self.optimizer = optimizer
        by_name = {spec.name: spec for spec in specs}
        self.plans = []
        for group in optimizer.param_groups:
            spec = by_name.get(group["name"])
            lr_cfg = spec.lr if spec is not None and spec.lr is not None else main
            width = spec.lr_d_model if spec is not None and spec.lr_d_model is not None else d_model
            freeze = spec.freeze_last if spec is not None else 0
            if freeze and total_updates is None:
                raise ValueError(f"parameter group {group['name']!r} is frozen for the last {freeze} updates, "
                                 "which needs train.max_steps")
            self.plans.append((lr_cfg, width, freeze))
        self.total_updates = total_updates

    def set_step(self, update: int) -> dict[str, float]:
        """Learning rates for the 1-based update number `update`; returns them by group name. A tensor
        learning rate (capturable optimizers) is changed in place, so a captured step reads the new one."""
        rates = {}
        # look the groups up each time: optimizer.load_state_dict replaces the group dicts
        for group, (lr_cfg, width, freeze) in zip(self.optimizer.param_groups, self.plans):
            frozen = freeze and self.total_updates is not None and update > self.total_updates - freeze
            rate = 0.0 if frozen else learning_rate_at(lr_cfg, update, width, self.total_updates)
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(rate)
            else:
                group["lr"] = rate
            rates[group["name"]] = rate
        return rates


def make_capturable(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Ready AdamW for a step inside a CUDA graph: capturable groups, each learning rate a 0-d tensor on
    `device` (set in place by LRScheduler), step counters on the device. Call again after load_state_dict."""
    for group in optimizer.param_groups:
        group["capturable"] = True
        group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
    for state in optimizer.state.values():
        if "step" in state:
            state["step"] = torch.as_tensor(state["step"], dtype=torch.float32).to(device)


def optimizer_state_to_save(optimizer: torch.optim.Optimizer) -> dict:
    """optimizer.state_dict() with plain-number learning rates and no capturable flag, so that a run saved
    with graphs resumes on any device and path (make_capturable restores both)."""
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
        if "capturable" in group:
            group["capturable"] = False
    return state
