"""MUTE unit diversity (eq. 21, docs/papers.md#mute-diversity) against an independent computation.

The reference below recomputes every MUTE encoder layer by hand in float64 numpy from the layer's
input (captured during a plain `model.encoder(src)` forward) and its own parameters: LN_a, each
unit's multi-head self-attention (softmax(QK^T/sqrt(d_k)) with padded keys masked), the residual,
each unit's FFN with its inner LayerNorm, then eq. 21 with plain loops: for every non-pad position,
the I x I cosine matrix averaged over all I^2 ordered pairs (diagonal included), averaged over the
positions, DIV = exp(-mean). Att Pos. uses the head-averaged attention distributions (vectors over
key positions), Att Sub. the attention outputs before the residual, FFN Sub. the unit outputs F_i.
It uses no helper of the library, only the parameters, and runs on ordinary (random, perturbed)
weights with padded sentences, so none of the three scores sits at a closed-form extreme.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from multibranch.analysis.diversity import split_diversity
from multibranch.config import from_dict
from multibranch.models import ModelConfig, build_model
from multibranch.models.layers.mute import MuteEncoderLayer, encoder_diversity

VARIANTS = ("att_pos", "att_sub", "ffn_sub")


def mute_model(**mute) -> torch.nn.Module:
    """A d=32, 4-head, 2-layer MUTE encoder (4 units), weights perturbed so the units differ clearly."""
    cfg = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 1, "dropout": 0.1,
           "src_vocab_size": 40, "tgt_vocab_size": 40, "norm": "pre",
           "encoder": {"kind": "mute", "units": 4, **mute}, "decoder": {"kind": "transformer"}}
    torch.manual_seed(0)
    model = build_model(from_dict(ModelConfig, cfg))
    with torch.no_grad():
        for name, p in model.encoder.named_parameters():
            if "autoshuffle" not in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def padded_batch(seed: int, lengths: list[int]) -> torch.Tensor:
    """src [B, max(lengths)] of non-special ids with pad (0) after each sentence's length."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (len(lengths), max(lengths)), generator=g)
    for b, n in enumerate(lengths):
        src[b, n:] = 0
    return src


