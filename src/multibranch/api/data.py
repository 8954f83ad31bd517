"""`prepare`: `multibranch prepare` for Python callers, with the command's options and checks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from multibranch.api.model import user_errors
from multibranch.config import from_dict
from multibranch.errors import ConfigError
from multibranch.preparing import PrepareOptions, prepare_data

__all__ = ["prepare"]

# the library's task names, accepted beside the command's
TASK_NAMES = {"translation": "translate", "classification": "classify"}
PATH_OPTIONS = ("train", "out", "valid", "hf_tokenizer", "spm_model", "spm_model_tgt", "dict", "dict_tgt")


def prepare(train: str | Path, out: str | Path, task: str = "translate", force: bool = False,
            **options: Any) -> dict[str, Any]:
    """Prepare raw data as `multibranch prepare` does, returning the written data.json (splits, sizes,
    vocabulary). `task`: "translate" (src=, tgt=, valid= required), "classify" or "code"; `options`: the
    command's options by their names with "_" for "-" (vocab_size=8000, test=["test"], holdout=0.1,
    text_column=["1", "2"], ...). The command's checks apply, with its messages (ConfigError, DataError)."""
    known = [f.name for f in dataclasses.fields(PrepareOptions)]
    for name in options:
        if name not in known or name in ("train", "out", "task", "force"):
            raise ConfigError(f"prepare: unknown option {name!r}; known: {', '.join(sorted(known))}")
    values = {"train": train, "out": out, "task": TASK_NAMES.get(task, task), "force": force, **options}
    values = {name: _plain(name, value) for name, value in values.items() if value is not None}
    with user_errors({"--force": "force=True"}):
        chosen = from_dict(PrepareOptions, values, "prepare")
        prepare_data(chosen)
    return json.loads((Path(out) / "data.json").read_text(encoding="utf-8"))


def _plain(name: str, value: Any) -> Any:
    """Paths as str (one or a list); every other value as given, for the options' type checks."""
    if name in PATH_OPTIONS and isinstance(value, Path):
        return str(value)
    if name in ("test", "text_column", "text_key") and isinstance(value, (list, tuple)):
        return [str(item) for item in value]
    if name in ("test", "text_column", "text_key") and isinstance(value, (str, Path)):
        return [str(value)]
    return value
