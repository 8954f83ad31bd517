"""`multibranch prepare` (not implemented yet)."""

from __future__ import annotations

import argparse

HELP = "prepare (not implemented yet)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("multibranch prepare is not implemented yet")
