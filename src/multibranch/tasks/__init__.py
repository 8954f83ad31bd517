"""Tasks: what the trainer trains. A task owns its data, model, batches, loss and validation.

    task = task_for_data(cfg, data_dir)   # chosen by the prepared directory's data.json "format"
    model = build_task_model(cfg)         # the model of a config (`cfg.task` records the task)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from multibranch.data.errors import DataError
from multibranch.tasks.base import Task

if TYPE_CHECKING:
    from torch import nn

    from multibranch.experiment import ExperimentConfig

__all__ = ["Task", "build_task_model", "task_class", "task_for_data"]


def task_class(name: str) -> type[Task]:
    from multibranch.tasks.classification import ClassificationTask
    from multibranch.tasks.code import CodeTask
    from multibranch.tasks.translation import TranslationTask

    tasks = {t.name: t for t in (TranslationTask, ClassificationTask, CodeTask)}
    if name not in tasks:
        raise DataError(f"unknown task {name!r}; known tasks: {', '.join(tasks)}")
    return tasks[name]


TASK_FLAG = {"translation": "translate", "classification": "classify", "code": "code"}  # prepare --task


def task_name_of(data_dir: str | Path) -> str:
    """The task of a prepared data directory, from its data.json "format" (and "task": code generation
    is a translation directory marked "code"); translation if unreadable: the translation loader then
    reports what is wrong."""
    from multibranch.data.prepare import FORMAT
    from multibranch.data.prepare_classify import FORMAT as CLASSIFY_FORMAT
    from multibranch.data.prepare_code import TASK as CODE_TASK

    try:
        meta = json.loads((Path(data_dir) / "data.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "translation"
    if not isinstance(meta, dict):
        return "translation"
    if meta.get("format") == CLASSIFY_FORMAT:
        return "classification"
    return "code" if meta.get("format") == FORMAT and meta.get("task") == CODE_TASK else "translation"


def task_for_data(cfg: ExperimentConfig, data_dir: str | Path) -> Task:
    """Load the prepared data in `data_dir` with its task, and record the task in `cfg.task`.

    The data decides the task; a config that names another one (a classification preset on translation
    data, say) is refused rather than silently trained as the data's task. "translation" is the default and
    also fits code data (code generation is translation with code metrics)."""
    found = task_name_of(data_dir)
    if cfg.task not in ("translation", found):
        raise DataError(f"the config is for {cfg.task} but {data_dir} holds {found} data; "
                        f"prepare it with `multibranch prepare --task {TASK_FLAG[cfg.task]}` or pick a {found} preset")
    cfg.task = found  # type: ignore[assignment]
    return task_class(cfg.task)(cfg, Path(data_dir))


def build_task_model(cfg: ExperimentConfig) -> nn.Module:
    """A freshly initialised model for the experiment config (its `task` chooses the model)."""
    return task_class(cfg.task).build_model(cfg)
