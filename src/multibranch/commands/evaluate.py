"""`multibranch evaluate` (not implemented yet)."""

from __future__ import annotations

import argparse

HELP = "evaluate (not implemented yet)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("multibranch evaluate is not implemented yet")
