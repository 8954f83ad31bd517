"""Reading a JSON document that must be an object, with one clear error (never a traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from multibranch.atomic import atomic_write_text


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


def write_json(path: str | Path, data: Any) -> None:
    """`data` as indented UTF-8 JSON (ending in a newline), written atomically; missing parents are made."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
