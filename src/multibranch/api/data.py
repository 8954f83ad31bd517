"""`prepare`: `multibranch prepare` for Python callers, with the command's own arguments and checks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, NoReturn

from multibranch.api.model import user_errors
from multibranch.commands import prepare as command
from multibranch.errors import ConfigError

__all__ = ["prepare"]

# the library's task names, accepted beside the command's
TASK_NAMES = {"translation": "translate", "classification": "classify"}


class _Arguments(argparse.ArgumentParser):
    """The command's parser, raising ConfigError with argparse's message instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"prepare: {message}")


def _argv(parser: argparse.ArgumentParser, options: dict[str, Any]) -> list[str]:
    """Command-line arguments of keyword options: True -> a flag, False/None -> left out, a list -> the
    values of a repeated (append) or multi-value option."""
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    argv: list[str] = []
    for name, value in options.items():
        action = actions.get(name)
        if action is None or name == "help":
            known = sorted(dest for dest in actions if dest != "help")
            raise ConfigError(f"prepare: unknown option {name!r}; known: {', '.join(known)}")
        flag = action.option_strings[0]
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            if isinstance(action, argparse._AppendAction):
                for item in value:
                    argv += [flag, str(item)]
            else:
                argv += [flag, *(str(item) for item in value)]
        else:
            argv += [flag, str(value)]
    return argv


def prepare(train: str | Path, out: str | Path, task: str = "translate", force: bool = False,
            **options: Any) -> dict[str, Any]:
    """Prepare raw data as `multibranch prepare` does, returning the written data.json (splits, sizes,
    vocabulary). `task`: "translate" (src=, tgt=, valid= required), "classify" or "code"; `options`: the
    command's options by their names with "_" for "-" (vocab_size=8000, test=["test"], holdout=0.1,
    text_column=["1", "2"], ...). The command's checks apply, with its messages (ConfigError, DataError)."""
    parser = _Arguments(prog="multibranch.prepare", add_help=False)
    command.add_arguments(parser)
    values = {"task": TASK_NAMES.get(task, task), "train": str(train), "out": str(out), "force": force, **options}
    args = parser.parse_args(_argv(parser, values))
    with user_errors({"--force": "force=True"}):
        command.run(args)
    return json.loads((Path(out) / "data.json").read_text(encoding="utf-8"))
