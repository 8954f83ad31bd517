"""Tiny random models of every layer kind, and random source batches, for the fixed-shape decoding tests
(the beam search and the sampler)."""

from __future__ import annotations

import torch

from multibranch.config import from_dict
from multibranch.models import ModelConfig, build_model

PAD, EOS, VOCAB = 0, 3, 40


def both_sides(layer: dict) -> dict:
    """The same layer settings for the encoder and the decoder (model config overrides)."""
    return {"encoder": dict(layer), "decoder": dict(layer)}


KINDS = {
    "transformer": {},
    "mat": both_sides({"kind": "transformer", "attention_branches": 3, "ffn_branches": 2}),
    "weighted": both_sides({"kind": "weighted"}),
    "weighted-self": both_sides({"kind": "weighted", "decoder_branched": "self"}),
    "mute": {"norm": "pre", "relative_positions": 4, "decoder": {"kind": "transformer"},
             "encoder": {"kind": "mute", "units": 4, "bias_modules": ["identity", "swap", "mask", "disorder"],
                         "fusion": "sequential"}},
    "muse": both_sides({"kind": "muse", "kernel_sizes": [3, 5]}),
    "muse-simple": both_sides({"kind": "muse", "conv": False}),
    "drophead": {"drophead": {"rate": 0.2}},
    "relative-positions": {"relative_positions": 3},
    "learned-positions": {"positions": "learned", "max_positions": 14},
}


def kind_model(kind: str, seed: int = 3) -> torch.nn.Module:
    """A 2+2-layer d=16 model of a KINDS entry in eval mode, parameters moved off their initial values, EOS
    favoured (some outputs end early, others run to the limit)."""
    torch.manual_seed(seed)
    values = {"d_model": 16, "heads": 4, "ffn_dim": 32, "encoder_layers": 2, "decoder_layers": 2,
              "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB, "output_bias": True, **KINDS[kind]}
    model = build_model(from_dict(ModelConfig, values)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        model.output_bias[EOS] = 1.2
    return model


def sources(n: int = 7, seed: int = 1) -> torch.Tensor:
    """n random sentences of 2..10 tokens (EOS last), right-padded: [n, S]."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(4, VOCAB, (k - 1,), generator=g).tolist() + [EOS]
            for k in torch.randint(2, 11, (n,), generator=g).tolist()]
    width = max(map(len, rows))
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
