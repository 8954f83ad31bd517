"""The branch merge constant of a multi-branch sublayer (MAT, SEEDS-SPEC §1.5-1.6)."""

from __future__ import annotations


def merge_constant(branches: int, merge: str) -> float:
    """c = 1/N ("mean", the paper) or 1/N^2 ("mean_sq", the released code) for N branches."""
    return 1.0 / branches if merge == "mean" else 1.0 / branches**2
