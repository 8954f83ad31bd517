"""The fused output-layer loss against plain autograd on materialised logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from multibranch.train.loss import output_layer_loss, reference_loss


@pytest.mark.parametrize("kind", ["fairseq", "onmt"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_loss_and_gradients_match_autograd(kind, eps, with_bias):
    torch.manual_seed(1)
    N, d, V = 37, 16, 23
    feats = torch.randn(N, d, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, d, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(V, dtype=torch.float64, requires_grad=True) if with_bias else None
    target = torch.randint(1, V, (N,))
    loss, nll = output_layer_loss(feats, weight, bias, target, eps=eps, kind=kind, pad_id=0, chunk=8)
    (2.5 * loss).backward()
    grads = [feats.grad.clone(), weight.grad.clone()] + ([bias.grad.clone()] if with_bias else [])
    for t in [feats, weight] + ([bias] if with_bias else []):
        t.grad = None
    logits = F.linear(feats, weight, bias)
    ref = reference_loss(logits, target, eps, kind, pad_id=0)
    (2.5 * ref).backward()
    ref_grads = [feats.grad, weight.grad] + ([bias.grad] if with_bias else [])
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, F.cross_entropy(logits, target, reduction="sum"))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_fairseq_form_is_mixture_of_nll_and_uniform():
    torch.manual_seed(2)
    logits = torch.randn(5, 11, dtype=torch.float64)
    target = torch.randint(0, 11, (5,))
    lp = logits.log_softmax(-1)
    expected = (0.9 * -lp.gather(-1, target[:, None]).squeeze(-1) + 0.1 * -lp.mean(-1)).sum()
    # features = logits and an identity output weight make the fused layer's logits exactly `logits`
    loss, _ = output_layer_loss(logits, torch.eye(11, dtype=torch.float64), None, target, eps=0.1)
    torch.testing.assert_close(loss, expected)


def test_no_grad_path_equals_grad_path_value():
    feats = torch.randn(9, 8)
    weight = torch.randn(13, 8)
    target = torch.randint(0, 13, (9,))
    a = output_layer_loss(feats, weight, None, target)
    b = output_layer_loss(feats.requires_grad_(), weight, None, target)
    torch.testing.assert_close(a[0], b[0].detach())
