"""Random sampling of outputs (back-translation): `n` independent samples per sentence, batched.

Each step takes the search's distribution (`beam._step_scores`: pad/bos masked before the
log_softmax, EOS masked before `min_len`, only EOS at the maximum length, n-gram blocking, target
prefixes) and draws the next token from

    softmax(log p / temperature), restricted to the top_k most probable tokens (0: all), then to the
    smallest set of most probable tokens whose probability reaches top_p (1.0: all), renormalised

(the order of Hugging Face's `generate`; fairseq's --sampling-topk/--sampling-topp are the same
filters). A hypothesis' positional scores are the model's own log-probabilities (temperature 1, no
restriction: what --score-reference reports for the same output); its score is their sum divided
by the length penalty. Samples of a sentence come back best score first.

Every row (sentence x sample) is independent: finished rows leave the batch at once. Draws come
from one `torch.Generator`, so the output is reproducible for a given seed, batch order and device.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from multibranch.errors import ConfigError
from multibranch.inference.beam import (
    NEG_INF,
    Decodable,
    Hypothesis,
    _finish,
    _step_scores,
    best_first,
    new_state,
    output_limits,
)

if TYPE_CHECKING:
    from multibranch.experiment.decoding import DecodeConfig


def restrict(lprobs: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """log-probabilities [N, V] -> the sampling distribution's log-probabilities [N, V] (-inf outside
    the top-k / top-p sets), renormalised (ties at the top-k boundary: whichever torch.topk returns)."""
    scaled = torch.log_softmax(lprobs / temperature, dim=-1)  # [N, V]
    if 0 < top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).indices  # [N, k]
        keep = torch.zeros_like(scaled, dtype=torch.bool).scatter_(1, kth, True)
        scaled = torch.log_softmax(scaled.masked_fill(~keep, NEG_INF), dim=-1)
    if top_p < 1.0:
        sorted_lp, order = scaled.sort(dim=-1, descending=True)  # [N, V]
        before = sorted_lp.exp().cumsum(dim=-1) - sorted_lp.exp()  # probability of the tokens ranked above
        drop_sorted = before >= top_p  # the first token always stays (before = 0 < top_p)
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        scaled = torch.log_softmax(scaled.masked_fill(drop, NEG_INF), dim=-1)
    return scaled


@torch.inference_mode()
def sample(model: Decodable, src: Tensor, options: DecodeConfig, n: int = 1, *,
           generator: torch.Generator | None = None, prefix: Tensor | None = None) -> list[list[Hypothesis]]:
    """`n` samples for each sentence of src [B, S] (right-padded), best score first, drawn as `options` says
    (temperature, top_k, top_p, length penalty and limits, min length, n-gram blocking)."""
    temperature = options.temperature
    if not (math.isfinite(temperature) and temperature > 0):
        raise ConfigError(f"temperature={temperature} must be a finite number > 0 (1: the model's distribution)")
    cfg = model.config
    B = src.shape[0]
    device = src.device
    max_lens, steps = output_limits(model, src, options, prefix)  # [B], decoding steps
    rows = torch.arange(B, device=device).repeat_interleave(n)  # [B*n] sentence of each row
    enc = model.encode(src).index_select(rows)  # one encoder row per sample: rows finish independently
    max_lens = max_lens[rows]
    prefix = None if prefix is None else prefix[rows]
    state = new_state(model)
    N = B * n
    tokens = torch.full((N, steps + 1), cfg.pad_id, dtype=torch.long, device=device)  # [N, 1 + T]
    tokens[:, 0] = cfg.bos_id
    positional = torch.zeros(N, steps, device=device)  # [N, T] the model's log-prob of each token
    alive = torch.arange(N, device=device)  # original row of each live sample
    hyps: list[list[Hypothesis]] = [[] for _ in range(B)]
    for step in range(steps):
        lprobs, _ = _step_scores(model, tokens, enc, state, step, options, step >= max_lens,
                                 None if prefix is None else prefix[alive])  # [b, V] (not deferred: offset None)
        probs = restrict(lprobs, temperature, options.top_k, options.top_p).exp()  # [b, V]
        dead = lprobs.isinf().all(dim=1)  # [b] every token blocked (n-gram blocking): ends here, score -inf
        if dead.any():
            probs[dead] = 0.0
            probs[dead, cfg.eos_id] = 1.0
        drawn = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # [b]
        positional[:, step] = lprobs.gather(1, drawn[:, None]).squeeze(1)
        tokens[:, step + 1] = drawn
        ended = drawn.eq(cfg.eos_id)  # [b]
        if ended.any():
            done = ended.nonzero().squeeze(1)
            length = step + 1  # output tokens including the EOS
            _finish(hyps, (alive[done] // n).tolist(), tokens[done, 1:length], positional[done, :length],
                    positional[done, :length].sum(dim=1).tolist(), length, options, n)
            keep = (~ended).nonzero().squeeze(1)  # [b']
            if keep.numel() == 0:
                break
            enc = enc.index_select(keep)
            state.reorder(keep)
            tokens, positional, alive, max_lens = tokens[keep], positional[keep], alive[keep], max_lens[keep]
    return best_first(hyps, None)
