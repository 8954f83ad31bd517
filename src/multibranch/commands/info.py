"""`multibranch info` (not implemented yet)."""

from __future__ import annotations

import argparse

HELP = "info (not implemented yet)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("multibranch info is not implemented yet")
