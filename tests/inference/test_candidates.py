"""The beam step's candidate selection against torch.topk of the full sums: `top_candidates` (the C++ kernel
on the CPU where it is built, csrc/beam_step.cpp) and `composed_top_candidates` (PyTorch operations)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from multibranch.inference import candidates
from multibranch.inference.candidates import composed_top_candidates, top_candidates

NEG_INF = float("-inf")
IMPLEMENTATIONS = (top_candidates, composed_top_candidates)
needs_kernels = pytest.mark.usefixtures("cpu_kernels_built")


def _plain(lprobs: torch.Tensor, scores: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    b, w, V = lprobs.shape
    return (lprobs + scores[:, :, None]).reshape(b, w * V).topk(n, dim=1)


def _check(lprobs: torch.Tensor, scores: torch.Tensor, n: int, block: int) -> None:
    for select in IMPLEMENTATIONS:
        _check_one(select, lprobs, scores, n, block)


def _check_one(select, lprobs: torch.Tensor, scores: torch.Tensor, n: int, block: int) -> None:
    """Same values as the plain top-k; every index points at its value; finite candidates are distinct."""
    b, w, V = lprobs.shape
    values, index = select(lprobs, scores, n, block)
    expected_values, expected_index = _plain(lprobs, scores, n)
    assert torch.equal(values, expected_values)
    sums = (lprobs + scores[:, :, None]).reshape(b, w * V)
    assert torch.equal(sums.gather(1, index), values)
    for row_values, row_index in zip(values, index, strict=True):
        finite = row_index[row_values.isfinite()].tolist()
        assert len(set(finite)) == len(finite)
    distinct = all(len(set(row.tolist())) == len(row) for row in sums)
    if distinct:  # without ties even the indices are torch.topk's
        assert torch.equal(index, expected_index)


@pytest.mark.parametrize("V, block", [(8000, 64), (40, 3), (37, 4), (100, 7), (64, 64)])
@pytest.mark.parametrize("w, n", [(1, 10), (5, 10), (3, 6)])
def test_top_candidates_equal_the_topk_of_the_full_sums(V, block, w, n):
    torch.manual_seed(V + w)
    lprobs = torch.log_softmax(torch.randn(4, w, V) * 3, dim=-1)
    scores = torch.randn(4, w) * 4 - 6
    _check(lprobs, scores, n, block)


def test_top_candidates_on_each_device(device):
    """The 8k-token case with masked tokens and a dead hypothesis, on each device (CUDA has its own top-k)."""
    generator = torch.Generator().manual_seed(3)
    lprobs = torch.log_softmax(torch.randn(6, 5, 8000, generator=generator) * 3, dim=-1)
    lprobs[:, :, :3] = NEG_INF  # pad, bos, unk, as the search masks them
    scores = torch.randn(6, 5, generator=generator) * 4 - 6
    scores[2, 4] = NEG_INF
    _check(lprobs.to(device), scores.to(device), 10, 64)


def test_the_block_path_really_runs_and_keeps_a_token_from_the_partial_last_block():
    """V = 37 with blocks of 4: token 36 is in no whole block; made the best, it must still be found."""
    lprobs = torch.log_softmax(torch.randn(2, 3, 37), dim=-1)
    lprobs[1, 2, 36] = 5.0
    for select in IMPLEMENTATIONS:
        values, index = select(lprobs, torch.zeros(2, 3), 6, block=4)
        assert index[1, 0].item() == 2 * 37 + 36 and values[1, 0].item() == 5.0


@needs_kernels
def test_on_the_cpu_the_kernel_selects_and_ranks_ties_by_index(monkeypatch):
    """fp32 CPU tensors go through the C++ kernel (the composed path is not called); equal sums come lowest
    flat index first (hand-made: every token of hypothesis 1 ties with one of hypothesis 0)."""
    monkeypatch.setattr(candidates, "composed_top_candidates", None)  # would fail if called
    lprobs = torch.log_softmax(torch.arange(12.0).reshape(1, 1, 12), dim=-1).repeat(1, 2, 1)  # [1, 2, 12]
    values, index = top_candidates(lprobs, torch.zeros(1, 2), 4, block=4)
    assert index.tolist() == [[11, 23, 10, 22]]
    assert torch.equal(values, lprobs[0, 0, [11, 11, 10, 10]][None])


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(2, 30), st.integers(1, 9), st.integers(0, 2**16),
       st.floats(0.0, 0.9))
def test_top_candidates_with_masked_tokens_and_ties(b, w, V, block, seed, masked):
    """-inf tokens (pad, bos, forced EOS, prefixes), whole -inf hypotheses, and values rounded to ties."""
    generator = torch.Generator().manual_seed(seed)
    n = min(2 * w, w * V)
    lprobs = (torch.randn(b, w, V, generator=generator) * 2).round()  # many ties
    lprobs[torch.rand(b, w, V, generator=generator) < masked] = NEG_INF
    scores = torch.randn(b, w, generator=generator).round()
    scores[torch.rand(b, w, generator=generator) < 0.2] = NEG_INF
    _check(lprobs, scores, n, block)
