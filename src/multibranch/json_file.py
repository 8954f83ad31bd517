"""Reading a JSON document that must be an object, with one clear error (never a traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_object(path: str | Path, error: type[Exception], hint: str = "") -> dict[str, Any]:
    """The JSON object stored in `path`. When the file cannot be read, is not UTF-8 JSON or holds
    something other than an object, raises `error` with one line naming the file, then `hint` (what to
    do about it, e.g. "run `multibranch prepare` again") after a semicolon."""
    path = Path(path)
    advice = f"; {hint}" if hint else ""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise error(f"{path}: cannot be read ({err.strerror or err}){advice}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise error(f"{path}: corrupted, not valid JSON ({err}){advice}") from None
    if not isinstance(document, dict):
        raise error(f"{path}: corrupted, a JSON {type(document).__name__} instead of an object{advice}")
    return document
