"""Training progress: a bar with ETA and budget left on a terminal, per-update lines always in train.log."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import yaml

from multibranch.tasks import task_for_data, train
from multibranch.train.trainer import RunOptions, Trainer
from tests.helpers.configs import tiny_experiment


def test_with_the_bar_the_per_update_lines_still_go_to_train_log(tiny_data, tmp_path, caplog, capsys):
    caplog.set_level(logging.INFO, logger="multibranch")
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=4, log_every=1), RunOptions(tiny_data, run, progress=True))
    logged = re.findall(r"train \| step (\d+) \|", (run / "train.log").read_text())
    assert logged == ["1", "2", "3", "4"]
    assert not any("train | step" in r.getMessage() for r in caplog.records)  # the console shows the bar instead
    assert any("valid | step 4" in r.getMessage() for r in caplog.records)  # other lines still reach it
    bar = capsys.readouterr().err
    assert re.search(r"4/4 \[\d\d:\d\d<\d\d:\d\d", bar), bar  # updates done / total [elapsed<ETA
    assert "upd_left=0" in bar


def test_budget_left_counts_updates_and_minutes(tiny_data, tmp_path):
    cfg = tiny_experiment(max_steps=10, max_minutes=2.0)
    trainer = Trainer(cfg, RunOptions(tiny_data, tmp_path / "run", stop_at_step=6, progress=False), task_for_data)
    try:
        trainer.state.step = 4
        assert trainer._budget_left(elapsed=30.4) == {"upd_left": "2", "time_left": "0:01:29"}
        trainer.state.step = 7
        assert trainer._budget_left(elapsed=500.0) == {"upd_left": "0", "time_left": "0:00:00"}
    finally:
        trainer._close_log()


def test_no_bar_on_a_non_terminal(tiny_data, tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_experiment(max_steps=3, log_every=1).to_dict()))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "multibranch", "train", "--data", str(tiny_data),
                           "--out", str(tmp_path / "run"), "--config", str(config), "--threads", "1"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "upd/s" not in done.stderr and "upd_left" not in done.stderr
    assert len(re.findall(r"train \| step \d+ \|", done.stderr)) == 3  # the per-update lines instead
