"""Cached incremental decoding (`decode_step`) equals the full teacher-forced forward pass."""

from __future__ import annotations

import itertools

import pytest
import torch

from multibranch.config import from_dict
from multibranch.models import ModelConfig, build_model
from multibranch.modules.state import DecoderState

VOCAB = 40
PAD, BOS, EOS = 0, 2, 3


def _model(layer: str, norm: str, positions: str, relative: int) -> torch.nn.Module:
    kind = {"kind": "transformer"}
    if layer == "mat":
        kind.update(attention_branches=2, ffn_branches=2)
    cfg = from_dict(
        ModelConfig,
        {
            "d_model": 32, "heads": 4, "ffn_dim": 48, "encoder_layers": 2, "decoder_layers": 2,
            "dropout": 0.1, "attention_dropout": 0.1, "norm": norm, "positions": positions,
            "max_positions": 64, "relative_positions": relative, "src_vocab_size": VOCAB,
            "tgt_vocab_size": VOCAB, "encoder": dict(kind), "decoder": dict(kind),
        },
    )
    model = build_model(cfg)
    with torch.no_grad():  # larger random weights than the init, so differences would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded sources [3, 9] and decoder inputs [3, 7] (BOS + tokens)."""
    src = torch.randint(4, VOCAB, (3, 9))
    src[0, 6:] = PAD
    src[2, 3:] = PAD
    src[torch.arange(3), torch.tensor([5, 8, 2])] = EOS
    prev = torch.randint(4, VOCAB, (3, 7))
    prev[:, 0] = BOS
    return src, prev


CASES = list(itertools.product(["standard", "mat"], ["post", "pre"], ["sinusoidal", "learned"], [0, 4]))


@pytest.mark.parametrize(("layer", "norm", "positions", "relative"), CASES)
def test_decode_step_equals_full_forward(layer, norm, positions, relative):
    model = _model(layer, norm, positions, relative)
    src, prev = _batch()
    with torch.inference_mode():
        full = model(src, prev)  # [B, T, V]
        enc = model.encode(src)
        state = DecoderState()
        steps = [model.decode_step(prev[:, t : t + 1], enc, state) for t in range(prev.shape[1])]
    assert state.step == prev.shape[1]
    for t, logits in enumerate(steps):
        assert logits.dtype == torch.float32 and logits.shape == (3, VOCAB)
        torch.testing.assert_close(logits, full[:, t].float(), atol=1e-5, rtol=1e-5, msg=f"position {t}")


@pytest.mark.parametrize(("layer", "relative"), [("standard", 0), ("mat", 4)])
def test_reordered_state_continues_like_full_forward_of_reordered_prefixes(layer, relative):
    """Beam-style reordering: rows change places mid-decoding (within and across sentences)."""
    model = _model(layer, "post", "sinusoidal", relative)
    src, prev = _batch()
    order = torch.tensor([2, 2, 0])  # row 0 <- old row 2, row 1 <- old row 2, row 2 <- old row 0
    with torch.inference_mode():
        enc = model.encode(src)
        state = DecoderState()
        for t in range(3):
            model.decode_step(prev[:, t : t + 1], enc, state)
        state.reorder(order)
        enc = enc.index_select(order)
        new_prev = torch.cat([prev[order, :3], prev[:, 3:]], dim=1)  # reordered prefixes, fresh suffixes
        steps = [model.decode_step(new_prev[:, t : t + 1], enc, state) for t in range(3, new_prev.shape[1])]
        full = model(src[order], new_prev)
    for i, logits in enumerate(steps):
        torch.testing.assert_close(logits, full[:, 3 + i], atol=1e-5, rtol=1e-5)
