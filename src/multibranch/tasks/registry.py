"""The task registry: one line per task, and the task of a prepared data directory or a config.

Adding a task: a folder under tasks/ with its Task subclass, and one line in TASKS.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from torch import nn

from multibranch.errors import ConfigError, DataError
from multibranch.experiment import ExperimentConfig
from multibranch.tasks.classification.prepare import FORMAT as CLASSIFY_FORMAT
from multibranch.tasks.classification.task import ClassificationTask
from multibranch.tasks.code.prepare import TASK as CODE_TASK
from multibranch.tasks.code.task import CodeTask
from multibranch.tasks.translation.prepare import FORMAT
from multibranch.tasks.translation.task import TranslationTask
from multibranch.train.task import Task

log = logging.getLogger(__name__)

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
    also fits code data (code generation is translation with code metrics). On classification data it
    trains a classifier from the config's model section (its encoder), with a warning: the default cannot
    tell a translation preset from a config that names no task."""
    found = task_name_of(data_dir)
    if cfg.task not in ("translation", found):
        raise DataError(f"the config is for {cfg.task} but {data_dir} holds {found} data; "
                        f"prepare it with `multibranch prepare --task {TASK_FLAG[cfg.task]}` or pick a {found} preset")
    if cfg.task == "translation" and found == "classification":
        log.warning("%s holds classification data but the config is not a classification one (no `task: "
                    "classification`, e.g. a translation preset): training a classifier from its model section's "
                    "encoder (its decoder and decode settings are unused); pick a classification preset (`multibranch "
                    "info --list`) or set task: classification", data_dir)
    cfg.task = found  # type: ignore[assignment]
    return task_class(cfg.task)(cfg, Path(data_dir))


def build_task_model(cfg: ExperimentConfig) -> nn.Module:
    """A freshly initialised model for the experiment config (its `task` chooses the model)."""
    return task_class(cfg.task).build_model(cfg)



def model_for_counting(cfg: ExperimentConfig, vocab_size: int, num_labels: int | None = None) -> tuple[nn.Module, str]:
    """The model of a preset's config with the data facts it lacks filled in (`multibranch info`): the
    vocabulary `vocab_size` unless the config sets one, and for a classifier `num_labels` (default: the
    config's, else 2); with the words that say what was assumed."""
    if not cfg.model.src_vocab_size:
        cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = vocab_size
    counting = f"vocabulary {cfg.model.src_vocab_size}/{cfg.model.tgt_vocab_size}"
    if cfg.task == "classification":
        labels = num_labels or cfg.classifier.num_labels or 2
        if labels < 2:
            raise ConfigError(f"--num-labels {labels}: a classifier needs at least 2 labels")
        cfg.classifier.num_labels = labels
        counting = f"classification, vocabulary {cfg.model.src_vocab_size}, {labels} labels"
    return build_task_model(cfg), counting
