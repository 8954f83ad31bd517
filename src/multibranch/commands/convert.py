"""`multibranch convert` (not implemented yet)."""

from __future__ import annotations

import argparse

HELP = "convert (not implemented yet)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("multibranch convert is not implemented yet")
