"""The weights' moving average (`train.ema_decay`, train/ema.py): the average by hand on a small layer; in a run,
the average of the weights a run without it trains (the average changes nothing of the training), validated and
saved in its place; a resumed run continues it exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from multibranch.checkpoint.format import load_checkpoint
from multibranch.config import ConfigError
from multibranch.tasks import train
from multibranch.train.ema import WeightAverage
from multibranch.train.trainer import RunOptions
from tests.helpers.configs import tiny_experiment


def test_the_average_follows_the_weights_until_its_start_then_averages_them():
    layer = nn.Linear(2, 1)
    ema = WeightAverage(layer, decay=0.75, start=1)
    history = [(torch.tensor([[1.0, 2.0]]), torch.tensor([0.5])), (torch.tensor([[3.0, -2.0]]), torch.tensor([1.5])),
               (torch.tensor([[-1.0, 6.0]]), torch.tensor([-0.5]))]
    for step, (weight, bias) in enumerate(history, start=1):
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
        ema.update(step)
    # a1 = w1; a2 = 0.75 a1 + 0.25 w2; a3 = 0.75 a2 + 0.25 w3
    expected_weight = torch.tensor([[0.75 * (0.75 * 1.0 + 0.25 * 3.0) + 0.25 * -1.0,
                                     0.75 * (0.75 * 2.0 + 0.25 * -2.0) + 0.25 * 6.0]])
    expected_bias = torch.tensor([0.75 * (0.75 * 0.5 + 0.25 * 1.5) + 0.25 * -0.5])
    state = ema.model_state(layer)
    assert torch.allclose(state["weight"], expected_weight) and torch.allclose(state["bias"], expected_bias)
    assert layer.weight.equal(history[-1][0])  # the model keeps its own weights
    with ema.swapped_in():
        assert layer.weight.equal(state["weight"]) and layer.bias.equal(state["bias"])
    assert layer.weight.equal(history[-1][0]) and layer.bias.equal(history[-1][1])


def _records(run: Path, kind: str) -> dict[int, float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if r["type"] == kind}


def _steps(run: Path) -> dict[int, dict]:
    return {int(p.stem.split("_")[1]): load_checkpoint(p)["model"] for p in (run / "checkpoints").glob("step_*.pt")}


SETTINGS = {"max_steps": 6, "valid_every": 1, "keep_last": 10, "log_every": 1, "deterministic": True}
DECAY, START = 0.6, 2


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory) -> tuple[Path, Path]:
    """The same training without and with a moving average (decay 0.6, from update 2), checkpointed every update."""
    root = tmp_path_factory.mktemp("ema")
    train(tiny_experiment(**SETTINGS), RunOptions(tiny_data, root / "plain", device="cpu", progress=False))
    train(tiny_experiment(**SETTINGS, ema_decay=DECAY, ema_start=START),
          RunOptions(tiny_data, root / "ema", device="cpu", progress=False))
    return root / "plain", root / "ema"


def test_the_checkpoints_hold_the_average_of_the_weights_a_run_without_it_trains(runs):
    plain, ema = runs
    weights, averages = _steps(plain), _steps(ema)
    assert sorted(weights) == sorted(averages) == list(range(1, 7))
    floating = [name for name, value in weights[1].items() if value.is_floating_point()]
    expected = {}
    for step in range(1, 7):
        expected = {name: weights[step][name] if step <= START
                    else DECAY * expected[name] + (1 - DECAY) * weights[step][name] for name in floating}
        for name in floating:
            torch.testing.assert_close(averages[step][name], expected[name], rtol=1e-5, atol=1e-6)
    assert any(not averages[6][name].equal(weights[6][name]) for name in floating)
    last = load_checkpoint(ema / "last.pt")
    assert all(last["training"]["raw_model"][k].equal(v) for k, v in weights[6].items())  # the trained weights


def test_the_average_changes_nothing_of_the_training_and_is_what_is_validated(runs):
    plain, ema = runs
    assert _records(ema, "train") == _records(plain, "train")  # the same updates, bit for bit
    valid_plain, valid_ema = _records(plain, "valid"), _records(ema, "valid")
    assert all(valid_ema[step] == valid_plain[step] for step in range(1, START + 1))  # the average is the weights
    assert all(valid_ema[step] != valid_plain[step] for step in range(START + 1, 7))  # the average is validated


def test_a_paused_run_continues_its_average_exactly(tiny_data, runs, tmp_path):
    _, straight = runs
    config = tiny_experiment(**SETTINGS, ema_decay=DECAY, ema_start=START)
    train(config, RunOptions(tiny_data, tmp_path / "paused", device="cpu", progress=False, stop_at_step=4))
    train(config, RunOptions(tiny_data, tmp_path / "paused", device="cpu", progress=False, resume=True))
    got, expected = _steps(tmp_path / "paused"), _steps(straight)
    assert sorted(got) == sorted(expected)
    assert all(got[s][k].equal(expected[s][k]) for s in expected for k in expected[s])


def test_the_decay_must_lie_between_zero_and_one():
    for decay in (0.0, 1.0, 1.5):
        with pytest.raises(ConfigError, match="ema_decay"):
            tiny_experiment(ema_decay=decay)


def test_the_cli_takes_the_decay_and_names_its_option(tiny_data, tmp_path, capsys):
    from multibranch.cli import main

    run = tmp_path / "run"
    assert main(["train", "--preset", "transformer-tiny", "--data", str(tiny_data), "--out", str(run),
                 "--ema-decay", "1.5"]) == 2
    assert "--ema-decay 1.5: must be" in capsys.readouterr().err and not run.exists()
    assert main(["train", "--data", str(tiny_data), "--out", str(run), "--config", str(_config(tmp_path)),
                 "--ema-decay", "0.9", "--max-steps", "2", "--no-progress", "--device", "cpu"]) == 0
    saved = load_checkpoint(run / "last.pt")
    assert saved["config"]["train"]["ema_decay"] == 0.9 and "raw_model" in saved["training"]


def _config(folder: Path) -> Path:
    import yaml

    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_experiment(valid_every=2).to_dict()), encoding="utf-8")
    return path
