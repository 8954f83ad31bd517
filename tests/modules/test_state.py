"""DecoderState: deferred reorders equal reorders applied at once (the plain copy-per-reorder state)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from multibranch.modules.state import DecoderState


class EagerState:
    """The plain state: every reorder copies every cache at once; growing caches are concatenated."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.static: set[str] = set()

    def reorder(self, order, sources=None):
        for key, value in self.tensors.items():
            self.tensors[key] = value.index_select(0, sources if sources is not None and key in self.static else order)

    def reorder_within_sentences(self, order):
        for key, value in self.tensors.items():
            if key not in self.static:
                self.tensors[key] = value.index_select(0, order)


ACTIONS = ["append", "get", "within", "drop", "set"]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**16), st.lists(st.sampled_from(ACTIONS), max_size=12))
def test_deferred_reorders_equal_eager_reorders(seed, actions):
    """Random sequences of appends (dims 1 and 2), reads, reorders within sentences, sentence drops and
    overwrites: every cache reads back as the eager state's copy."""
    _check_actions(seed, actions, torch.device("cpu"))


def test_deferred_reorders_equal_eager_reorders_on_each_device(device):
    """A fixed sequence of every action, twice over, on each device (`append` writes through `out=` into a
    slice of the grown cache: a kernel of its own on CUDA)."""
    _check_actions(7, ["append", "within", "append", "get", "drop", "append", "within", "within", "append", "set",
                       "append", "drop", "get", "append"] * 2, device)


def _check_actions(seed: int, actions: list[str], device: torch.device) -> None:
    g = torch.Generator().manual_seed(seed)
    per, sentences = 3, 4  # hypotheses per sentence, sentences
    lazy, eager = DecoderState(), EagerState()

    def both_set(key, value, static=False):
        value = value.to(device)
        lazy.set(key, value, static)
        eager.tensors[key] = value
        if static:
            eager.static.add(key)

    rows = per * sentences
    both_set("memory", torch.randn(sentences, 2, generator=g), static=True)
    both_set("grow1", torch.randn(rows, 1, 2, generator=g))
    both_set("grow2", torch.randn(rows, 2, 1, 3, generator=g))
    for action in actions:
        if action == "append":
            for key, dim, shape in (("grow1", 1, (rows, 1, 2)), ("grow2", 2, (rows, 2, 1, 3))):
                new = torch.randn(*shape, generator=g).to(device)
                got = lazy.append(key, new, dim)
                eager.tensors[key] = torch.cat([eager.tensors[key], new], dim=dim)
                assert torch.equal(got, eager.tensors[key])
        elif action == "get":
            for key in ("memory", "grow1", "grow2"):
                assert torch.equal(lazy.get(key), eager.tensors[key])
        elif action == "set":
            value = torch.randn(rows, 1, 2, generator=g)
            both_set("grow1", value)
        elif action == "within":  # each row takes a random row of its own sentence
            order = (torch.arange(rows) // per * per + torch.randint(0, per, (rows,), generator=g))
            order = order.to(device)
            lazy.reorder_within_sentences(order)
            eager.reorder_within_sentences(order)
        elif action == "drop" and sentences > 1:  # the first sentence is done
            keep = torch.arange(1, sentences)
            order = (keep[:, None] * per + torch.randperm(per, generator=g)[None, :]).reshape(-1)
            order, keep = order.to(device), keep.to(device)
            lazy.reorder(order, sources=keep)
            eager.reorder(order, sources=keep)
            sentences -= 1
            rows = per * sentences
    for key in ("memory", "grow1", "grow2"):
        assert torch.equal(lazy.get(key), eager.tensors[key])


def test_a_growing_cache_is_copied_once_per_step():
    """append after a reorder makes one new tensor (the reordered past and the new step together)."""
    state = DecoderState()
    state.set("k", torch.arange(6.0).view(3, 2, 1))
    state.reorder_within_sentences(torch.tensor([2, 2, 0]))
    assert state.tensors["k"][0, 0, 0].item() == 0.0  # not copied yet
    grown = state.append("k", torch.full((3, 2, 1), -1.0), dim=2)
    assert grown.tolist() == [[[4.0, -1.0], [5.0, -1.0]], [[4.0, -1.0], [5.0, -1.0]], [[0.0, -1.0], [1.0, -1.0]]]
