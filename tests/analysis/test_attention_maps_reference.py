"""Decoder self-attention and cross-attention maps of `analysis/attention_maps.py` against a hand
computation: softmax(Q K^T / sqrt(d_k)) per head, in float64, from the module's own in_proj weights
and the inputs it receives in the model's forward (the decoder states; for cross-attention the
encoder output), with the causal mask for decoder self-attention (key j > query i never attended)
and the source padding mask for cross-attention (empty for the one sentence `capture_maps` takes).
Tolerance 1e-5: the library computes in float32 (a missing 1/sqrt(d_k), a shifted mask or a wrong
head order moves probabilities by > 1e-2). The encoder self-attention map has its own hand check in the `analyze attention` CLI tests.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from multibranch.analysis.attention_maps import Selection, capture_maps, select_maps
from multibranch.analysis.heads import attention_sites
from multibranch.experiment import resolve_config
from multibranch.models import build_model

SRC = [5, 9, 14, 7, 22, 31, 6]  # EOS is appended by capture_maps
TGT = [8, 17, 4, 26, 11]  # BOS is prepended by capture_maps


def model_for(preset: str) -> torch.nn.Module:
    cfg = dataclasses.replace(resolve_config(preset).model, src_vocab_size=40, tgt_vocab_size=40)
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():  # larger, less uniform weights than the init: maps far from flat
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def module_inputs(model: torch.nn.Module, module: torch.nn.Module) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """(query input [L, d], memory [S, d] or None, keyword arguments) of `module` in a plain forward."""
    seen = {}

    def hook(mod, args, kwargs) -> None:
        seen.setdefault("args", args)
        seen.setdefault("kwargs", kwargs)

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(torch.tensor([[*SRC, model.config.eos_id]]), torch.tensor([[model.config.bos_id, *TGT]]),
                  features_only=True)
    finally:
        handle.remove()
    args, kwargs = seen["args"], seen["kwargs"]
    memory = args[1] if len(args) > 1 else kwargs.get("memory")
    def as_np(t: torch.Tensor) -> np.ndarray:
        return t[0].detach().double().numpy()

    return as_np(args[0]), None if memory is None else as_np(memory), kwargs


def hand_maps(module: torch.nn.Module, x: np.ndarray, memory: np.ndarray | None, causal: bool,
              key_padding: np.ndarray | None = None) -> np.ndarray:
    """[H, L, S] attention probabilities computed with plain loops over heads and query rows."""
    H, dk = module.total_heads, module.head_dim
    w = module.in_proj.weight.detach().double().numpy()
    b = module.in_proj.bias.detach().double().numpy()
    keys_from = x if memory is None else memory
    q = x @ w[: H * dk].T + b[: H * dk]  # [L, H*d_k]
    k = keys_from @ w[H * dk: 2 * H * dk].T + b[H * dk: 2 * H * dk]  # [S, H*d_k]
    L, S = q.shape[0], k.shape[0]
    out = np.zeros((H, L, S))
    for h in range(H):
        qh, kh = q[:, h * dk:(h + 1) * dk], k[:, h * dk:(h + 1) * dk]
        for i in range(L):
            scores = np.array([qh[i] @ kh[j] / math.sqrt(dk) for j in range(S)])
            allowed = np.ones(S, dtype=bool)
            if causal:
                allowed[i + 1:] = False
            if key_padding is not None:
                allowed &= ~key_padding
            scores = np.where(allowed, scores, -np.inf)
            e = np.exp(scores - scores.max())
            out[h, i] = e / e.sum()
    return out


@pytest.mark.parametrize("preset", ["transformer-tiny", "mat-tiny"])
@pytest.mark.parametrize("role", ["decoder_self", "cross"])
def test_decoder_maps_equal_the_hand_computation(preset, role):
    model = model_for(preset)
    sites = [s for s in attention_sites(model) if s.role == role]
    assert len(sites) == model.config.decoder_layers
    maps = capture_maps(model, SRC, TGT)
    L, S = len(TGT) + 1, len(SRC) + 1
    for site in sites:
        x, memory, kwargs = module_inputs(model, site.module)
        if role == "decoder_self":
            assert memory is None and kwargs.get("causal") is True
            expected = hand_maps(site.module, x, None, causal=True)
            assert expected.shape == (site.heads, L, L)
            assert np.all(np.triu(expected, k=1) == 0)  # nothing from the future
        else:
            encoder_out = model.encoder(torch.tensor([[*SRC, model.config.eos_id]]))
            assert np.allclose(memory, encoder_out.out[0].detach().double().numpy(), atol=1e-6)
            padding = kwargs["key_padding_mask"][0].numpy()
            assert not padding.any()
            expected = hand_maps(site.module, x, memory, causal=False, key_padding=padding)
            assert expected.shape == (site.heads, L, S)
        got = maps[site.name].double().numpy()
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, atol=1e-5, err_msg=site.name)
        # far from flat rows, so a wrong mask or a missing 1/sqrt(d_k) would show
        assert expected.max() > 0.5

        [selected] = select_maps([site], maps, Selection(roles=(role,)))
        assert [title for title, _ in selected["panels"]] == [f"head {h}" for h in range(site.heads)]
        for h, (_, panel) in enumerate(selected["panels"]):
            np.testing.assert_allclose(panel.double().numpy(), expected[h], atol=1e-5)


def test_mat_decoder_branch_panels_are_the_mean_of_their_hand_heads():
    model = model_for("mat-tiny")
    maps = capture_maps(model, SRC, TGT)
    for role in ("decoder_self", "cross"):
        for site in (s for s in attention_sites(model) if s.role == role):
            x, memory, _ = module_inputs(model, site.module)
            expected = hand_maps(site.module, x, memory, causal=role == "decoder_self")
            m = site.module.heads
            for branch in range(site.module.branches):
                [selected] = select_maps([site], maps, Selection(roles=(role,), branch=branch))
                [(title, panel)] = selected["panels"]
                assert title == f"branch {branch}"
                np.testing.assert_allclose(panel.double().numpy(), expected[branch * m:(branch + 1) * m].mean(0),
                                           atol=1e-5)


def test_cross_attention_hand_mask_matches_the_module_on_a_padded_batch():
    """The hand reference's masking is the module's: on a padded two-sentence batch the probe sees
    zero weight on the padded source positions and the same rows as the hand computation."""
    model = model_for("transformer-tiny")
    eos, bos = model.config.eos_id, model.config.bos_id
    src = torch.tensor([[*SRC, eos], [*SRC[:3], eos] + [model.config.pad_id] * 4])
    prev = torch.tensor([[bos, *TGT], [bos, *TGT]])
    site = next(s for s in attention_sites(model) if s.role == "cross" and s.layer == 1)
    seen, inputs = [], {}
    site.module.attention_probe = lambda probs: seen.append(probs.detach())

    def hook(mod, args, kwargs) -> None:
        inputs.update(x=args[0], memory=args[1], padding=kwargs["key_padding_mask"])

    handle = site.module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(src, prev, features_only=True)
    finally:
        handle.remove()
        site.module.attention_probe = None
    padding = inputs["padding"][1].numpy()
    assert padding.sum() == 4
    expected = hand_maps(site.module, inputs["x"][1].double().numpy(), inputs["memory"][1].double().numpy(),
                         causal=False, key_padding=padding)
    np.testing.assert_allclose(seen[0][1].double().numpy(), expected, atol=1e-5)
    assert np.all(expected[:, :, padding] == 0)
