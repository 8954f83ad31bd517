"""MUTE bias modules (MUTE §3.2, eq. 11; docs/papers.md#mute-swap-and-disorder): per-unit noise on the unit axis of a multi-unit layer.

Each unit i of a MUTE encoder layer reads `Bias_i(n)`, a noised copy of the layer-normalised input
n [B, S, d] (paper eq. 11). Every noise is expressed as a source-position map plus a mask:

    u_i[b, s] = e_mask            if masked_i[b, s]
              = n[b, index_i[b, s]] otherwise

so all units are noised with one gather and one `where` (no loop over units or positions).

- identity: index = s.
- swap (range R): once per sentence, p1 uniform among real tokens, delta uniform in {+-1..+-R},
  p2 = p1 + delta clipped to the real tokens; rows p1 and p2 exchange places [D].
- disorder (window W): once per sentence, a window of W consecutive real tokens is shuffled by a
  uniform random permutation; sentences with fewer than W real tokens are left unchanged [D].
- mask: "bernoulli" replaces each real token independently with probability `mask_prob` (the
  reference's 10%, pads excluded [D]); "one" replaces exactly one real token (the paper's text).

"Real tokens" are the non-pad positions in order (any padding layout works). A switch enables the
noise with probability p_beta (one torch coin per layer per forward, shared by the batch); the noise
is off in eval. p_beta is a scheduled rate (`on_update_start`), 1.0 meaning "always noise".

The coin is tossed on the device and decides with `where` (the noise is always drawn; a coin that
comes up "off" makes every unit read n itself), so a training forward reads nothing back and one
captured graph serves both outcomes; the forward reads p_beta from a 0-d device tensor
(`switch_value`, a non-persistent buffer filled in place by `on_update_start`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from multibranch.config import ConfigError
from multibranch.hooks import ParamGroupSpec
from multibranch.schedules import RateConfig, ScheduledRate

BiasKind = Literal["identity", "swap", "disorder", "mask"]
BIAS_KINDS: tuple[str, ...] = ("identity", "swap", "disorder", "mask")


@dataclass
class SwitchRateConfig(RateConfig):
    """p_beta, the probability of enabling the bias modules; unlike a dropout rate it may be 1.0."""

    def validate(self) -> None:
        for name in ("rate", "start", "end"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name}={value} must be in [0, 1]")


# ---- pure index/mask samplers: padding_mask [B, S] bool (True at padding) ------------------------


def _real_positions(padding_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(positions of the real tokens first, in order [B, S]; number of real tokens [B])."""
    order = torch.argsort(padding_mask.to(torch.int8), dim=1, stable=True)  # [B, S]
    return order, (~padding_mask).sum(dim=1)


def _uniform_int(high: Tensor, generator: torch.Generator | None) -> Tensor:
    """Uniform integers in [0, high) elementwise (0 where high <= 0)."""
    u = torch.rand(high.shape, generator=generator, device=high.device)
    return (u * high.clamp_min(1)).long().clamp_max(high.clamp_min(1) - 1)


def identity_index(padding_mask: Tensor) -> Tensor:
    """[B, S] long: every position reads itself."""
    B, S = padding_mask.shape
    return torch.arange(S, device=padding_mask.device).expand(B, S).clone()


def swap_index(padding_mask: Tensor, max_distance: int = 3, generator: torch.Generator | None = None) -> Tensor:
    """[B, S] long: exchange one pair of real tokens at most `max_distance` apart, once per sentence."""
    order, lengths = _real_positions(padding_mask)
    B = padding_mask.shape[0]
    r1 = _uniform_int(lengths, generator)  # [B] rank of p1 among the real tokens
    magnitude = 1 + _uniform_int(torch.full_like(lengths, max_distance), generator)
    sign = 2 * _uniform_int(torch.full_like(lengths, 2), generator) - 1
    r2 = torch.minimum((r1 + sign * magnitude).clamp_min(0), (lengths - 1).clamp_min(0))  # clipped to real tokens
    p1, p2 = order.gather(1, r1[:, None]), order.gather(1, r2[:, None])  # [B, 1]
    index = identity_index(padding_mask)
    if B:
        index.scatter_(1, p1, p2)
        index.scatter_(1, p2, p1)
    return index


