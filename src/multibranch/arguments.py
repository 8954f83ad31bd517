"""argparse value types shared by the commands (a command never imports another command).

Its floor is just below commands/ (tests/test_layering.py): argparse only, nothing of multibranch, and
nothing below the commands needs it.
"""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)  # a ValueError: argparse's own "invalid positive_int value"
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be >= 1")
    return value
