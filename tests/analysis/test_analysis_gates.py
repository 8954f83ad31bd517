"""`multibranch analyze gates`: kernel-gate ratio, kappa/alpha and unit weights from hand-set parameters."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from multibranch.analysis.mixing import branch_weights, kernel_gates, unit_weights
from multibranch.cli import main
from multibranch.experiment import ExperimentConfig, resolve_config
from multibranch.models import build_model

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tiny_model(preset: str, **overrides) -> torch.nn.Module:
    cfg = dataclasses.replace(resolve_config(preset).model, src_vocab_size=20, tgt_vocab_size=20, **overrides)
    return build_model(cfg).eval()


def save(model: torch.nn.Module, path: Path) -> Path:
    from multibranch.checkpoint.format import save_checkpoint

    save_checkpoint(path, {"config": ExperimentConfig(model=model.config).to_dict(),
                           "model": model.state_dict(), "meta": {}})
    return path


def set_muse_gates(model: torch.nn.Module) -> dict[str, tuple[float, float]]:
    """Gate logits (g_3, g_15) = (0.1 * i, -0.2 * i) for the i-th gated convolution; returns them by name."""
    logits = {}
    with torch.no_grad():
        for i, (name, param) in enumerate((n, p) for n, p in model.named_parameters() if n.endswith("conv.gate")):
            param.copy_(torch.tensor([0.1 * i, -0.2 * i]))
            logits[name.removesuffix(".gate")] = (0.1 * i, -0.2 * i)
    return logits


def test_kernel_gate_ratio_from_hand_set_logits():
    model = tiny_model("muse-tiny")
    logits = set_muse_gates(model)
    rows = kernel_gates(model)
    assert [r["name"] for r in rows] == list(logits) and len(rows) == 10
    assert [(r["side"], r["layer"]) for r in rows] == [("encoder", i) for i in range(5)] + [("decoder", i) for i in range(5)]
    for row in rows:
        g3, g15 = logits[row["name"]]
        z = math.exp(g3) + math.exp(g15)
        assert row["kernel_sizes"] == [3, 15]
        assert row["weights"] == pytest.approx([math.exp(g3) / z, math.exp(g15) / z], abs=1e-6)
        assert row["ratio"] == pytest.approx(math.exp(g3 - g15), rel=1e-5)
    assert kernel_gates(model, ratio=(3, 7))[0]["ratio"] is None  # no k=7 kernel


def test_kappa_alpha_and_unit_weights_from_hand_set_parameters():
    model = tiny_model("weighted-tiny")
    modules = [m for n, m in model.named_modules() if n.endswith("branched.weights")]
    with torch.no_grad():
        for i, module in enumerate(modules):
            module.kappa.copy_(torch.tensor([0.1, 0.2, 0.3, 0.4]).roll(i))
            module.alpha.copy_(torch.tensor([0.7, 0.1, 0.1, 0.1]).roll(i))
    rows = branch_weights(model)
    assert len(rows) == len(modules) == 6
    for i, row in enumerate(rows):
        assert row["kappa"] == pytest.approx(torch.tensor([0.1, 0.2, 0.3, 0.4]).roll(i).tolist())
        assert row["alpha"] == pytest.approx(torch.tensor([0.7, 0.1, 0.1, 0.1]).roll(i).tolist())
    assert kernel_gates(model) == [] and unit_weights(model) == []

    mute = tiny_model("mute-tiny")
    with torch.no_grad():
        for i, layer in enumerate(mute.encoder.layers):
            layer.unit_weights.copy_(torch.arange(4.0) * (i + 1))
    assert [r["weights"] for r in unit_weights(mute)] == [[0.0, i, 2.0 * i, 3.0 * i] for i in (1, 2, 3)]


def test_analyze_gates_cli_writes_report(tmp_path):
    model = tiny_model("muse-tiny")
    logits = set_muse_gates(model)
    ckpt = save(model, tmp_path / "muse.pt")
    out = tmp_path / "report"
    assert main(["analyze", "gates", "--ckpt", str(ckpt), "--out", str(out)]) == 0
    report = json.loads((out / "gates.json").read_text())
    ratios = [r["ratio"] for r in report["kernel_gates"]]
    assert ratios == pytest.approx([math.exp(g3 - g15) for g3, g15 in logits.values()], rel=1e-5)
    assert report["branch_weights"] == [] and report["unit_weights"] == []
    assert (out / "kernel_gate_ratio.png").read_bytes().startswith(PNG_MAGIC)
    assert "(kernel_gate_ratio.png)" in (out / "index.md").read_text()


def test_analyze_gates_refuses_a_model_without_mixing_weights(tmp_path, capsys):
    ckpt = save(tiny_model("transformer-tiny"), tmp_path / "plain.pt")
    assert main(["analyze", "gates", "--ckpt", str(ckpt), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "no learned mixing weights" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
    assert main(["analyze", "gates", "--ckpt", str(ckpt), "--out", str(tmp_path / "r"), "--ratio", "3"]) == 2


@pytest.mark.parametrize(("preset", "plot", "key"), [("weighted-tiny", "kappa_alpha.png", "branch_weights"),
                                                      ("mute-tiny", "unit_weights.png", "unit_weights")])
def test_analyze_gates_plots_weighted_and_mute(preset, plot, key, tmp_path):
    model = tiny_model(preset)
    ckpt = save(model, tmp_path / "m.pt")
    out = tmp_path / "report"
    assert main(["analyze", "gates", "--ckpt", str(ckpt), "--out", str(out)]) == 0
    report = json.loads((out / "gates.json").read_text())
    expected = branch_weights(model) if key == "branch_weights" else unit_weights(model)
    assert report[key] == expected and report["kernel_gates"] == []  # floats survive the JSON round trip
    assert (out / plot).read_bytes().startswith(PNG_MAGIC) and f"({plot})" in (out / "index.md").read_text()