def disorder_index(padding_mask: Tensor, window: int = 3, generator: torch.Generator | None = None) -> Tensor:
    """[B, S] long: shuffle one window of `window` consecutive real tokens per sentence (if it fits)."""
    order, lengths = _real_positions(padding_mask)
    B, S = padding_mask.shape
    index = identity_index(padding_mask)
    if S < window or B == 0:
        return index
    start = _uniform_int(lengths - window + 1, generator)  # [B] first rank of the window
    perm = torch.rand(B, window, generator=generator, device=padding_mask.device).argsort(dim=1)  # [B, W]
    span = torch.arange(window, device=padding_mask.device)
    fits = (lengths >= window)[:, None]  # [B, 1]; short sentences keep the identity
    dst_rank = (start[:, None] + span).clamp_max(S - 1)  # [B, W]
    src_rank = torch.where(fits, start[:, None] + perm, dst_rank).clamp_max(S - 1)
    index.scatter_(1, order.gather(1, dst_rank), order.gather(1, src_rank))
    return index


def bernoulli_mask(padding_mask: Tensor, prob: float, generator: torch.Generator | None = None) -> Tensor:
    """[B, S] bool: each real token independently with probability `prob`."""
    u = torch.rand(padding_mask.shape, generator=generator, device=padding_mask.device)
    return (u < prob) & ~padding_mask


