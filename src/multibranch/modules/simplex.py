"""Simplex-constrained branch weights: the kappa/alpha of the Weighted Transformer (eq. 6-7;
docs/papers.md#weighted-kappa-and-alpha-on-the-simplex).

`project_simplex(v)` is the exact Euclidean projection onto {x : x >= 0, sum(x) = 1} (sort-based,
vectorised over leading dimensions):

    u = sort(v, descending);  rho = max{j : u_j - (sum_{r<=j} u_r - 1) / j > 0}
    theta = (sum_{r<=rho} u_r - 1) / rho;  P(v) = max(v - theta, 0)

`BranchWeights` holds kappa, alpha in R^M for one BranchedAttention module and talks to the trainer
through the module hooks (hooks.py): projection after every optimizer step, its own parameter
group (noam schedule, no weight decay, frozen for the last `freeze_last` updates) and kappa/alpha
values for metrics.jsonl. Ablations (paper §3, §4.4-4.5, marked as such): softmax ("mixture-of-experts")
normalisation, top-k gating of alpha, and test-time replacement by uniform or random weights.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from torch import Tensor, nn

from multibranch.hooks import ParamGroupSpec
from multibranch.schedules import LRConfig

Normalization = Literal["simplex", "softmax"]


def project_simplex(v: Tensor) -> Tensor:
    """Euclidean projection of every vector v[..., :] onto the probability simplex (same shape/dtype)."""
    x = v.double()  # M is tiny; float64 keeps the sum within 1e-6 of 1 after casting back
    u, _ = torch.sort(x, dim=-1, descending=True)  # [..., M]
    css = u.cumsum(dim=-1) - 1.0  # [..., M]
    j = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype, device=x.device)  # [M]
    support = u - css / j > 0  # [..., M]; True exactly on the first rho entries
    rho = (support * j).amax(dim=-1, keepdim=True)  # [..., 1] (>= 1: j = 1 always qualifies)
    theta = css.gather(-1, rho.long() - 1) / rho  # [..., 1]
    return (x - theta).clamp_min(0.0).to(v.dtype)


def on_simplex(v: Tensor, tol: float = 1e-6) -> bool:
    """True when every vector v[..., :] is non-negative and sums to 1 within `tol`."""
    return bool((v >= 0).all()) and bool(((v.sum(dim=-1) - 1.0).abs() <= tol).all())


def random_simplex(m: int, generator: torch.Generator | None = None) -> Tensor:
    """One Dirichlet(1, ..., 1) draw in R^m: normalised Exp(1) variables (uniform on the simplex)."""
    e = torch.empty(m, dtype=torch.float64).exponential_(generator=generator)  # [m]
    return (e / e.sum()).float()


class BranchWeights(nn.Module):
    """kappa (concatenation weights, eq. 6) and alpha (addition weights, eq. 7) of M branches.

    normalization: "simplex" (paper): raw parameters, projected onto the simplex after every step;
      "softmax" (ablation, "mixture-of-experts normalisation"): kappa = softmax(k), alpha = softmax(a).
    top_k (ablation): alpha restricted to its k largest entries, renormalised (hard gating).
    lr / lr_d_model / freeze_last / group: the optimizer group this module declares.
    """

    def __init__(
        self,
        branches: int,
        normalization: Normalization = "simplex",
        top_k: int | None = None,
        lr: LRConfig | None = None,
        lr_d_model: float | None = None,
        freeze_last: int = 0,
        group: str = "kappa_alpha",
    ):
        super().__init__()
        self.branches, self.normalization, self.top_k = branches, normalization, top_k
        self.lr, self.lr_d_model, self.freeze_last, self.group = lr, lr_d_model, freeze_last, group
        self.kappa = nn.Parameter(torch.empty(branches))
        self.alpha = nn.Parameter(torch.empty(branches))
        self.frozen = False  # set by on_update_start during the final `freeze_last` updates
        # the same switch as after_optimizer_step reads it: a device bool changed in place (a captured step
        # projects or not by its current value), not in the state dict
        self.register_buffer("frozen_value", torch.tensor(False), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Unif(0, 1) draws normalised onto the simplex (docs/papers.md#weighted-kappa-and-alpha-on-the-simplex); softmax mode stores their logs."""
        with torch.no_grad():
            for p in (self.kappa, self.alpha):
                p.uniform_(0.0, 1.0)
                p.div_(p.sum())
                if self.normalization == "softmax":
                    p.log_()

    def forward(self) -> tuple[Tensor, Tensor]:
        """The effective (kappa [M], alpha [M]) used by the branches."""
        if self.normalization == "softmax":
            kappa, alpha = torch.softmax(self.kappa, dim=0), torch.softmax(self.alpha, dim=0)
        else:
            kappa, alpha = self.kappa, self.alpha
        if self.top_k is not None and self.top_k < self.branches:
            keep = torch.zeros_like(alpha).scatter(0, alpha.detach().topk(self.top_k).indices, 1.0)  # [M]
            gated = alpha * keep
            alpha = gated / gated.sum().clamp_min(1e-12)
        return kappa, alpha

    # ---- trainer hooks (hooks.py) ---------------------------------------------------------

    def on_update_start(self, step: int, warmup: int | None, total: int | None) -> None:
        """Update `step + 1` is frozen iff the trainer's LRScheduler gives this group LR 0."""
        self.frozen = bool(self.freeze_last) and total is not None and step + 1 > total - self.freeze_last
        with torch.no_grad():
            self.frozen_value.fill_(self.frozen)
        if self.freeze_last and total is not None and self.freeze_last >= total:
            warnings.warn(f"{self.group}: freeze_last={self.freeze_last} >= {total} planned updates, so kappa/alpha "
                          "never train; lower freeze_last", stacklevel=2)

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """Project kappa and alpha back onto the simplex (a no-op while frozen or in softmax mode).

        Frozen or not is chosen on the device (`frozen_value`), without a branch: frozen keeps the values."""
        if self.normalization != "simplex":
            return
        raw = torch.stack([self.kappa, self.alpha])  # [2, M]
        both = project_simplex(raw)
        if self.freeze_last:  # a config constant: never frozen without it
            both = torch.where(self.frozen_value, raw, both)
        self.kappa.copy_(both[0])
        self.alpha.copy_(both[1])

    def parameter_groups(self) -> list[ParamGroupSpec]:
        return [ParamGroupSpec(self.group, [self.kappa, self.alpha], lr=self.lr, lr_d_model=self.lr_d_model,
                               weight_decay=0.0, freeze_last=self.freeze_last)]

    def training_metrics(self) -> dict[str, float]:
        """Effective kappa_i / alpha_i (one host transfer per module)."""
        with torch.no_grad():
            kappa, alpha = self()
            values = torch.stack([kappa, alpha]).float().cpu().tolist()  # [2, M]
        out = {f"kappa.{i}": v for i, v in enumerate(values[0])}
        out.update({f"alpha.{i}": v for i, v in enumerate(values[1])})
        return out

    # ---- test-time replacement (Table 3 ablation) -----------------------------------------------

    @torch.no_grad()
    def replace_(self, mode: Literal["uniform", "random"], generator: torch.Generator | None = None) -> None:
        """Overwrite kappa and alpha with 1/M each ("uniform") or fresh Dirichlet(1) draws ("random")."""
        for p in (self.kappa, self.alpha):
            if mode == "uniform":
                target = torch.full((self.branches,), 1.0 / self.branches)
            elif mode == "random":
                target = random_simplex(self.branches, generator)
            else:
                raise ValueError(f"unknown replacement {mode!r}; use 'uniform' or 'random'")
            p.copy_(target.log() if self.normalization == "softmax" else target)

    def extra_repr(self) -> str:
        gate = f", top_k={self.top_k}" if self.top_k is not None else ""
        return f"branches={self.branches}, normalization={self.normalization}{gate}, freeze_last={self.freeze_last}"


def replace_branch_weights(model: nn.Module, mode: Literal["uniform", "random"], seed: int = 0) -> int:
    """Test-time ablation (Weighted Transformer Table 3, docs/papers.md#weighted-ablations): replace every module's kappa/alpha in `model`.

    "random" draws one Dirichlet(1) point per vector (kappa and alpha of every module, in module
    order) from a generator seeded with `seed`. Returns the number of modules changed.
    """
    generator = torch.Generator().manual_seed(seed)
    modules = [m for m in model.modules() if isinstance(m, BranchWeights)]
    for module in modules:
        module.replace_(mode, generator)
    return len(modules)
