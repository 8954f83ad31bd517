"""MAT folding (docs/papers.md#mat-folding): N_a branches of M heads == one attention of N_a*M heads in
eval."""

from __future__ import annotations

import pytest
import torch

from multibranch.checkpoint.format import load_state_strict, save_checkpoint
from multibranch.cli import main
from multibranch.config import ConfigError
from multibranch.convert.fold import fold_mat
from multibranch.experiment import ExperimentConfig
from multibranch.loading.checkpoint import load_model
from multibranch.models import build_model
from multibranch.modules.state import DecoderState
from tests.helpers.configs import tiny_model_dict


def mat_payload(n_a: int, n_f: int = 1, merge: str = "mean", dec_n_f: int | None = None, **model) -> dict:
    """A tiny MAT with every parameter random, so the branches differ."""
    layer = lambda f: {"kind": "transformer", "attention_branches": n_a, "ffn_branches": f,  # noqa: E731
                       "branch_merge": merge, "drop_branch": 0.2}
    cfg = ExperimentConfig.from_dict(
        {"model": tiny_model_dict(encoder=layer(n_f), decoder=layer(n_f if dec_n_f is None else dec_n_f), **model)}
    )
    torch.manual_seed(0)
    net = build_model(cfg.model)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return {"config": cfg.to_dict(), "model": net.state_dict(), "tokenizer": None,
            "meta": {"step": 50, "valid": {"loss": 3.0, "bleu": None}}, "training": {"step": 50}}


def model_of(payload: dict) -> torch.nn.Module:
    net = build_model(ExperimentConfig.from_dict(payload["config"]).model)
    load_state_strict(net, payload["model"], "test")
    return net.eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 40, (3, 8), generator=g)
    src[0, 6:] = 0
    tgt = torch.randint(4, 40, (3, 5), generator=g)
    tgt[:, 0] = 2
    return src, tgt


@pytest.mark.parametrize("n_a", [2, 3])
@pytest.mark.parametrize("merge", ["mean", "mean_sq"])
@pytest.mark.parametrize("n_f", [1, 2])
def test_folded_equals_unfolded(n_a, merge, n_f):
    mat = mat_payload(n_a, n_f, merge, output_bias=True)
    folded = fold_mat(mat)
    cfg = ExperimentConfig.from_dict(folded["config"]).model
    for layer in (cfg.encoder, cfg.decoder):
        assert (layer.attention_branches, layer.heads, layer.head_dim, layer.ffn_branches) == (1, n_a * 4, 8, 1)
        assert layer.drop_branch.is_zero
    assert cfg.ffn_dim == 64 * n_f
    assert folded["meta"]["conversion"]["ffn_folded"] and "training" not in folded
    src, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(model_of(folded)(src, tgt), model_of(mat)(src, tgt), atol=1e-5, rtol=1e-5)


def test_folded_incremental_decoding_equals_full_forward():
    folded = model_of(fold_mat(mat_payload(3, 2, relative_positions=3)))
    src, tgt = batch()
    with torch.no_grad():
        full = folded(src, tgt)  # [B, T, V]
        enc = folded.encode(src)
        state = DecoderState()
        steps = [folded.decode_step(tgt[:, t : t + 1], enc, state) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_different_ffn_branches_fold_attention_only():
    mat = mat_payload(2, 2, dec_n_f=1)
    folded = fold_mat(mat)
    cfg = ExperimentConfig.from_dict(folded["config"]).model
    assert (cfg.encoder.attention_branches, cfg.encoder.ffn_branches, cfg.decoder.ffn_branches) == (1, 2, 1)
    assert cfg.ffn_dim == 64 and cfg.encoder.ffn_drop_branch.rate == 0.2  # FFN regulariser kept
    assert folded["meta"]["conversion"]["ffn_folded"] is False
    src, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(model_of(folded)(src, tgt), model_of(mat)(src, tgt), atol=1e-5, rtol=1e-5)


def test_fold_refuses_other_layer_kinds(monkeypatch):
    import multibranch.convert.fold as fold

    mat = mat_payload(2)
    cfg = ExperimentConfig.from_dict(mat["config"])
    cfg.model.decoder.kind = "weighted"  # stands in for any non-MAT layer kind
    monkeypatch.setattr(fold, "experiment_config", lambda payload: cfg)
    with pytest.raises(ConfigError, match="decoder layers are 'weighted'"):
        fold_mat(mat)


def test_cli_fold(tmp_path, capsys):
    src_path, out = tmp_path / "mat.pt", tmp_path / "folded.pt"
    mat = mat_payload(2, 1)
    save_checkpoint(src_path, mat)
    assert main(["convert", "fold", "--ckpt", str(src_path), "--out", str(out)]) == 0
    assert "attention branches folded into heads" in capsys.readouterr().out
    loaded = load_model(out)
    assert loaded.config.model.encoder.heads == 8
    src, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(src, tgt), model_of(mat)(src, tgt), atol=1e-5, rtol=1e-5)
    assert main(["convert", "fold", "--ckpt", str(src_path), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err


def test_cli_fold_of_a_standard_model_says_nothing_was_folded(tmp_path, capsys):
    src_path, out = tmp_path / "std.pt", tmp_path / "folded.pt"
    standard = mat_payload(1, 1)
    save_checkpoint(src_path, standard)
    assert main(["convert", "fold", "--ckpt", str(src_path), "--out", str(out)]) == 0
    assert "the same model (one attention and one FFN branch: nothing to fold)" in capsys.readouterr().out
    src, tgt = batch()
    with torch.no_grad():
        assert torch.equal(load_model(out).model(src, tgt), model_of(standard)(src, tgt))
