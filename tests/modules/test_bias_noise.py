"""MUTE bias modules (docs/papers.md#mute-swap-and-disorder): noise only among real tokens, right rates,
torch RNG only."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from multibranch.config import ConfigError, from_dict
from multibranch.modules.bias_noise import (
    BiasNoise,
    SwitchRateConfig,
    bernoulli_mask,
    disorder_index,
    identity_index,
    one_token_mask,
    swap_index,
)
from multibranch.schedules import RateConfig


def _padding(lengths: list[int], width: int, left: bool = False) -> torch.Tensor:
    """[B, width] bool padding mask for the given real lengths (right- or left-padded)."""
    pos = torch.arange(width)[None, :]
    lengths_t = torch.tensor(lengths)[:, None]
    return pos < width - lengths_t if left else pos >= lengths_t


LENGTHS = [1, 2, 3, 4, 7, 12, 12, 5, 0, 9]


@pytest.mark.parametrize("left", [False, True])
def test_swap_exchanges_one_pair_of_real_tokens_within_range(left):
    pad = _padding(LENGTHS, 12, left).repeat(30, 1)  # [300, 12]
    g = torch.Generator().manual_seed(1)
    index = swap_index(pad, max_distance=3, generator=g)
    ident = identity_index(pad)
    moved_any = False
    for b in range(pad.shape[0]):
        changed = (index[b] != ident[b]).nonzero().flatten()
        assert len(changed) in (0, 2), "exactly one pair (or nothing, when clipped) per sentence"
        assert not pad[b, changed].any(), "only real tokens move"
        assert not pad[b, index[b][~pad[b]]].any(), "real tokens read real tokens"
        assert torch.equal(index[b][pad[b]], ident[b][pad[b]]), "pads untouched"
        if len(changed) == 2:
            p1, p2 = changed.tolist()
            moved_any = True
            assert index[b, p1] == p2 and index[b, p2] == p1
            assert 1 <= p2 - p1 <= 3
        if int((~pad[b]).sum()) < 2:
            assert len(changed) == 0
    assert moved_any


def test_swap_distance_distribution_covers_the_range():
    pad = _padding([40] * 2000, 40)
    index = swap_index(pad, max_distance=3, generator=torch.Generator().manual_seed(2))
    changed = index != identity_index(pad)
    rows = changed.any(1)
    distances = {int(c.nonzero().flatten()[1] - c.nonzero().flatten()[0]) for c in changed[rows]}
    assert distances == {1, 2, 3}
    assert rows.float().mean() > 0.9, "clipping at the sentence ends is rare in long sentences"


@pytest.mark.parametrize("left", [False, True])
def test_disorder_permutes_one_window_of_real_tokens(left):
    pad = _padding(LENGTHS, 12, left).repeat(60, 1)  # [600, 12]
    index = disorder_index(pad, window=3, generator=torch.Generator().manual_seed(3))
    ident = identity_index(pad)
    eligible, permuted, moved, ends = 0, 0, Counter(), set()
    for b in range(pad.shape[0]):
        real = (~pad[b]).nonzero().flatten()  # real positions, in order
        assert torch.equal(index[b][pad[b]], ident[b][pad[b]]), "pads untouched"
        assert torch.equal(index[b].sort().values, ident[b]), "a permutation of the positions"
        if len(real) < 3:
            assert torch.equal(index[b], ident[b]), "sentences shorter than the window are skipped"
            continue
        eligible += 1
        changed = (index[b] != ident[b]).nonzero().flatten()
        assert len(changed) in (0, 2, 3), "a permutation of 3 moves 0, 2 or 3 tokens"
        if len(changed) == 0:
            continue
        permuted += 1
        assert not pad[b, changed].any(), "only real tokens move"
        ranks = [int((real == p).nonzero()) for p in changed]  # ranks among the real tokens
        assert max(ranks) - min(ranks) <= 2, "inside one window of 3 consecutive real tokens"
        assert torch.equal(index[b, changed].sort().values, changed), "the window is permuted in place"
        moved[len(changed), max(ranks) - min(ranks)] += 1  # (tokens moved, span)
        ends |= {"first"} if 0 in ranks else set()
        ends |= {"last"} if len(real) - 1 in ranks else set()
    # a uniform permutation of 3 moves nothing w.p. 1/6, all three (a 3-cycle) w.p. 2/6, and swaps a
    # pair w.p. 3/6 (adjacent pairs 2/6, the two ends 1/6)
    assert eligible > 300
    for key, p in {(3, 2): 2 / 6, (2, 1): 2 / 6, (2, 2): 1 / 6}.items():
        assert abs(moved[key] / eligible - p) < 0.06, key
    assert abs(permuted / eligible - 5 / 6) < 0.06
    assert ends == {"first", "last"}, "windows reach both ends of the sentence"


def test_disorder_window_longer_than_batch_is_identity():
    pad = _padding([2, 1], 2)
    assert torch.equal(disorder_index(pad, window=3), identity_index(pad))


@pytest.mark.parametrize("left", [False, True])
def test_bernoulli_mask_hits_only_real_tokens_at_the_rate(left):
    pad = _padding([30, 10, 0, 25], 30, left).repeat(300, 1)
    hit = bernoulli_mask(pad, 0.1, generator=torch.Generator().manual_seed(4))
    assert not (hit & pad).any()
    rate = hit.sum().item() / (~pad).sum().item()
    assert abs(rate - 0.1) < 0.01


def test_one_token_mask_hits_exactly_one_real_token():
    pad = _padding(LENGTHS, 12, left=True)
    hit = one_token_mask(pad, generator=torch.Generator().manual_seed(5))
    assert not (hit & pad).any()
    assert hit.sum(1).tolist() == [1 if n > 0 else 0 for n in LENGTHS]


def _rows(B: int, S: int, d: int) -> torch.Tensor:
    """Distinct rows: x[b, s] = b * 100 + s in every channel."""
    return (torch.arange(B)[:, None, None] * 100 + torch.arange(S)[None, :, None]).float().expand(B, S, d).clone()


def test_bias_noise_units_preserve_rows_and_use_the_mask_embedding():
    kinds = ["identity", "swap", "mask", "disorder", "swap"]
    noise = BiasNoise(kinds, 6, switch=1.0, mask_mode="one")
    pad = _padding(LENGTHS, 12)
    n = _rows(len(LENGTHS), 12, 6)
    u = noise.train()(n, pad)  # [5, B, S, d]
    assert u.shape == (5, len(LENGTHS), 12, 6)
    assert torch.equal(u[0], n), "identity unit"
    for unit in (1, 3, 4):  # permutations of the real rows, per sentence
        for b in range(len(LENGTHS)):
            real = ~pad[b]
            assert torch.equal(u[unit, b][real].sort(0).values, n[b][real].sort(0).values)
            assert torch.equal(u[unit, b][~real], n[b][~real])
    masked = (u[2] == noise.mask_embedding.detach()).all(-1)  # [B, S]
    assert masked.sum(1).tolist() == [1 if k > 0 else 0 for k in LENGTHS]
    assert torch.equal(u[2][~masked], n[~masked])
    assert not torch.equal(u[1], u[4]), "two swap units draw independently"


def test_eval_and_zero_switch_are_noise_free_and_switch_rate_is_per_forward():
    pad = _padding([8, 8], 8)
    n = _rows(2, 8, 4)
    noise = BiasNoise(["identity", "swap", "disorder", "mask"], 4, switch=0.85, mask_prob=1.0)
    assert torch.equal(noise.eval()(n, pad), n[None])
    noise.train()
    torch.manual_seed(0)
    outs = [noise(n, pad) for _ in range(600)]
    assert all(u.shape == (4, 2, 8, 4) for u in outs), "one shape whatever the coin (one graph for both)"
    noisy = [not torch.equal(u, n[None].expand_as(u)) for u in outs]  # on: the mask unit masks every token
    assert abs(sum(noisy) / 600 - 0.85) < 0.05, "one coin per forward, probability p_beta"
    assert all(torch.equal(u[3], n) != on for u, on in zip(outs, noisy)), "off: every unit reads n"
    off = BiasNoise(["swap"], 4, switch=0.0).train()
    assert torch.equal(off(n, pad), n[None])


def test_noise_uses_the_torch_rng_only():
    pad = _padding([9, 5, 7], 9)
    n = torch.randn(3, 9, 8)
    noise = BiasNoise(["swap", "disorder", "mask"], 8, switch=0.5).train()
    state = random.getstate()
    torch.manual_seed(11)
    a = [noise(n, pad) for _ in range(5)]
    torch.manual_seed(11)
    b = [noise(n, pad) for _ in range(5)]
    assert random.getstate() == state
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_switch_is_a_schedule_and_may_be_one():
    cfg = from_dict(SwitchRateConfig, {"schedule": "linear", "start": 0.0, "end": 1.0})
    noise = BiasNoise(["swap"], 4, switch=cfg)
    noise.on_update_start(0, 10, 100)
    assert noise.switch.value == 0.0
    noise.on_update_start(50, 10, 100)
    assert noise.switch.value == pytest.approx(0.5)
    noise.on_update_start(100, 10, 100)
    assert noise.switch.value == 1.0
    assert from_dict(SwitchRateConfig, {"rate": 1.0}).rate == 1.0
    with pytest.raises(ConfigError):
        from_dict(SwitchRateConfig, {"rate": 1.5})
    with pytest.raises(ConfigError):
        from_dict(RateConfig, {"rate": 1.0})  # a dropout rate stays < 1


def test_mask_embedding_init_and_no_weight_decay():
    torch.manual_seed(0)
    noise = BiasNoise(["identity", "mask"], 256)
    assert noise.mask_embedding.std().item() == pytest.approx(256**-0.5, rel=0.2)
    (group,) = noise.parameter_groups()
    assert group.weight_decay == 0.0 and group.params == [noise.mask_embedding]
    assert BiasNoise(["swap"], 8).mask_embedding is None
    with pytest.raises(ValueError, match="unknown bias module"):
        BiasNoise(["shuffle"], 8)


def test_gradients_reach_the_input_and_the_mask_embedding():
    pad = _padding([6, 4], 6)
    n = torch.randn(2, 6, 8, requires_grad=True)
    noise = BiasNoise(["swap", "mask"], 8, switch=1.0, mask_prob=0.5).train()
    torch.manual_seed(3)
    noise(n, pad).sum().backward()
    assert n.grad is not None and noise.mask_embedding.grad is not None
    assert noise.mask_embedding.grad.abs().sum() > 0
