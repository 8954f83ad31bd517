"""The task registry: one line per task, and the task of a prepared data directory or a config.

Adding a task: a folder under tasks/ with its Task subclass, and one line in TASKS.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from multibranch.errors import DataError
from multibranch.experiment import ExperimentConfig
from multibranch.tasks.classification.prepare import FORMAT as CLASSIFY_FORMAT
from multibranch.tasks.classification.task import ClassificationTask
from multibranch.tasks.code.prepare import TASK as CODE_TASK
from multibranch.tasks.code.task import CodeTask
from multibranch.tasks.translation.prepare import FORMAT
from multibranch.tasks.translation.task import TranslationTask
from multibranch.train.task import Task

TASKS: dict[str, type[Task]] = {task.name: task for task in (TranslationTask, ClassificationTask, CodeTask)}


def task_class(name: str) -> type[Task]:
    if name not in TASKS:
        raise DataError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[name]


TASK_FLAG = {"translation": "translate", "classification": "classify", "code": "code"}  # prepare --task


def task_name_of(data_dir: str | Path) -> str:
    """The task of a prepared data directory, from its data.json "format" (and "task": code generation
    is a translation directory marked "code"); translation if unreadable: the translation loader then
    reports what is wrong."""
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

