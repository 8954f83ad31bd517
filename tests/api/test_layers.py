"""multibranch.layers used standalone, as a user builds a model of their own from them: gradients reach
every weight, eval is deterministic, one-branch attention is standard multi-head attention, and a
scheduled rate moves with on_update_start."""

from __future__ import annotations

import torch
from torch import nn

import multibranch.layers as L
from multibranch.layers import DropHead, DynamicConv, MultiBranchAttention, PathDropout, RateConfig


class TinyEncoder(nn.Module):
    """A user's model: embeddings, MAT attention with DropHead over its 2 x 2 heads, a dynamic convolution."""

    def __init__(self, vocab: int = 20, d: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.drophead = DropHead(4, RateConfig(schedule="linear", start=0.0, end=0.4, total=10))
        self.attn = MultiBranchAttention(d, heads=2, branches=2, drophead=self.drophead)
        self.conv = DynamicConv(d, heads=2, kernel_sizes=[3, 5], causal=False)
        self.out = nn.Linear(d, 3)

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # [B, L, d]
        x = x + self.attn(x, key_padding_mask=padding)
        x = x + self.conv(x, padding)
        return self.out(x.mean(dim=1))  # [B, 3]


def test_every_name_is_exported():
    assert len(L.__all__) == len(set(L.__all__))
    for name in L.__all__:
        assert getattr(L, name) is not None, name
    assert L.MultiBranchAttention is L.ParallelAttention


def test_gradients_reach_every_weight_and_eval_is_deterministic():
    torch.manual_seed(0)
    model = TinyEncoder()
    tokens = torch.randint(1, 20, (3, 7))
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[0, 5:] = True
    model.train()
    model(tokens, padding).sum().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(tokens, padding), model(tokens, padding))


def test_one_branch_is_standard_multi_head_attention():
    torch.manual_seed(0)
    ours = MultiBranchAttention(16, heads=4, branches=1).eval()
    theirs = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    with torch.no_grad():
        ours.out_bias.normal_()
        ours.in_proj.bias.normal_()
        theirs.in_proj_weight.copy_(ours.in_proj.weight)  # [3d, d]: Q | K | V, as fairseq and torch lay them out
        theirs.in_proj_bias.copy_(ours.in_proj.bias)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_bias[0])
        x = torch.randn(2, 5, 16)
        padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
        expected, _ = theirs(x, x, x, key_padding_mask=padding, need_weights=False)
        torch.testing.assert_close(ours(x, key_padding_mask=padding), expected, rtol=1e-5, atol=1e-5)


def test_schedules_advance_with_on_update_start():
    model = TinyEncoder()
    assert model.drophead.p == 0.0
    for module in model.modules():  # what the trainer does before each update
        if hasattr(module, "on_update_start"):
            module.on_update_start(5, None, 10)
    assert model.drophead.p == 0.2
    drop = PathDropout(3, RateConfig(schedule="v", start=0.3, end=0.3, warmup=4, total=10))
    rates = []
    for step in (0, 2, 4, 7, 10):
        drop.on_update_start(step, None, None)
        rates.append(round(drop.p, 6))
    assert rates == [0.3, 0.15, 0.0, 0.15, 0.3]  # Scheduled DropHead's V: down to 0 at the warm-up, back up
    drop.eval()
    assert drop(4, torch.device("cpu")) is None  # inactive in eval mode: no scales
