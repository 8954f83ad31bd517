"""Progress bars of long phases: validation decoding in the trainer shows one when asked (a TTY), never otherwise."""

from __future__ import annotations

from multibranch.tasks import train
from multibranch.train.trainer import RunOptions
from tests.helpers.configs import tiny_experiment


def _validation_decoding_stderr(tiny_data, tmp_path, capsys, progress: bool) -> str:
    cfg = tiny_experiment(max_steps=2, valid_every=2, valid_bleu=True, valid_max_sentences=6)
    cfg.decode.beam, cfg.decode.max_len_b = 1, 3
    train(cfg, RunOptions(tiny_data, tmp_path / f"run_{progress}", progress=progress))
    return capsys.readouterr().err


def test_validation_decoding_bar_only_when_progress_is_on(tiny_data, tmp_path, capsys):
    assert "/6 [" in _validation_decoding_stderr(tiny_data, tmp_path, capsys, progress=True)  # lines done/total
    assert "/6 [" not in _validation_decoding_stderr(tiny_data, tmp_path, capsys, progress=False)
