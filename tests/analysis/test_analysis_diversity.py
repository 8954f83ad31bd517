"""`multibranch analyze diversity`: eq. 21 over a split on constructed MUTE models (identical units,
orthogonal attention outputs) and the refusal of non-MUTE models."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from multibranch.cli import main
from multibranch.experiment import ExperimentConfig, resolve_config
from multibranch.models import build_model
from multibranch.tasks.translation.dataset import PreparedData

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
UNIT_PARAMS = ("in_weight", "in_bias", "out_weight", "out_bias", "norm_weight", "norm_bias", "fc1_weight", "fc1_bias",
               "fc2_weight", "fc2_bias")


def model_for(data: Path, preset: str, units: int = 4) -> torch.nn.Module:
    sizes = PreparedData.load(data).meta["vocab_size"]
    overrides = [f"model.encoder.units={units}"] if preset.startswith("mute") else []
    cfg = resolve_config(preset, overrides=overrides).model
    torch.manual_seed(0)
    return build_model(dataclasses.replace(cfg, src_vocab_size=sizes["src"], tgt_vocab_size=sizes["tgt"])).eval()


def save(model: torch.nn.Module, path: Path) -> Path:
    from multibranch.checkpoint.format import save_checkpoint

    save_checkpoint(path, {"config": ExperimentConfig(model=model.config).to_dict(),
                           "model": model.state_dict(), "meta": {}})
    return path


def unit_parameters(model: torch.nn.Module):
    for layer in model.encoder.layers:
        for module in (layer.self_attn, layer.ffn):
            for name in UNIT_PARAMS:
                if hasattr(module, name):
                    yield module, name, getattr(module, name)


def run(ckpt: Path, data: Path, out: Path) -> dict:
    assert main(["analyze", "diversity", "--ckpt", str(ckpt), "--data", str(data), "--out", str(out),
                 "--max-tokens", "200"]) == 0
    return json.loads((out / "diversity.json").read_text())


@pytest.mark.parametrize("units", [2, 4])
def test_identical_units_give_exp_minus_one(units, tiny_data, tmp_path):
    model = model_for(tiny_data, "mute-tiny", units)
    with torch.no_grad():
        for _, _, param in unit_parameters(model):
            param.copy_(param[:1].expand_as(param))  # every unit = unit 0
    report = run(save(model, tmp_path / "m.pt"), tiny_data, tmp_path / "r")
    assert report["batches"] > 1 and report["examples"] == 24 and report["units"] == [units] * 3
    assert [row["layer"] for row in report["layers"]] == [0, 1, 2]
    for row in [*report["layers"], report["mean"]]:
        for variant in ("att_pos", "att_sub", "ffn_sub"):
            assert row[variant] == pytest.approx(math.exp(-1.0), abs=1e-5)
    for name in ("diversity.png", "unit_weights.png"):
        assert (tmp_path / "r" / name).read_bytes().startswith(PNG_MAGIC)
    assert report["unit_weights"][0]["weights"] == pytest.approx([1.0 / units] * units)


@pytest.mark.parametrize("units", [2, 4])
def test_orthogonal_attention_outputs_give_exp_minus_one_over_units(units, tiny_data, tmp_path):
    model = model_for(tiny_data, "mute-tiny", units)
    with torch.no_grad():
        for layer in model.encoder.layers:
            layer.self_attn.out_weight.zero_()  # attention output of unit i = its bias = (i+1) e_i at every position
            layer.self_attn.out_bias.copy_(torch.eye(units, layer.self_attn.out_bias.shape[1]) * torch.arange(1.0, units + 1)[:, None])
    report = run(save(model, tmp_path / "m.pt"), tiny_data, tmp_path / "r")
    for row in report["layers"]:
        assert row["att_sub"] == pytest.approx(math.exp(-1.0 / units), abs=1e-5)
        assert row["ffn_sub"] != pytest.approx(math.exp(-1.0 / units), abs=1e-3)  # the FFN variant is a different vector


def test_refuses_a_non_mute_model(tiny_data, tmp_path, capsys):
    ckpt = save(model_for(tiny_data, "transformer-tiny"), tmp_path / "plain.pt")
    assert main(["analyze", "diversity", "--ckpt", str(ckpt), "--data", str(tiny_data),
                 "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "not a MUTE model" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
