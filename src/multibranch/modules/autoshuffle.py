"""AutoShuffle (Lyu et al., 2019) and MUTE's sequential fusion of unit outputs (MUTE §3.3, eq. 13-20;
docs/papers.md#mute-autoshuffle-normalisation).

A learned near-permutation M^p [I, I] orders the unit outputs F_1..F_I before a cumulative fusion:

    G_j     = sum_i M_ij F_i                      (paper eq. 16: [F_p(i)] = M^T [F_i])
    Ĝ_j     = sum_{k<=j} G_k                      (eq. 14)
    F(x)    = sum_j w_j Ĝ_j / j                   (eq. 15)

which is a linear combination of the F_i, F(x) = sum_i c_i F_i with c = M (U (w / j)), U_kj = [k <= j]:
`fusion_coefficients` computes c ([I], cheap), `sequential_fusion` is the explicit reference form.

Normalisation (projection-like, no gradient; reference order rows -> columns,
docs/papers.md#mute-autoshuffle-normalisation):
    M <- max(M, 0);  M <- M / row sums;  M <- M / column sums       (columns sum to 1 exactly)
applied at construction, after every optimizer step and after loading an un-normalised state.

Penalty (eq. 19), zero iff the non-negative doubly-stochastic M is a permutation:
    P(M) = sum_rows (|r|_1 - |r|_2) + sum_cols (|c|_1 - |c|_2)      (fp32)
It enters the loss through `extra_losses()` as `penalty_weight * P` relative to the mean token loss
("mean", default 2.5e-4), or reproducing the reference's per-token-sum scaling ("per_token_sum":
penalty_weight * P * world_size / update_tokens, with the reference's penalty_weight = 1.0).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from multibranch.hooks import ParamGroupSpec

PenaltyReduction = Literal["mean", "per_token_sum"]


def normalise_shuffle(matrix: Tensor) -> Tensor:
    """Clamp at 0, divide rows by their sums, then columns by theirs (eq. 17-18, reference order).

    A row (column) with nothing left after clamping becomes uniform, so the result never has NaNs.
    """
    n = matrix.shape[-1]
    m = matrix.clamp_min(0)
    m = torch.where(m.sum(1, keepdim=True) > 0, m, torch.full_like(m, 1.0 / n))
    m = m / m.sum(1, keepdim=True)  # rows
    m = torch.where(m.sum(0, keepdim=True) > 0, m, torch.full_like(m, 1.0 / n))
    return m / m.sum(0, keepdim=True)  # columns


def permutation_penalty(matrix: Tensor) -> Tensor:
    """Eq. 19 in fp32: sum over rows and columns of (l1 norm - l2 norm)."""
    m = matrix.float()
    rows = m.abs().sum(1) - m.norm(dim=1)
    cols = m.abs().sum(0) - m.norm(dim=0)
    return rows.sum() + cols.sum()


def fusion_coefficients(matrix: Tensor, weights: Tensor) -> Tensor:
    """c [I] with sum_j w_j Ĝ_j / j = sum_i c_i F_i: c = M @ reverse_cumsum(w / j)."""
    n = weights.shape[0]
    scaled = weights / torch.arange(1, n + 1, device=weights.device, dtype=weights.dtype)  # w_j / j
    tail = scaled.flip(0).cumsum(0).flip(0)  # [I]: sum_{j >= k} w_j / j
    return matrix.to(weights.dtype) @ tail


def sequential_fusion(units: Tensor, matrix: Tensor, weights: Tensor) -> Tensor:
    """Explicit eq. 14-16: units [I, ...] (F_i), matrix [I, I], weights [I] -> [...]."""
    n = units.shape[0]
    g = torch.einsum("ij,i...->j...", matrix.to(units.dtype), units)  # [I, ...] G_j
    steps = torch.arange(1, n + 1, device=units.device, dtype=units.dtype).view(n, *([1] * (units.dim() - 1)))
    g_hat = g.cumsum(0) / steps  # [I, ...] Ĝ_j / j
    return torch.einsum("j,j...->...", weights.to(units.dtype), g_hat)


def hard_permutation(matrix: Tensor) -> Tensor:
    """The permutation matrix closest to `matrix` (max total weight; Hungarian algorithm via scipy).

    For export-time rounding (AutoShuffleNet style); scipy is imported lazily and is not a dependency.
    """
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError as err:
        raise ImportError(
            "rounding an AutoShuffle matrix to a hard permutation needs scipy (Hungarian algorithm): "
            "pip install scipy"
        ) from err
    rows, cols = linear_sum_assignment(matrix.detach().float().cpu().numpy(), maximize=True)
    out = torch.zeros_like(matrix)
    out[torch.as_tensor(rows), torch.as_tensor(cols)] = 1.0
    return out


class AutoShuffle(nn.Module):
    """One layer's AutoShuffle matrix M^p [I, I], its normalisation, penalty and sequential fusion.

    Args:
        units: I.
        penalty_weight: lambda (relative to the mean token loss for "mean"; see module docstring).
        penalty_reduction: "mean" or "per_token_sum" (the reference's formula, needs the trainer to
            pass `update_tokens` and `world_size` to `extra_losses`).
    """

    def __init__(self, units: int, penalty_weight: float = 2.5e-4, penalty_reduction: PenaltyReduction = "mean"):
        super().__init__()
        self.units = units
        self.penalty_weight = penalty_weight
        self.penalty_reduction = penalty_reduction
        self.weight = nn.Parameter(torch.empty(units, units))
        self.reset_parameters()
        self.register_load_state_dict_post_hook(_normalise_after_load)

    def reset_parameters(self, scheme: str = "xavier") -> None:
        """|N(0, 1)| entries whatever the model's scheme (excluded from Glorot init), normalised."""
        with torch.no_grad():
            self.weight.normal_().abs_()
        self.normalise_()

    @torch.no_grad()
    def normalise_(self) -> None:
        self.weight.copy_(normalise_shuffle(self.weight.float()).to(self.weight.dtype))

    def is_normalised(self, atol: float = 1e-5) -> bool:
        """Non-negative with unit column sums (what `normalise_` guarantees)."""
        w = self.weight.detach().float()
        return bool((w >= 0).all()) and torch.allclose(w.sum(0), torch.ones_like(w[0]), atol=atol)

    def after_optimizer_step(self) -> None:
        self.normalise_()

    @torch.no_grad()
    def round_to_permutation_(self) -> Tensor:
        """Replace M by its hard permutation (export); returns the new matrix."""
        self.weight.copy_(hard_permutation(self.weight))
        return self.weight.detach()

    def penalty(self) -> Tensor:
        """P(M^p) (eq. 19), fp32 scalar with gradient w.r.t. M."""
        return permutation_penalty(self.weight)

    def extra_losses(self, update_tokens: float | None = None, world_size: int = 1) -> dict[str, Tensor]:
        """{"autoshuffle": weighted penalty} on the scale of the mean token loss (summed over layers
        by the trainer)."""
        if self.penalty_weight == 0.0:
            return {}
        value = self.penalty_weight * self.penalty()
        if self.penalty_reduction == "per_token_sum":
            if update_tokens is None:
                raise RuntimeError(
                    "AutoShuffle penalty_reduction='per_token_sum' needs the number of target tokens of the update: "
                    "the trainer must call extra_losses(update_tokens=..., world_size=...); use 'mean' otherwise"
                )
            value = value * (world_size / update_tokens)
        return {"autoshuffle": value}

    def parameter_groups(self) -> list[ParamGroupSpec]:
        """M^p takes no weight decay."""
        return [ParamGroupSpec("mute_no_decay", [self.weight], weight_decay=0.0)]

    def coefficients(self, weights: Tensor) -> Tensor:
        """Per-unit fusion coefficients c [I] for unit weights w [I]."""
        return fusion_coefficients(self.weight, weights)

    def forward(self, units: Tensor, weights: Tensor) -> Tensor:
        """units [I, B, S, d] (F_i), weights [I] (w) -> fused [B, S, d] (eq. 14-16)."""
        c = self.coefficients(weights).to(units.dtype)  # [I]
        return torch.einsum("i,ibsd->bsd", c, units)

    def extra_repr(self) -> str:
        return f"units={self.units}, penalty_weight={self.penalty_weight}, reduction={self.penalty_reduction}"


def round_autoshuffles_(model: nn.Module) -> int:
    """Round every AutoShuffle matrix of `model` to its hard permutation (export time); returns how many."""
    shuffles = [m for m in model.modules() if isinstance(m, AutoShuffle)]
    for shuffle in shuffles:
        shuffle.round_to_permutation_()
    return len(shuffles)


def _normalise_after_load(module: AutoShuffle, incompatible_keys) -> None:
    """Load hook: a checkpoint with an un-normalised matrix (e.g. the reference's last step) is
    normalised; an already normalised one is kept bit-for-bit, so save -> load is exact."""
    if not module.is_normalised():
        module.normalise_()
