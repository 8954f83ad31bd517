"""The candidates of a beam-search step: per sentence, the n best (hypothesis score + token log-probability).

The plain way adds every hypothesis' score to its [V] log-probabilities and takes the top n of the
[width * V] sums per sentence (a full write of the sums, then a top-k over 40k values per sentence at
beam 5 and an 8k vocabulary: most of a step's time outside the matrix multiplies on the CPU).
`top_candidates` returns the same values without forming the sums, in two small top-k's:

1. split each hypothesis' vocabulary into blocks of `block` tokens; a block's best sum is its largest
   log-probability plus the hypothesis' score. Keep, per sentence, the n blocks with the best such sums.
2. the n best sums among those blocks' tokens (and the last, partial block's tokens, if V is not a
   multiple of `block`) are the answer.

Why it is exact: the n kept blocks hold n different tokens whose sums are each at least tau, the n-th
best block maximum, so the n-th best sum overall is >= tau. A token in the overall top n therefore has
a sum >= tau, so its block's maximum is >= tau, and a block with a maximum above tau is among the n kept.
Only tokens tied at exactly tau may be swapped for other tokens of the same value (as `torch.topk`
orders ties arbitrarily too).

On the CPU (fp32) the same search runs as one C++ call per step (`csrc/beam_step.cpp`, via `cpu_kernels`)
instead of the dozen small PyTorch operations of `composed_top_candidates`; it ranks equal sums by flat
index, lowest first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from multibranch import cpu_kernels

BLOCK = 64  # tokens per block: 125 blocks for an 8k vocabulary (measured fastest among 32/64/128 on the CPU)


def top_candidates(lprobs: Tensor, scores: Tensor, n: int, block: int | None = None) -> tuple[Tensor, Tensor]:
    """lprobs [b, w, V] (w hypotheses per sentence), scores [b, w] -> (values [b, n], best first; their
    flat indices [b, n] into w * V, i.e. hypothesis * V + token): the top n of lprobs + scores[:, :, None]
    per sentence, as `torch.topk` of the sums would return them (ties aside). Needs n <= w * V.
    `block`: tokens per block (default BLOCK). The C++ kernel where it can run, else
    `composed_top_candidates`."""
    if cpu_kernels.usable(lprobs, scores) and lprobs.numel():
        values, indices = cpu_kernels.kernels().top_candidates(lprobs.contiguous(), scores.contiguous(), n,
                                                               block or BLOCK)
        return values, indices
    return composed_top_candidates(lprobs, scores, n, block)


def composed_top_candidates(lprobs: Tensor, scores: Tensor, n: int, block: int | None = None) -> tuple[Tensor, Tensor]:
    """`top_candidates` composed of PyTorch operations (any device and dtype)."""
    b, w, V = lprobs.shape
    block = block or BLOCK
    blocks = V // block
    if blocks * w < 2 * n:  # a small vocabulary: too few blocks to gain anything
        return (lprobs + scores[:, :, None]).reshape(b, w * V).topk(n, dim=1)
    body = blocks * block
    device = lprobs.device

    # 1. per sentence, the n blocks with the best (block maximum + hypothesis score)
    block_max = lprobs[:, :, :body].unflatten(2, (blocks, block)).amax(dim=3)  # [b, w, blocks]
    best_blocks = (block_max + scores[:, :, None]).view(b, w * blocks).topk(n, dim=1).indices  # [b, n]
    hyp = torch.div(best_blocks, blocks, rounding_mode="floor")  # [b, n]
    first = hyp * V + (best_blocks - hyp * blocks) * block  # [b, n] flat index of each block's first token
    index = (first[:, :, None] + torch.arange(block, device=device)).view(b, n * block)  # [b, n * block]
    hyp = hyp.repeat_interleave(block, dim=1)  # [b, n * block]
    if body < V:  # the partial last block of every hypothesis is always a candidate
        tail = torch.arange(body, V, device=device)  # [V - body]
        tail_hyp = torch.arange(w, device=device).repeat_interleave(V - body)  # [w * (V - body)]
        index = torch.cat([index, (tail_hyp * V + tail.repeat(w)).expand(b, -1)], dim=1)
        hyp = torch.cat([hyp, tail_hyp.expand(b, -1)], dim=1)

    # 2. the n best sums among the kept tokens
    sums = lprobs.reshape(b, w * V).gather(1, index) + scores.gather(1, hyp)  # [b, m]
    values, pick = sums.topk(n, dim=1)  # [b, n]
    return values, index.gather(1, pick)
