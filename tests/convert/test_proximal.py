"""Proximal initialisation (docs/papers.md#mat-proximal-initialisation): a MAT built from a standard model
reproduces it."""

from __future__ import annotations

import logging

import pytest
import torch

from multibranch.checkpoint.format import CheckpointError, load_checkpoint, load_state_strict, save_checkpoint
from multibranch.cli import main
from multibranch.config import ConfigError
from multibranch.convert.proximal import proximal_init
from multibranch.experiment import ExperimentConfig
from multibranch.loading.checkpoint import load_model
from multibranch.models import build_model
from tests.helpers.configs import tiny_model_dict


def make_payload(seed: int = 0, **model) -> dict:
    """A checkpoint payload of a tiny model with every parameter random (biases and norms too)."""
    cfg = ExperimentConfig.from_dict({"model": tiny_model_dict(**model)})
    torch.manual_seed(seed)
    net = build_model(cfg.model)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return {
        "config": cfg.to_dict(),
        "model": net.state_dict(),
        "tokenizer": None,
        "meta": {"step": 1234, "epoch": 3, "valid": {"loss": 2.5, "bleu": 20.0}, "data_fingerprint": "abc"},
        "training": {"optimizer": {"state": {}}, "step": 1234},
    }


def model_of(payload: dict, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    cfg = ExperimentConfig.from_dict(payload["config"])
    net = build_model(cfg.model)
    load_state_strict(net, payload["model"], "test")
    return net.to(dtype).eval()


def batch(vocab: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (3, 7), generator=g)
    src[1, 5:] = 0  # padding
    tgt = torch.randint(4, vocab, (3, 6), generator=g)
    tgt[:, 0] = 2
    return src, tgt


@pytest.mark.parametrize("n_a", [2, 3])
@pytest.mark.parametrize("n_f", [1, 2])
@pytest.mark.parametrize("share", ["all", "none"])
def test_mean_merge_reproduces_source_logits(n_a, n_f, share):
    source = make_payload(output_bias=True, share_embeddings=share)
    mat = proximal_init(source, n_a, n_f, {"drop_branch": 0.3})
    net = model_of(mat)
    layer = net.config.encoder
    assert (layer.attention_branches, layer.ffn_branches, layer.drop_branch.rate) == (n_a, n_f, 0.3)
    assert net.decoder.layers[0].cross_attn.branches == n_a
    src, tgt = batch()
    with torch.no_grad():
        # float64: equal up to rounding (atol 1e-6); float32 (the real setting): within float32 rounding
        torch.testing.assert_close(
            model_of(mat, torch.float64)(src, tgt), model_of(source, torch.float64)(src, tgt), atol=1e-6, rtol=0
        )
        torch.testing.assert_close(net(src, tgt), model_of(source)(src, tgt), atol=1e-5, rtol=1e-5)


def test_branches_are_verbatim_copies():
    source = make_payload()
    mat = proximal_init(source, 3, 2)
    key = "decoder.layers.1.cross_attn.in_proj.weight"
    w = source["model"][key]  # [3*I, d]
    inner = w.shape[0] // 3
    blocks = mat["model"][key].view(3, 3, inner, -1)  # [Q/K/V, branch, I, d]
    for b in range(3):
        assert torch.equal(blocks[:, b], w.view(3, inner, -1))
    out = mat["model"]["decoder.layers.1.cross_attn.out_proj.weight"]
    assert torch.equal(out, torch.cat([source["model"]["decoder.layers.1.cross_attn.out_proj.weight"]] * 3, 1))
    fc2_bias = mat["model"]["encoder.layers.0.ffn.fc2_bias"]
    assert fc2_bias.shape[0] == 2 and torch.equal(fc2_bias[0], fc2_bias[1])


def test_mean_sq_divides_attention_outputs_by_branches():
    n_a = 2
    source = make_payload()
    mat = proximal_init(source, n_a, 1, {"branch_merge": "mean_sq"})
    # Hand-derived expectation: c = 1/N_a^2 over N_a identical branches = the source attention / N_a,
    # i.e. the source model with every attention output projection (weight and bias) divided by N_a.
    expected = {
        k: (v / n_a if ("attn.out_proj" in k or "attn.out_bias" in k) else v) for k, v in source["model"].items()
    }
    reference = model_of({**source, "model": expected})
    src, tgt = batch()
    with torch.no_grad():
        ours = model_of(mat, torch.float64)(src, tgt)
        torch.testing.assert_close(ours, reference.double()(src, tgt), atol=1e-6, rtol=0)
        assert not torch.allclose(ours, model_of(source, torch.float64)(src, tgt), atol=1e-3)
    assert mat["meta"]["conversion"]["function_preserving"] is False


def test_training_state_dropped_meta_records_source_and_ties_kept():
    source = make_payload()
    mat = proximal_init(source, 2, source="std.pt")
    assert "training" not in mat
    assert mat["meta"]["source"]["path"] == "std.pt" and mat["meta"]["source"]["step"] == 1234
    assert mat["meta"]["step"] == 0 and "restart" in mat["meta"]["conversion"]
    enc, dec = mat["model"]["encoder.embed.tokens.weight"], mat["model"]["decoder.embed.tokens.weight"]
    assert enc.data_ptr() == dec.data_ptr()


def test_refuses_non_standard_source_and_width_changes():
    mat = proximal_init(make_payload(), 2)
    with pytest.raises(CheckpointError, match="attention_branches=2"):
        proximal_init(mat, 3)
    with pytest.raises(ConfigError, match="model.ffn_dim: source 64, requested 128"):
        proximal_init(make_payload(), 2, overrides=["model.ffn_dim=128"])
    with pytest.raises(ConfigError, match="model.encoder.heads"):
        proximal_init(make_payload(), 2, overrides=["model.encoder.heads=2"])
    with pytest.raises(ConfigError, match="not a MAT layer option"):
        proximal_init(make_payload(), 2, 1, {"heads": 8})
    # regularisation and MAT options may change freely
    out = proximal_init(make_payload(), 2, overrides=["model.dropout=0.3", "model.decoder.attention_branches=3"])
    cfg = ExperimentConfig.from_dict(out["config"]).model
    assert (cfg.dropout, cfg.encoder.attention_branches, cfg.decoder.attention_branches) == (0.3, 2, 3)


def test_cli_end_to_end_and_refuses_overwrite(tmp_path, capsys):
    std, mat = tmp_path / "std.pt", tmp_path / "mat.pt"
    save_checkpoint(std, make_payload())
    args = ["convert", "proximal", "--ckpt", str(std), "--out", str(mat), "--branches", "3", "--ffn-branches", "2",
            "--drop-branch", "0.2", "--merge", "mean", "--set", "model.dropout=0.3"]
    assert main(args) == 0
    loaded = load_model(mat)
    layer = loaded.config.model.decoder
    assert (layer.attention_branches, layer.ffn_branches, layer.drop_branch.rate) == (3, 2, 0.2)
    assert loaded.config.model.dropout == 0.3
    assert "training" not in load_checkpoint(mat)
    src, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(src, tgt), model_of(load_checkpoint(std))(src, tgt), atol=1e-5, rtol=1e-5)

    before = mat.read_bytes()
    assert main(args) == 2
    assert "--force" in capsys.readouterr().err
    assert mat.read_bytes() == before
    assert main(args + ["--force"]) == 0
    assert main(["convert", "proximal", "--ckpt", str(mat), "--out", str(tmp_path / "x.pt"), "--branches", "2"]) == 2
    assert "standard Transformer" in capsys.readouterr().err


def test_mean_sq_with_ffn_branches_only_is_not_function_preserving_and_says_so(caplog):
    source = make_payload()
    with caplog.at_level(logging.WARNING):
        mat = proximal_init(source, 1, 3, {"branch_merge": "mean_sq"})
    assert mat["meta"]["conversion"]["function_preserving"] is False
    assert any("divides FFN outputs by 1/N_f" in r.getMessage() for r in caplog.records)
    src, tgt = batch()
    with torch.no_grad():
        assert not torch.allclose(model_of(mat, torch.float64)(src, tgt),
                                  model_of(source, torch.float64)(src, tgt), atol=1e-3)
    mean = proximal_init(source, 1, 3, {"branch_merge": "mean"})
    assert mean["meta"]["conversion"]["function_preserving"] is True
