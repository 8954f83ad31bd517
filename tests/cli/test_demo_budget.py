"""`multibranch demo` trains for a number of updates, never for a wall-clock time: the same model and the same
BLEU on any machine, however busy. The task generation, preparation and training are replaced by stubs here (the
whole demo takes minutes)."""

from __future__ import annotations

import pytest

from multibranch.cli import main


class Captured(Exception):
    """Raised by the stub trainer, with the experiment config it was given."""


@pytest.fixture
def demo_training_config(monkeypatch, tmp_path):
    """Runs `multibranch demo ARGS` up to its training, returning the config training got (or main's status)."""
    import multibranch.tasks as tasks
    import multibranch.tasks.translation.prepare as prepare
    import multibranch.tasks.translation.synthetic as synthetic

    def train(cfg, options):  # noqa: ARG001
        raise Captured(cfg)

    task = {"sizes": {"train": 1}, "lexicon": {"lemmas": 1, "src_forms": 1, "tgt_forms": 1}}
    monkeypatch.setattr(synthetic, "generate_synthetic_task", lambda *a, **k: task)
    monkeypatch.setattr(prepare, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(tasks, "train", train)

    def run(*argv: str):
        try:
            return main(["demo", "--out", str(tmp_path / "demo"), *argv])
        except Captured as captured:
            return captured.args[0]

    return run


def test_the_demo_is_budgeted_in_updates_not_minutes(demo_training_config, capsys):
    cfg = demo_training_config()
    assert cfg.train.max_minutes is None
    assert isinstance(cfg.train.max_steps, int) and 300 <= cfg.train.max_steps <= 5000
    assert f"for {cfg.train.max_steps} updates" in capsys.readouterr().out


def test_the_number_of_updates_is_an_option(demo_training_config):
    cfg = demo_training_config("--updates", "40", "--set", "train.valid_every=20")
    assert (cfg.train.max_steps, cfg.train.max_minutes, cfg.train.valid_every) == (40, None, 20)


def test_no_updates_is_one_line_before_anything_is_written(demo_training_config, capsys, tmp_path):
    assert demo_training_config("--updates", "0") == 2
    err = capsys.readouterr().err.strip()
    assert "--updates 0" in err and "\n" not in err
    assert not (tmp_path / "demo").exists()
