"""The branch merge constant of a multi-branch sublayer (MAT eq. 4, 6 and 8;
docs/papers.md#mat-merge-constant) and its summed biases."""

from __future__ import annotations

from torch import Tensor


def merge_constant(branches: int, merge: str) -> float:
    """c = 1/N ("mean", the paper) or 1/N^2 ("mean_sq", the released code) for N branches."""
    return 1.0 / branches if merge == "mean" else 1.0 / branches**2


def branch_bias(bias: Tensor, scale: Tensor | None = None) -> Tensor:
    """The branches' output biases summed: bias [N, d] -> [d], or sum_i s_i b_i per row of the drop-branch
    scale [R, N] -> [R, d].

    The scaled sum multiplies elementwise and reduces the same way as the plain one, so scales of 1 give the
    plain sum bit for bit and a row of 0 scales gives exactly 0 (no matmul, whose summation order differs)."""
    if scale is None:
        return bias[0] if bias.shape[0] == 1 else bias.sum(0)
    return (scale[:, :, None].to(bias.dtype) * bias).sum(1)
