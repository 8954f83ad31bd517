"""The API's checks of its callers' arguments: paths, lists and devices of the right kind, refused with a UserError
that names the argument before any work (a str given for a list would be read one character at a time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from multibranch.errors import UserError


def check_paths(call: str, **paths: Any) -> None:
    """UserError naming the first argument that is neither None nor a path (str or pathlib.Path)."""
    for name, value in paths.items():
        if value is not None and not isinstance(value, (str, Path)):
            raise UserError(f"{call}: {name} must be a path (str or pathlib.Path), not {type(value).__name__}")


def check_list(call: str, name: str, value: Any, of: str) -> None:
    """UserError when `value` (not None) is a single str or path, or not a list or tuple."""
    if value is not None and (isinstance(value, (str, bytes, Path)) or not isinstance(value, (list, tuple))):
        raise UserError(f"{call}: {name} must be a list of {of}, not {type(value).__name__}")


def check_device(call: str, device: Any) -> None:
    """UserError unless `device` is a device's name or a torch.device (which device it names is checked later)."""
    if not isinstance(device, (str, torch.device)):
        raise UserError(f'{call}: device must be a str ("cpu", "cuda", "cuda:N", "auto") or a torch.device, not '
                        f"{type(device).__name__}")
