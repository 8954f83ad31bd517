"""Scheduled DropHead (docs/papers.md#scheduled-drophead-equations): per-sample masks, >= 1 head kept,
rescale H/#kept, eval identity."""

from __future__ import annotations

import torch

from multibranch.config import from_dict
from multibranch.models import ModelConfig, build_model
from multibranch.modules.attention import ParallelAttention
from multibranch.modules.structured_dropout import DropHead
from tests.helpers.configs import tiny_model_dict


def test_every_sample_keeps_a_head_and_kept_heads_scale_by_h_over_kept(device):
    torch.manual_seed(0)
    drop = DropHead(4, 0.7).train()
    for _ in range(50):
        scale = drop(64, device).cpu()  # [64, 4], drawn on `device`
        kept = (scale > 0).sum(1)
        assert bool((kept >= 1).all())
        expected = 4.0 / kept.float()
        assert torch.allclose(scale.max(1).values, expected)
        assert torch.allclose(scale.sum(1), torch.full((64,), 4.0))


def test_masks_are_per_sample_and_rate_matches(device):
    torch.manual_seed(1)
    drop = DropHead(16, 0.2).train()
    scales = torch.cat([drop(32, device) for _ in range(100)]).cpu()
    assert not all(torch.equal(scales[0] > 0, row > 0) for row in scales[1:33])
    assert abs((scales == 0).float().mean().item() - 0.2) < 0.02


def test_eval_is_identity_and_rate_zero_is_inactive():
    drop = DropHead(4, 0.5)
    assert drop.eval()(8, torch.device("cpu")) is None
    assert DropHead(4, 0.0).train()(8, torch.device("cpu")) is None


def test_drophead_on_attention_masks_heads_before_the_output_projection():
    att = ParallelAttention(16, 4, drophead=DropHead(4, 0.5)).train()
    x = torch.randn(2, 5, 16)
    scale = torch.tensor([[2.0, 0.0, 2.0, 0.0], [4.0 / 3, 4.0 / 3, 0.0, 4.0 / 3]])
    att.drophead.forward = lambda batch, device: scale
    out = att(x)
    q, k, v = att.project_qkv(x)
    heads = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v  # [B, H, L, dk]
    heads = heads * scale[:, :, None, None]
    expected = heads.transpose(1, 2).reshape(2, 5, 16) @ att.out_proj.weight.t() + att.out_bias[0]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_model_drophead_applies_to_chosen_attention_types():
    cfg = from_dict(ModelConfig, tiny_model_dict(drophead={"rate": 0.2, "encoder_self": True, "decoder_self": False,
                                                             "cross": True}))
    model = build_model(cfg)
    assert isinstance(model.encoder.layers[0].self_attn.drophead, DropHead)
    assert model.decoder.layers[0].self_attn.drophead is None
    assert isinstance(model.decoder.layers[0].cross_attn.drophead, DropHead)
    src, prev = torch.randint(4, 40, (3, 6)), torch.randint(4, 40, (3, 4))
    plain = build_model(from_dict(ModelConfig, tiny_model_dict()))
    plain.load_state_dict(model.state_dict())
    assert torch.equal(model.eval()(src, prev), plain.eval()(src, prev))


def test_v_schedule_moves_through_the_trainer_hook():
    cfg = from_dict(ModelConfig, tiny_model_dict(drophead={"rate": {"schedule": "v", "rate": 0.2}}))
    model = build_model(cfg)
    from multibranch.hooks import ModuleHooks

    hooks = ModuleHooks(model)
    rates = lambda: {m.p for m in model.modules() if isinstance(m, DropHead)}  # noqa: E731
    hooks.update_start(0, warmup=100, total=1000)
    assert rates() == {0.2}
    hooks.update_start(100, warmup=100, total=1000)
    assert rates() == {0.0}
    hooks.update_start(1000, warmup=100, total=1000)
    assert rates() == {0.2}
