"""`multibranch translate` (not implemented yet)."""

from __future__ import annotations

import argparse

HELP = "translate (not implemented yet)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("multibranch translate is not implemented yet")
