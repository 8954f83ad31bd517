"""Shared pieces of the CLI tests: a tiny model's --set overrides and reading a one-line error."""

from __future__ import annotations

TINY_MODEL = ["--set", "model.d_model=32", "--set", "model.ffn_dim=64", "--set", "model.heads=4",
              "--set", "model.encoder_layers=1", "--set", "model.decoder_layers=1"]


def one_error_line(capsys) -> str:  # noqa: ANN001
    """stderr of the command just run, asserted to be exactly one line."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err
