"""`analyze heads` shows a progress bar per long phase on a terminal (importance, entropy, pruning curve,
dominant heads; tqdm on stderr, as train and translate do), none when stderr is not a terminal or with
--no-progress; and its --help (like prune's) shows every option's default."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from multibranch.checkpoint.format import save_checkpoint
from multibranch.cli import all_parsers, build_parser, main
from multibranch.config import from_dict
from multibranch.experiment import ExperimentConfig
from multibranch.tasks import build_task_model
from multibranch.tasks.translation.dataset import PreparedData

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only cost on a busy machine


@pytest.fixture(scope="module")
def checkpoint(tiny_data, tmp_path_factory) -> Path:
    """An untrained tiny translation checkpoint (6 attention modules of 4 heads) decoding at most 4 tokens."""
    vocab = PreparedData.load(tiny_data).meta["vocab_size"]["src"]
    model = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1,
             "src_vocab_size": vocab, "tgt_vocab_size": vocab}
    cfg = from_dict(ExperimentConfig, {"model": model, "decode": {"beam": 1, "max_len_a": 0.0, "max_len_b": 4}})
    net = build_task_model(cfg)
    path = tmp_path_factory.mktemp("analyze_progress") / "model.pt"
    save_checkpoint(path, {"config": cfg.to_dict(), "model": {k: v.clone() for k, v in net.state_dict().items()},
                           "meta": {}})
    return path


def _stderr(checkpoint, tiny_data, out: Path, capsys, monkeypatch, tty: bool, *extra: str) -> str:
    capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty, raising=False)
    assert main(["analyze", "heads", "--ckpt", str(checkpoint), "--data", str(tiny_data), "--out", str(out),
                 "--max-examples", "6", "--bleu-max-sentences", "2", "--step", "0.5", *extra]) == 0
    return capsys.readouterr().err


def test_bars_on_a_terminal(checkpoint, tiny_data, tmp_path, capsys, monkeypatch):
    err = _stderr(checkpoint, tiny_data, tmp_path / "r", capsys, monkeypatch, True)
    assert "importance:" in err and "entropy:" in err
    assert "pruning curve:" in err and "/3 [" in err  # 0%, 50%, 100% of the 24 heads
    assert "dominant heads:" in err and "/24 [" in err  # one scoring per head (the curve gave the baseline)


def test_no_bars_off_a_terminal_or_with_no_progress(checkpoint, tiny_data, tmp_path, capsys, monkeypatch):
    for tty, extra, out in ((False, (), "r1"), (True, ("--no-progress",), "r2")):
        err = _stderr(checkpoint, tiny_data, tmp_path / out, capsys, monkeypatch, tty, *extra)
        assert "importance:" not in err and "dominant heads:" not in err and "/24 [" not in err


@pytest.mark.parametrize("command", [("analyze", "heads"), ("prune",)], ids=" ".join)
def test_help_shows_every_default(command, capsys):
    parser = dict(all_parsers(build_parser()))[command]
    missing = []
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or action.required or isinstance(action, argparse._HelpAction):
            continue
        if action.dest in ("fraction", "max_drop", "heads_json"):  # prune: one of them is required
            continue
        text = parser.formatter_class("x")._get_help_string(action) or ""
        if "default" not in text:
            missing.append(action.option_strings[-1])
    assert missing == []
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    assert "(default: all)" in capsys.readouterr().out