def np64(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def hand_layer(layer: MuteEncoderLayer, x: np.ndarray, pad: np.ndarray) -> dict[str, list]:
    """Per unit i: attention probabilities [B, H, S, S], attention output a_i [B, S, d], F_i [B, S, d]."""
    B, S, d = x.shape
    attn, ffn = layer.self_attn, layer.ffn
    H, dk = attn.heads, attn.head_dim
    n = layer_norm(x, np64(layer.norm.weight), np64(layer.norm.bias), layer.norm.eps)
    probs, outs = [], []
    for u in range(attn.units):
        w, bias = np64(attn.in_weight[u]), np64(attn.in_bias[u])
        q = n @ w[:d].T + bias[:d]
        k = n @ w[d:2 * d].T + bias[d:2 * d]
        v = n @ w[2 * d:].T + bias[2 * d:]
        p = np.zeros((B, H, S, S))
        heads = np.zeros((B, S, d))
        for b in range(B):
            for h in range(H):
                cols = slice(h * dk, (h + 1) * dk)
                scores = q[b, :, cols] @ k[b, :, cols].T / math.sqrt(dk)  # [S, S]
                scores[:, pad[b]] = -np.inf
                e = np.exp(scores - scores.max(-1, keepdims=True))
                p[b, h] = e / e.sum(-1, keepdims=True)
                heads[b, :, cols] = p[b, h] @ v[b, :, cols]
        probs.append(p)
        outs.append(heads @ np64(attn.out_weight[u]).T + np64(attn.out_bias[u]))
    units = []
    for i in range(layer.units):
        a = outs[i if attn.units > 1 else 0]
        f = i if ffn.units > 1 else 0
        s = x + a
        h = layer_norm(s, np64(ffn.norm_weight[f]), np64(ffn.norm_bias[f]), 1e-5)
        h = np.maximum(h @ np64(ffn.fc1_weight[f]).T + np64(ffn.fc1_bias[f]), 0.0)
        units.append(s + h @ np64(ffn.fc2_weight[f]).T + np64(ffn.fc2_bias[f]))
    def per_unit(seq: list) -> list:  # a shared attention serves every unit
        return [seq[i if len(seq) > 1 else 0] for i in range(layer.units)]

    return {"probs": per_unit(probs), "att": per_unit(outs), "units": units}


def eq21(vectors: list[np.ndarray], pad: np.ndarray) -> float:
    """exp(-mean over non-pad positions of the mean over all I^2 ordered pairs of cosine similarity);
    vectors: per unit [B, S, k]."""
    units = len(vectors)
    total, positions = 0.0, 0
    for b in range(pad.shape[0]):
        for s in range(pad.shape[1]):
            if pad[b, s]:
                continue
            pair_sum = 0.0
            for i in range(units):
                for j in range(units):
                    oi, oj = vectors[i][b, s], vectors[j][b, s]
                    pair_sum += float(oi @ oj) / (np.linalg.norm(oi) * np.linalg.norm(oj))
            total += pair_sum / (units * units)
            positions += 1
    return math.exp(-total / positions)


def hand_scores(model: torch.nn.Module, src: torch.Tensor) -> list[dict[str, float]]:
    """Eq. 21 per MUTE encoder layer, from each layer's input in a plain encoder forward."""
    inputs: dict[int, np.ndarray] = {}

    def keep(i: int):
        def hook(module, args) -> None:
            inputs[i] = np64(args[0])
        return hook

    handles = [layer.register_forward_pre_hook(keep(i)) for i, layer in enumerate(model.encoder.layers)]
    try:
        with torch.no_grad():
            model.encoder(src)
    finally:
        for handle in handles:
            handle.remove()
    pad = src.eq(0).numpy()
    out = []
    for i, layer in enumerate(model.encoder.layers):
        if not isinstance(layer, MuteEncoderLayer):
            continue
        unit = hand_layer(layer, inputs[i], pad)
        att_pos = [p.mean(axis=1) for p in unit["probs"]]  # [B, S, S]: head-averaged distributions
        out.append({"att_pos": eq21(att_pos, pad), "att_sub": eq21(unit["att"], pad),
                    "ffn_sub": eq21(unit["units"], pad)})
    return out


CASES = {
    "plain": {},
    "biased_sequential": {"bias_modules": ["identity", "swap", "mask", "disorder"], "fusion": "sequential"},
    "shared_attention": {"shared_attention": True},  # "1 Self + 4 FFN": Att Pos./Sub. identical units
    "shared_ffn": {"shared_ffn": True},  # "4 Self + 1 FFN"
}


@pytest.mark.parametrize("case", list(CASES))
def test_encoder_diversity_equals_the_hand_computation_per_score(case):
    model = mute_model(**CASES[case])
    src = padded_batch(1, [9, 6, 3])
    got = encoder_diversity(model, src)
    expected = hand_scores(model, src)
    assert len(got) == len(expected) == 2
    for layer, (g, e) in enumerate(zip(got, expected)):
        for v in VARIANTS:
            assert g[v] == pytest.approx(e[v], rel=1e-5, abs=1e-6), (case, layer, v, g[v], e[v])
    # ordinary values, not the closed-form extremes exp(-1) (identical units) or exp(-1/I) (orthogonal)
    identical, orthogonal = math.exp(-1), math.exp(-1 / 4)
    for e in expected:
        assert abs(e["ffn_sub"] - identical) > 1e-3 and abs(e["ffn_sub"] - orthogonal) > 1e-3
        if case != "shared_attention":
            for v in ("att_pos", "att_sub"):
                assert abs(e[v] - identical) > 1e-3 and abs(e[v] - orthogonal) > 1e-3


def test_split_diversity_averages_the_hand_scores_over_batches():
    model = mute_model()
    batches = [padded_batch(2, [7, 4]), padded_batch(3, [5, 5, 2, 1])]
    expected = [hand_scores(model, src) for src in batches]  # [batch][layer]{variant}
    rows = split_diversity(model, [SimpleNamespace(src=src) for src in batches])
    assert [row["layer"] for row in rows] == [0, 1]
    for j, row in enumerate(rows):
        for v in VARIANTS:
            mean = sum(e[j][v] for e in expected) / len(expected)
            assert row[v] == pytest.approx(mean, rel=1e-5, abs=1e-6), (j, v)


def test_padding_positions_do_not_count():
    """Changing the embeddings' values only at padded positions' ids leaves every score unchanged:
    pad tokens are neither queries nor keys (pad rows and columns are what the hand reference drops)."""
    model = mute_model()
    src = padded_batch(4, [8, 3])
    before = encoder_diversity(model, src)
    with torch.no_grad():
        model.encoder.embed.tokens.weight[0].normal_()
    after = encoder_diversity(model, src)
    for b, a in zip(before, after):
        for v in VARIANTS:
            assert a[v] == pytest.approx(b[v], rel=1e-6)
