"""docs/recipes.md: every `multibranch` command on the page parses with the real CLI, and every preset with its
`--set` overrides resolves to a valid config (the page cannot name a flag, preset or key that does not exist)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from multibranch.cli import build_parser
from multibranch.experiment import resolve_config

RECIPES = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"


def _commands() -> list[list[str]]:
    """The `multibranch ...` commands of the page's bash blocks, continuation lines joined, `[--flag]` optional
    parts taken as given."""
    commands, inside, pending = [], False, ""
    for line in RECIPES.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = line.startswith("```bash")
            continue
        if not inside:
            continue
        text = pending + line.split("  #")[0].strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        if text.startswith("multibranch "):
            commands.append(shlex.split(text.replace("[", "").replace("]", ""))[1:])
    return commands


def test_the_page_has_the_commands_of_every_seed():
    presets = {args[args.index("--preset") + 1] for args in _commands() if "--preset" in args}
    assert {"transformer", "mat", "weighted", "mute-bias-seq", "muse", "drophead"} <= presets
    assert sum(args[0] == "prepare" for args in _commands()) >= 3


@pytest.mark.parametrize("args", _commands(), ids=lambda args: " ".join(args[:2]))
def test_every_command_parses_and_its_preset_resolves(args):
    parsed = build_parser().parse_args(args)  # argparse exits (SystemExit) on an unknown flag or bad value
    if getattr(parsed, "preset", None):
        resolve_config(parsed.preset, None, parsed.overrides)
