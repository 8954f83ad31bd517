"""Position-wise feed-forward network, optionally as N_f parallel branches (MAT §7.1, eq. 8).

N_f branches see the same input, so they are one wide FFN: fc1 stacks the branches' W_1 ([N_f*d_h, d]);
fc2 stacks their W_2 ([d, N_f*d_h]); each branch keeps its own output bias. The branch average and
drop-branch act on the hidden blocks exactly as in `ParallelAttention`:

    FFN(x) = c * sum_i s_i * (W_2^i act(W_1^i x + b_1^i) + b_2^i)
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multibranch.modules.dropout import dropout
from multibranch.modules.init import init_bias, init_blocks, init_weight
from multibranch.modules.merge import branch_bias, merge_constant
from multibranch.modules.packed_linear import PackedLinear, PackKind, pack_linear
from multibranch.modules.structured_dropout import PathDropout

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    """W_2 act(W_1 x + b_1) + b_2, with `branches` parallel copies averaged (c = 1/N_f or 1/N_f^2)."""

    def __init__(
        self,
        d_model: int,
        hidden_dim: int,
        activation: str = "relu",
        activation_dropout: float = 0.0,
        branches: int = 1,
        merge: Literal["mean", "mean_sq"] = "mean",
        drop_branch: PathDropout | None = None,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; known: {sorted(ACTIVATIONS)}")
        self.d_model, self.hidden_dim, self.branches = d_model, hidden_dim, branches
        self.activation = ACTIVATIONS[activation]
        self.activation_dropout = activation_dropout
        self.merge_scale = merge_constant(branches, merge)
        self.fc1 = nn.Linear(d_model, branches * hidden_dim)
        self.fc2 = nn.Linear(branches * hidden_dim, d_model, bias=False)
        self.fc2_bias = nn.Parameter(torch.zeros(branches, d_model))
        self.drop_branch = drop_branch
        self.reset_parameters()

    def reset_parameters(self, scheme: str = "xavier") -> None:
        with torch.no_grad():
            for layer, dim in ((self.fc1, 0), (self.fc2, 1)):
                if scheme == "xavier":  # one block per branch, each with its own fans
                    init_blocks(layer.weight, self.hidden_dim, dim, scheme)
                else:  # the whole Linear's default
                    init_weight(layer.weight, scheme)
            init_bias(self.fc1.bias, scheme, self.d_model)
            init_bias(self.fc2_bias, scheme, self.hidden_dim)

    packed: tuple[PackedLinear, PackedLinear] | None = None  # (fc1, fc2 with the merge folded in), see pack_linears

    def pack_linears(self, kind: PackKind) -> None:
        """Packed versions of fc1 (with a ReLU fused when that is the activation) and of the branch-averaged
        fc2 (modules/packed_linear.py), used in eval mode."""
        c = self.merge_scale
        with torch.no_grad():
            bias = self.fc2_bias[0] if self.branches == 1 else self.fc2_bias.sum(0)  # [d]
            self.packed = (pack_linear(self.fc1.weight, self.fc1.bias, kind, relu=self.activation is F.relu),
                           pack_linear(self.fc2.weight * c, bias * c, kind))

    def forward(self, x: Tensor) -> Tensor:
        """x [B, L, d] -> [B, L, d]."""
        if self.packed is not None and not self.training:
            fc1, fc2 = self.packed
            return fc2(fc1(x) if self.activation is F.relu else self.activation(fc1(x)))
        scale = self.drop_branch(x.shape[0], x.device) if self.drop_branch is not None else None
        h = self.activation(self.fc1(x))  # [B, L, N_f*d_h]
        if self.activation_dropout > 0:
            h = dropout(h, self.activation_dropout, self.training)
        weight, c = self.fc2.weight, self.merge_scale
        # No branch on the mask's values (a dropped-everything mask is computed and gives 0); scales of 1 (a
        # scheduled rate at 0) compute exactly what no drop-branch does (see branch_bias).
        if scale is None:
            bias = branch_bias(self.fc2_bias)  # [d]
            correction = None
        elif scale.shape[0] == 1:  # per-batch mask: fold into fc2's columns and the bias
            weight = weight * scale.repeat_interleave(self.hidden_dim, dim=1)
            bias = branch_bias(self.fc2_bias, scale)[0]
            correction = None
        else:  # per-sample mask: scale the hidden blocks; the bias is the plain sum plus sum_i (s_i - 1) b_i
            B, L, _ = h.shape
            h = (h.view(B, L, self.branches, self.hidden_dim) * scale[:, None, :, None]).view(B, L, -1)
            bias = branch_bias(self.fc2_bias)
            correction = branch_bias(self.fc2_bias, scale - 1.0)[:, None, :]  # [B, 1, d]; exactly 0 at scale 1
        if c != 1.0:
            weight, bias = weight * c, bias * c
            correction = correction * c if correction is not None else None
        out = F.linear(h, weight, bias)
        return out if correction is None else out + correction
