"""Checkpoint averaging and checkpoint selection from a run directory."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model_dict

from multibranch.cli import main
from multibranch.convert.average import average_checkpoints, select_checkpoints
from multibranch.experiment import ExperimentConfig
from multibranch.models import build_model
from multibranch.train.checkpoint import CheckpointError, load_checkpoint, load_model, save_checkpoint


def make_payload(seed: int, step: int, bleu: float | None = None, loss: float | None = None, **model) -> dict:
    cfg = ExperimentConfig.from_dict({"model": tiny_model_dict(**model)})
    torch.manual_seed(seed)
    net = build_model(cfg.model)
    return {
        "config": cfg.to_dict(),
        "model": net.state_dict(),
        "tokenizer": None,
        "meta": {"step": step, "epoch": 1, "valid": {"loss": loss, "bleu": bleu}},
        "training": {"optimizer": {"state": {}}},
    }


def write(path, payload) -> str:
    save_checkpoint(path, payload)
    return str(path)


def test_average_is_float64_mean_ints_from_newest_ties_kept(tmp_path):
    payloads = [make_payload(seed, step) for seed, step in [(1, 300), (2, 100), (3, 200)]]
    for i, p in enumerate(payloads):
        p["model"]["num_updates"] = torch.tensor(10 * (i + 1), dtype=torch.int64)  # an integer buffer
    paths = [write(tmp_path / f"c{i}.pt", p) for i, p in enumerate(payloads)]
    avg = average_checkpoints(paths)
    for key, value in avg["model"].items():
        if key == "num_updates":
            assert value.item() == 10  # from the newest (step 300), not the last path
            continue
        a, b, c = (p["model"][key].double() for p in payloads)
        expected = ((a + b + c) / 3).float()
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, expected, atol=0, rtol=0)
    enc, dec = avg["model"]["encoder.embed.tokens.weight"], avg["model"]["decoder.embed.tokens.weight"]
    assert enc.data_ptr() == dec.data_ptr()  # tied stays tied
    assert "training" not in avg and "valid" not in avg["meta"]
    assert [s["path"] for s in avg["meta"]["averaged_from"]] == paths and avg["meta"]["step"] == 300
    net = build_model(ExperimentConfig.from_dict(avg["config"]).model)
    net.load_state_dict({k: v for k, v in avg["model"].items() if k != "num_updates"})


def test_average_keeps_low_precision_dtype(tmp_path):
    payloads = [make_payload(seed, seed) for seed in (1, 2)]
    for p in payloads:
        p["model"] = {k: v.to(torch.bfloat16) for k, v in p["model"].items()}
    avg = average_checkpoints([write(tmp_path / f"{i}.pt", p) for i, p in enumerate(payloads)])
    key = "decoder.layers.0.ffn.fc1.weight"
    assert avg["model"][key].dtype == torch.bfloat16
    expected = ((payloads[0]["model"][key].double() + payloads[1]["model"][key].double()) / 2).to(torch.bfloat16)
    assert torch.equal(avg["model"][key], expected)


def test_average_refuses_mismatches(tmp_path):
    good = write(tmp_path / "good.pt", make_payload(1, 1))
    other_cfg = write(tmp_path / "cfg.pt", make_payload(2, 2, dropout=0.3))
    with pytest.raises(CheckpointError, match=r"cfg\.pt: model config differs .*model\.dropout: 0\.1 vs 0\.3"):
        average_checkpoints([good, other_cfg])
    p = make_payload(3, 3)
    del p["model"]["decoder.layers.1.ffn.fc1.bias"]
    missing = write(tmp_path / "missing.pt", p)
    with pytest.raises(CheckpointError, match=r"missing\.pt: missing key 'decoder\.layers\.1\.ffn\.fc1\.bias'"):
        average_checkpoints([good, missing])
    p = make_payload(4, 4)
    p["model"]["encoder.layers.0.ffn.fc1.bias"] = torch.zeros(65)
    shape = write(tmp_path / "shape.pt", p)
    with pytest.raises(CheckpointError, match=r"shape\.pt: encoder\.layers\.0\.ffn\.fc1\.bias has shape \(65,\)"):
        average_checkpoints([good, shape])
    with pytest.raises(CheckpointError, match="not found"):
        average_checkpoints([good, str(tmp_path / "nope.pt")])


@pytest.fixture
def run_dir(tmp_path):
    """A fake run: step checkpoints 100..500 with validation scores, plus best.pt/last.pt."""
    run = tmp_path / "run"
    bleus = {100: 10.0, 200: 30.0, 300: 20.0, 400: 30.0, 500: 5.0}
    losses = {100: 3.0, 200: 2.0, 300: 1.5, 400: 2.5, 500: 1.0}
    for step, bleu in bleus.items():
        write(run / "checkpoints" / f"step_{step:08d}.pt", make_payload(step, step, bleu, losses[step]))
    write(run / "best.pt", make_payload(200, 200, 30.0, 2.0))
    write(run / "last.pt", make_payload(500, 500, 5.0, 1.0))
    return run


def steps(paths) -> list[int]:
    return [int(p.stem.split("_")[1]) for p in paths]


def test_select_last_and_best(run_dir):
    assert steps(select_checkpoints(run_dir, last=3)) == [300, 400, 500]
    assert steps(select_checkpoints(run_dir, last=3, upper_bound=400)) == [200, 300, 400]
    assert steps(select_checkpoints(run_dir, best=2)) == [200, 400]
    assert steps(select_checkpoints(run_dir, best=2, upper_bound=300)) == [200, 300]
    with pytest.raises(CheckpointError, match="asked for 6 checkpoints"):
        select_checkpoints(run_dir, last=6)
    # no BLEU in one checkpoint -> rank by loss (lower is better)
    write(run_dir / "checkpoints" / "step_00000600.pt", make_payload(6, 600, None, 1.2))
    assert steps(select_checkpoints(run_dir, best=2)) == [500, 600]


def test_cli_average(run_dir, tmp_path, capsys):
    out = tmp_path / "avg.pt"
    assert main(["average", "--run", str(run_dir), "--last", "2", "--out", str(out)]) == 0
    avg = load_checkpoint(out)
    assert [s["step"] for s in avg["meta"]["averaged_from"]] == [400, 500]
    assert "training" not in avg
    load_model(out)
    assert main(["average", "--run", str(run_dir), "--best", "2", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["average", "--run", str(run_dir), "--best", "2", "--out", str(out), "--force"]) == 0
    assert [s["step"] for s in load_checkpoint(out)["meta"]["averaged_from"]] == [200, 400]
    ckpts = [str(run_dir / "checkpoints" / f"step_{s:08d}.pt") for s in (100, 300)]
    assert main(["average", "--ckpts", *ckpts, "--out", str(out), "--force"]) == 0
    assert main(["average", "--run", str(run_dir), "--out", str(tmp_path / "x.pt")]) == 2
    assert "--last N or --best N" in capsys.readouterr().err
