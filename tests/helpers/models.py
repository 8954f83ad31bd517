"""Small random translation models for tests: every parameter moved off its initial value (zero biases,
identity-like norms) so that a wrong fold, cache or kernel shows in the outputs."""

from __future__ import annotations

import torch

from multibranch.config import from_dict
from multibranch.models import ModelConfig, build_model


def noisy_model(vocab: int, noise: float, seed: int, **overrides) -> torch.nn.Module:
    """A 2+2-layer model (d=24, 3 heads unless `overrides` say otherwise) in eval mode, its parameters each
    moved by N(0, noise^2) (seeded)."""
    values = {"d_model": 24, "heads": 3, "ffn_dim": 36, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0,
              "max_positions": 64, "src_vocab_size": vocab, "tgt_vocab_size": vocab, **overrides}
    torch.manual_seed(seed)
    model = build_model(from_dict(ModelConfig, values))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise)
    return model.eval()


def noisy_mat_model(vocab: int) -> torch.nn.Module:
    """A random MAT model (2 branches of 2 heads in every attention, d=16, 1+2 layers) in eval mode, as
    `noisy_model` makes them."""
    branched = {"kind": "transformer", "attention_branches": 2}
    return noisy_model(vocab, 0.3, 3, d_model=16, heads=2, ffn_dim=32, encoder_layers=1, decoder_layers=2,
                       encoder=branched, decoder=branched)
