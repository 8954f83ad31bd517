"""Training side outputs: `train --plots` (the run's curves redrawn at every validation) and the optional
TensorBoard sink (`train --tensorboard DIR`, the [tb] extra)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from multibranch.cli import main
from multibranch.tasks import train
from multibranch.train.trainer import RunOptions
from tests.helpers.configs import tiny_experiment

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_plots_draws_the_run_curves_at_every_validation(tiny_data, tmp_path, monkeypatch):
    from multibranch.figures import run_plots

    drawn: list[int] = []
    real = run_plots.plot_run

    def spy(run_dir, *args, **kwargs):
        drawn.append(sum(1 for r in _records(Path(run_dir)) if r["type"] == "valid"))
        return real(run_dir, *args, **kwargs)

    monkeypatch.setattr(run_plots, "plot_run", spy)
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=8, valid_every=4), RunOptions(tiny_data, run, device="cpu", progress=False,
                                                                   plots=True))
    assert drawn == [1, 2]  # after each of the two validations, with that validation logged
    curves = json.loads((run / "plots" / "curves.json").read_text())
    records = _records(run)
    train_loss = [(r["step"], r["loss"]) for r in records if r["type"] == "train"]
    valid_loss = [(r["step"], r["loss"]) for r in records if r["type"] == "valid"]
    assert list(zip(curves["train"]["loss"]["step"], curves["train"]["loss"]["value"])) == train_loss
    assert list(zip(curves["valid"]["loss"]["step"], curves["valid"]["loss"]["value"])) == valid_loss
    png = (run / "plots" / "curves.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 5000
    assert "curves.png" in (run / "plots" / "index.md").read_text()


def test_train_without_plots_draws_nothing(tiny_data, tmp_path):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=4, valid_every=4), RunOptions(tiny_data, run, device="cpu", progress=False))
    assert not (run / "plots").exists()


def test_tensorboard_scalars_match_metrics_jsonl(tiny_data, tmp_path):
    pytest.importorskip("tensorboard", reason="the [tb] extra (tensorboard) is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, board = tmp_path / "run", tmp_path / "tb"
    cfg = tiny_experiment(max_steps=8, valid_every=4)
    cfg.model.drophead.rate.rate = 0.1  # a run with a logged module metric or a rate schedule is fine too
    train(cfg, RunOptions(tiny_data, run, device="cpu", progress=False, tensorboard=board))
    events = EventAccumulator(str(board))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    records = _records(run)
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for key, value in record.items():
            if key not in ("type", "step", "epoch") and isinstance(value, (int, float)) and not isinstance(value, bool):
                expected.setdefault(f"{record['type']}/{key}", []).append((record["step"], float(value)))
        for name, value in (record.get("modules") or {}).items():
            expected.setdefault(f"modules/{name}", []).append((record["step"], float(value)))
    assert {"train/loss", "train/lr", "valid/loss", "valid/ppl"} <= tags
    assert tags == set(expected)
    for tag, series in expected.items():
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in series], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in series], rel=1e-6), tag  # stored as fp32


def test_tensorboard_without_the_extra_is_one_clear_error(tiny_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(tiny_experiment(max_steps=2).to_dict()))
    run = tmp_path / "run"
    code = main(["train", "--data", str(tiny_data), "--out", str(run), "--config", str(cfg), "--no-progress",
                 "--device", "cpu", "--tensorboard", str(tmp_path / "tb")])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'multibranch[tb]'" in err and "Traceback" not in err
    assert not run.exists() and not (tmp_path / "tb").exists()


def test_tensorboard_of_a_resumed_run_keeps_one_value_per_step(tiny_data, tmp_path):
    pytest.importorskip("tensorboard", reason="the [tb] extra (tensorboard) is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, board = tmp_path / "run", tmp_path / "tb"
    cfg = tiny_experiment(max_steps=8, valid_every=4)
    train(cfg, RunOptions(tiny_data, run, device="cpu", progress=False, tensorboard=board, stop_at_step=4))
    from torch.utils.tensorboard import SummaryWriter

    killed = SummaryWriter(str(board))  # what a run killed after update 6 (checkpoint at 4) left behind
    for step in (5, 6):
        killed.add_scalar("train/loss", 999.0, step)
    killed.close()
    train(tiny_experiment(max_steps=8, valid_every=4),
          RunOptions(tiny_data, run, device="cpu", progress=False, tensorboard=board, resume=True))
    events = EventAccumulator(str(board))
    events.Reload()
    expected = [(r["step"], r["loss"]) for r in _records(run) if r["type"] == "train"]
    got = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert [s for s, _ in got] == [s for s, _ in expected] == list(range(1, 9))
    assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6)


def test_a_new_run_refuses_a_tensorboard_folder_holding_another_runs_events(tiny_data, tmp_path):
    """A new run's events hide every step it logs: a second run in the same folder would blank out the first's curves.
    A resume of the run (its own events) and a --force start (a start over) write there."""
    pytest.importorskip("tensorboard", reason="the [tb] extra (tensorboard) is not installed")
    board = tmp_path / "tb"
    cfg = tiny_experiment(max_steps=2, valid_every=2)
    train(cfg, RunOptions(tiny_data, tmp_path / "first", device="cpu", progress=False, tensorboard=board))
    events = sorted(board.iterdir())
    with pytest.raises(FileExistsError, match=f"--tensorboard {board} holds the events of an earlier run"):
        train(cfg, RunOptions(tiny_data, tmp_path / "second", device="cpu", progress=False, tensorboard=board))
    assert sorted(board.iterdir()) == events and not (tmp_path / "second").exists()
    train(tiny_experiment(max_steps=4, valid_every=2),
          RunOptions(tiny_data, tmp_path / "first", device="cpu", progress=False, tensorboard=board, resume=True))
    train(cfg, RunOptions(tiny_data, tmp_path / "first", device="cpu", progress=False, tensorboard=board, force=True))