def one_token_mask(padding_mask: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """[B, S] bool: exactly one real token per sentence (none for an all-pad row)."""
    order, lengths = _real_positions(padding_mask)
    pos = order.gather(1, _uniform_int(lengths, generator)[:, None])  # [B, 1]
    hit = torch.zeros_like(padding_mask).scatter_(1, pos, True)
    return hit & (lengths > 0)[:, None]


# ---- the module ------------------------------------------------------------------------------


class BiasNoise(nn.Module):
    """Bias_1..Bias_I of one MUTE layer: n [B, S, d] -> unit inputs [I, B, S, d] (or [1, B, S, d] when off).

    Args:
        kinds: the bias module of each unit, e.g. ["identity", "swap", "mask", "disorder"].
        d_model: width d (for the learned mask embedding e_mask, one per layer).
        switch: p_beta, probability of enabling the noise for a forward (scheduled).
        swap_range, disorder_window: R and W above.
        mask_mode, mask_prob: "bernoulli" with `mask_prob`, or "one" token per sentence.
    """

    may_skip_parameters = True  # the mask embedding gets no gradient when the switch is off

    def __init__(
        self,
        kinds: list[str],
        d_model: int,
        switch: RateConfig | float = 0.85,
        swap_range: int = 3,
        disorder_window: int = 3,
        mask_mode: Literal["bernoulli", "one"] = "bernoulli",
        mask_prob: float = 0.1,
    ):
        super().__init__()
        unknown = [k for k in kinds if k not in BIAS_KINDS]
        if unknown:
            raise ValueError(f"unknown bias module {unknown[0]!r}; known: {', '.join(BIAS_KINDS)}")
        self.kinds = list(kinds)
        self.switch = ScheduledRate(switch)
        # p_beta as the forward reads it: a device scalar changed in place, not in the state dict
        self.register_buffer("switch_value", torch.tensor(self.switch.value, dtype=torch.float32), persistent=False)
        self.swap_range, self.disorder_window = swap_range, disorder_window
        self.mask_mode, self.mask_prob = mask_mode, mask_prob
        self.mask_embedding = nn.Parameter(torch.empty(d_model)) if "mask" in self.kinds else None
        self.reset_parameters()

    def reset_parameters(self, scheme: str = "xavier") -> None:
        """e_mask ~ N(0, d^-1/2) whatever the model's scheme (excluded from Glorot init)."""
        if self.mask_embedding is not None:
            nn.init.normal_(self.mask_embedding, std=self.mask_embedding.shape[0] ** -0.5)

    def on_update_start(self, step: int, warmup: int | None, total: int | None) -> None:
        self.switch.update(step, warmup, total)
        with torch.no_grad():
            self.switch_value.fill_(self.switch.value)

    def parameter_groups(self) -> list[ParamGroupSpec]:
        """e_mask takes no weight decay."""
        if self.mask_embedding is None:
            return []
        return [ParamGroupSpec("mute_no_decay", [self.mask_embedding], weight_decay=0.0)]

    @property
    def units(self) -> int:
        return len(self.kinds)

    def sample(self, padding_mask: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor | None]:
        """Draw every unit's noise: (index [I, B, S] long, masked [I, B, S] bool or None).

        Units of the same kind are drawn together (one call on I_kind * B rows), then stacked back in unit
        order (views, no index tensors built on the host).
        """
        B, S = padding_mask.shape
        identity = identity_index(padding_mask)  # [B, S]
        indices: list[Tensor] = [identity] * self.units
        hits: list[Tensor | None] = [None] * self.units
        for kind in dict.fromkeys(self.kinds):  # distinct kinds, in unit order
            units = [i for i, k in enumerate(self.kinds) if k == kind]
            if kind == "identity":
                continue
            rows = padding_mask.repeat(len(units), 1)  # [I_kind * B, S]
            if kind == "swap":
                drawn = swap_index(rows, self.swap_range, generator).view(len(units), B, S)
            elif kind == "disorder":
                drawn = disorder_index(rows, self.disorder_window, generator).view(len(units), B, S)
            else:  # mask
                if self.mask_mode == "one":
                    hit = one_token_mask(rows, generator)
                else:
                    hit = bernoulli_mask(rows, self.mask_prob, generator)
                for j, unit in enumerate(units):
                    hits[unit] = hit.view(len(units), B, S)[j]
                continue
            for j, unit in enumerate(units):
                indices[unit] = drawn[j]
        index = torch.stack(indices)  # [I, B, S]
        masked = None
        if any(h is not None for h in hits):
            nothing = torch.zeros_like(padding_mask)
            masked = torch.stack([nothing if h is None else h for h in hits])  # [I, B, S]
        return index, masked

    def apply(self, n: Tensor, index: Tensor, masked: Tensor | None) -> Tensor:
        """n [B, S, d], index [I, B, S], masked [I, B, S] -> unit inputs [I, B, S, d]."""
        U, (B, S, d) = index.shape[0], n.shape
        u = n[None].expand(U, B, S, d).gather(2, index[..., None].expand(U, B, S, d))  # [I, B, S, d]
        if masked is not None and self.mask_embedding is not None:
            u = torch.where(masked[..., None], self.mask_embedding.to(u.dtype), u)
        return u

    def forward(self, n: Tensor, padding_mask: Tensor) -> Tensor:
        """n [B, S, d] -> [I, B, S, d] noised unit inputs (every unit reads n when this forward's coin says
        off), or n[None] ([1, B, S, d]) in eval mode or when p_beta is 0 at every step (config)."""
        if not self.training or not self.switch.active:
            return n[None]
        index, masked = self.sample(padding_mask)
        on = torch.rand((), device=n.device) < self.switch_value.to(n.device)  # one coin, shared by the batch
        index = torch.where(on, index, identity_index(padding_mask))  # off: every unit reads n
        if masked is not None:
            masked = masked & on
        return self.apply(n, index, masked)

    def extra_repr(self) -> str:
        return (
            f"kinds={self.kinds}, switch={self.switch.config}, swap_range={self.swap_range}, "
            f"disorder_window={self.disorder_window}, mask={self.mask_mode}:{self.mask_prob}"
        )
