"""Attention entropy per head: for each head, the mean over real (non-pad) query positions of the
entropy (nats) of its attention distribution, over an evaluation set in eval mode.

Low entropy = a focused head (e.g. attending to the previous token), high = a diffuse one; the
maximum for a query that sees n keys is log n.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from multibranch.analysis.batches import AnyBatch, run_batch
from multibranch.analysis.heads import AttentionSite, HeadScores, attention_sites


@torch.no_grad()
def attention_entropy(model: nn.Module, batches: Iterable[AnyBatch], sites: list[AttentionSite] | None = None) -> HeadScores:
    """Mean attention entropy [H] per site (site name -> CPU fp32 tensor); translation or classification batches."""
    sites = attention_sites(model) if sites is None else sites
    model.eval()
    sums = {s.name: torch.zeros(s.heads, dtype=torch.float64) for s in sites}
    counts = {s.name: 0 for s in sites}
    entropies: dict[str, Tensor] = {}  # site name -> [B, H, L] of the current batch

    def probe_for(site: AttentionSite):
        def probe(probs: Tensor) -> None:  # [B, H' (= k*H), L, S]
            B, _, L, S = probs.shape
            entropy = torch.special.entr(probs.double()).sum(-1)  # [B, H', L]
            entropies[site.name] = entropy.view(B, -1, site.heads, L).mean(1)  # [B, H, L] (shared copies averaged)
        return probe

    try:
        for site in sites:
            site.module.attention_probe = probe_for(site)
        for batch in batches:
            queries = run_batch(model, batch)  # role -> real query positions [B, L]
            for site in sites:
                real = queries[site.role].to(entropies[site.name].dtype)  # [B, L]
                sums[site.name] += (entropies[site.name] * real[:, None, :]).sum((0, 2)).cpu()
                counts[site.name] += int(real.sum())
    finally:
        for site in sites:
            site.module.attention_probe = None
    return {name: (sums[name] / max(counts[name], 1)).float() for name in sums}
