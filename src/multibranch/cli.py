"""`multibranch` command line: one entry point, one module per subcommand in `multibranch.commands`.

Each command module exposes `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`.
The CLI only parses and reports; the work is done by library functions.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

from multibranch import __version__
from multibranch.atomic import full_disk_cause
from multibranch.errors import UserError
from multibranch.interrupts import Terminated, sigterm_as_interrupt

COMMANDS = [
    "demo", "prepare", "train", "translate", "classify", "evaluate", "average", "convert", "info", "analyze",
    "prune", "plot", "serve",
]


# commands that handle SIGTERM themselves (serve: uvicorn's graceful shutdown)
OWN_SIGTERM = ("serve",)

# what a user can cause: one line and exit code 2 (ConfigError, DataError, CheckpointError are UserErrors)
USER_ERRORS = (UserError, FileNotFoundError, FileExistsError)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default ("(default: X)"), except where there is none to show: flags,
    required options, and options whose default is None or empty (their help says what unset means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0 or action.required or action.default in (None, [], argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (`multibranch CMD: error: ...`, exit code 2) instead of the usage
    block and the error; `--help` still shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def subcommand_parser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of the deepest (sub)command that `argv` names (`multibranch convert fold ...`: fold's)."""
    for token in argv:
        children = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if children is not None and token in children:
            parser = children[token]
    return parser


def all_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(command path, parser) for the parser and every subcommand parser below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from all_parsers(child, (*path, name))


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="multibranch",
        description="Multi-branch Transformers (MAT, Weighted Transformer, MUTE, MUSE, Scheduled DropHead) "
        "for translation, text classification and code generation: prepare, train, translate or classify, "
        "evaluate, analyze, serve.",
    )
    parser.add_argument("--version", action="version", version=f"multibranch {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"multibranch.commands.{name}")
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    for _, child in all_parsers(parser):
        child.formatter_class = HelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    arguments = sys.argv[1:] if argv is None else argv
    args, unknown = parser.parse_known_args(arguments)
    if unknown:  # named by the command they were given to, not by `multibranch`
        subcommand_parser(parser, arguments).error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    try:
        with sigterm_as_interrupt(args.command not in OWN_SIGTERM):
            code = int(args._run(args) or 0)
            sys.stdout.flush()  # a closed pipe shows up here at the latest
        return code
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except USER_ERRORS as err:
        print(f"multibranch {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if full_disk_cause(err) is None:
            raise
        # a write the library does not wrap (atomic writes name their file themselves)
        where = f"cannot write {err.filename}: " if err.filename else ""
        print(f"multibranch {args.command}: error: {where}{err.strerror or 'no space left on device'}; free some "
              "space and run again", file=sys.stderr)
        return 2
    except Terminated as stop:  # SIGTERM: the same cleanup as Ctrl-C, the status a shell shows for SIGTERM
        print(f"multibranch {args.command}: {stop.args[0] if stop.args else 'terminated'}", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt as stop:
        print(f"multibranch {args.command}: {stop.args[0] if stop.args else 'interrupted'}", file=sys.stderr)
        return 130


def _quiet_broken_pipe() -> int:
    """The reader of stdout went away (`... | head`): stop quietly. As the Python docs recommend,
    point stdout at devnull so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (tests); nothing more to flush
        pass
    return 1


if __name__ == "__main__":
    sys.exit(main())
