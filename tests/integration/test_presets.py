"""Every named preset resolves, trains, resumes exactly and translates through the public entry points.

Presets are shrunk to test size (same layer kinds and options, tiny widths) so the whole list runs
in CI; the full sizes are exercised by `multibranch info` (parameter counting) only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multibranch.cli import main
from multibranch.experiment import list_presets, resolve_config
from multibranch.tasks import build_task_model

SHRINK = ["model.d_model=32", "model.heads=4", "model.ffn_dim=64", "model.encoder_layers=2", "model.decoder_layers=2",
          "model.relative_positions=0", "train.max_tokens=600", "train.valid_bleu=false", "train.log_every=1",
          "train.valid_every=3", "train.max_minutes=null", "train.update_freq=1", "train.deterministic=true",
          "train.lr.warmup=3", "decode.beam=2"]
PRESETS = list_presets()


def _shrunk(name: str, steps: int) -> list[str]:
    overrides = SHRINK + [f"train.max_steps={steps}"]
    cfg = resolve_config(name, None, overrides)
    if cfg.model.relative_positions == 0 and resolve_config(name).model.relative_positions:
        overrides[overrides.index("model.relative_positions=0")] = "model.relative_positions=4"
    for stack in ("encoder", "decoder"):
        layer = getattr(cfg.model, stack)
        if getattr(layer, "freeze_last", 0):
            overrides.append(f"model.{stack}.freeze_last=2")
        if getattr(layer, "layer_kernel_sizes", None):
            overrides.append(f"model.{stack}.layer_kernel_sizes=null")
    return overrides


def test_expected_presets_exist():
    expected = {"transformer", "mat", "weighted", "mute", "mute-bias", "mute-bias-seq", "muse", "muse-simple",
                "drophead", "demo"}
    assert expected <= set(PRESETS)
    assert {f"{p}-tiny" for p in expected - {"demo"}} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_full_size_builds_and_counts(name, capsys):
    assert main(["info", "--preset", name, "--no-config", "--vocab-size", "1000"]) == 0
    out = capsys.readouterr().out
    assert "total" in out
    cfg = resolve_config(name)
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = 1000
    cfg.classifier.num_labels = 2  # info's count for a classification preset
    total = sum(p.numel() for p in build_task_model(cfg).parameters())
    assert f"{total:,d}" in out


def _losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["type"] == "train"}


def _train(name: str, data: Path, run: Path, steps: int, *extra: str) -> None:
    args = ["train", "--preset", name, "--data", str(data), "--out", str(run), "--no-progress", "--threads", "1"]
    for override in _shrunk(name, steps):
        args += ["--set", override]
    assert main(args + list(extra)) == 0


# classification presets train on labelled data (tests/tasks/classification/test_classifier.py); on this parallel
# data they are refused
@pytest.mark.parametrize("name", [p for p in PRESETS if p.endswith("-tiny") and resolve_config(p).task != "classification"])
def test_tiny_preset_trains_resumes_exactly_and_translates(name, tiny_data, tmp_path, capsys):
    _train(name, tiny_data, tmp_path / "straight", 6)
    _train(name, tiny_data, tmp_path / "legs", 6, "--stop-at-step", "3")  # same schedule, paused at 3
    _train(name, tiny_data, tmp_path / "legs", 6, "--resume")
    assert _losses(tmp_path / "legs") == _losses(tmp_path / "straight")
    src = tiny_data / "test.src.txt"
    out = tmp_path / "hyp.txt"
    assert main(["translate", "--ckpt", str(tmp_path / "legs" / "last.pt"), "-i", str(src), "-o", str(out),
                 "--threads", "1"]) == 0
    assert len(out.read_text(encoding="utf-8").split("\n")) - 1 == len(src.read_text(encoding="utf-8").split("\n")) - 1
