"""Model-level invariants of the standard Transformer and MAT (docs/papers.md#mat)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multibranch.config import from_dict
from multibranch.models import ModelConfig, build_model
from tests.helpers.configs import tiny_model_dict


def _model(**overrides):
    return build_model(from_dict(ModelConfig, tiny_model_dict(**overrides)))


def _inputs(batch=3, src_len=7, tgt_len=5, vocab=40):
    g = torch.Generator().manual_seed(5)
    src = torch.randint(4, vocab, (batch, src_len), generator=g)
    src[0, 5:] = 0  # padding
    prev = torch.randint(4, vocab, (batch, tgt_len), generator=g)
    return src, prev


def _layer(**kw):
    return {"kind": "transformer", **kw}


def _copy_attention(ours, ref: nn.MultiheadAttention) -> None:
    ref.in_proj_weight.copy_(ours.in_proj.weight)
    ref.in_proj_bias.copy_(ours.in_proj.bias)
    ref.out_proj.weight.copy_(ours.out_proj.weight)
    ref.out_proj.bias.copy_(ours.out_bias[0])


def _copy_to_torch_layer(ours, ref: nn.Module) -> None:
    """Our encoder/decoder layer's weights into nn.TransformerEncoderLayer / nn.TransformerDecoderLayer."""
    with torch.no_grad():
        _copy_attention(ours.self_attn, ref.self_attn)
        ref.linear1.weight.copy_(ours.ffn.fc1.weight)
        ref.linear1.bias.copy_(ours.ffn.fc1.bias)
        ref.linear2.weight.copy_(ours.ffn.fc2.weight)
        ref.linear2.bias.copy_(ours.ffn.fc2_bias[0])
        ref.norm1.load_state_dict(ours.self_attn_residual.norm.state_dict())
        if hasattr(ours, "cross_attn"):
            _copy_attention(ours.cross_attn, ref.multihead_attn)
            ref.norm2.load_state_dict(ours.cross_attn_residual.norm.state_dict())
            ref.norm3.load_state_dict(ours.ffn_residual.norm.state_dict())
        else:
            ref.norm2.load_state_dict(ours.ffn_residual.norm.state_dict())


# One-branch layers that must be the standard Transformer layer in eval: the default, and MAT with
# N_a = N_f = 1 and every structured-dropout option (identity in eval; both merges give c = 1).
ONE_BRANCH = {
    "standard": {},
    "mat-1-drop-branch": {"attention_branches": 1, "ffn_branches": 1, "drop_branch": 0.3},
    "mat-1-per-sample-mean-sq": {"attention_branches": 1, "drop_branch": 0.3, "drop_branch_granularity": "sample",
                                 "branch_merge": "mean_sq"},
    "mat-1-head-drop": {"attention_branches": 1, "drop_branch": 0.3, "head_drop": True},
}


def _randomised_one_branch(norm: str, layer: dict):
    model = _model(norm=norm, dropout=0.0, encoder=_layer(**layer), decoder=_layer(**layer))
    with torch.no_grad():  # larger random weights (and non-zero biases) than the init
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.mark.parametrize("layer", ONE_BRANCH.values(), ids=ONE_BRANCH.keys())
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_encoder_layer_equals_torch_transformer_encoder_layer(norm, layer):
    ours = _randomised_one_branch(norm, layer).encoder.layers[0]
    ref = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm == "pre").eval()
    _copy_to_torch_layer(ours, ref)
    x = torch.randn(2, 6, 32)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    with torch.no_grad():
        torch.testing.assert_close(ours(x, pad)[~pad], ref(x, src_key_padding_mask=pad)[~pad], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layer", ONE_BRANCH.values(), ids=ONE_BRANCH.keys())
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_layer_equals_torch_transformer_decoder_layer(norm, layer):
    ours = _randomised_one_branch(norm, layer).decoder.layers[0]
    ref = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm == "pre").eval()
    _copy_to_torch_layer(ours, ref)
    y, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, 3:] = True
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)  # True = may not attend
    with torch.no_grad():
        expected = ref(y, memory, tgt_mask=causal, memory_key_padding_mask=pad)
        torch.testing.assert_close(ours(y, memory, pad), expected, atol=1e-5, rtol=1e-5)


def test_drop_branch_drops_at_rate_rho_per_batch(device):
    torch.manual_seed(3)
    model = _model(encoder=_layer(attention_branches=4, drop_branch=0.25), decoder=_layer()).to(device)
    attention = model.encoder.layers[0].self_attn.train()
    draws = torch.cat([attention.drop_branch(8, device) for _ in range(2000)])  # [2000, 4]
    assert draws.shape == (2000, 4) and draws.device.type == device.type
    assert torch.allclose(draws.unique().cpu(), torch.tensor([0.0, 1 / 0.75]))
    assert abs((draws == 0).float().mean().item() - 0.25) < 0.02


@pytest.mark.parametrize(
    "branches, d, ffn, expected_millions",
    # MAT paper, IWSLT (6+6 layers, 4 heads, joint vocabulary of 10,152 types): N_a/d/d_h -> parameters
    [(1, 256, 1024, 13.7), (2, 256, 1024, 18.4), (3, 256, 2048, 29.4), (1, 512, 1024, 36.7)],
)
def test_parameter_counts_match_the_mat_paper(branches, d, ffn, expected_millions):
    cfg = from_dict(ModelConfig, dict(
        d_model=d, heads=4, ffn_dim=ffn, encoder_layers=6, decoder_layers=6, src_vocab_size=10152, tgt_vocab_size=10152,
        encoder=_layer(attention_branches=branches), decoder=_layer(attention_branches=branches)))
    model = build_model(cfg)
    counts = model.parameter_counts()
    assert round(counts["total"] / 1e6, 1) == expected_millions
    assert counts["total"] == sum(p.numel() for p in model.parameters())


def test_shared_embeddings_are_one_tensor():
    model = _model(share_embeddings="all")
    assert model.encoder.embed.tokens.weight is model.decoder.embed.tokens.weight
    assert model.output_projection is model.decoder.embed.tokens.weight
    untied = _model(share_embeddings="none", tgt_vocab_size=30)
    assert untied.output_projection.shape == (30, 32)
    assert untied.encoder.embed.tokens.weight is not untied.decoder.embed.tokens.weight
