"""The task registry: one line per task, and the task of a prepared data directory or of a config.

Adding a task: a folder under tasks/ with its Task subclass (train/task.py says what it provides),
and its line in TASKS. A task folder imports no other task; a task that refines another (code
generation refines translation) is a `Refinement` (tasks/refinement.py), joined to its base here.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from multibranch.errors import ConfigError, DataError
from multibranch.experiment import ExperimentConfig
from multibranch.tasks.classification.task import ClassificationTask
from multibranch.tasks.code.task import CodeTask
from multibranch.tasks.translation.task import TranslationTask
from multibranch.train.task import Task

log = logging.getLogger(__name__)

# the first task whose `owns_data` accepts a data.json names the data's task: code (a translation
# directory marked "code") before translation
TASKS: dict[str, type[Task]] = {task.name: task for task in (CodeTask.of(TranslationTask), TranslationTask,
                                                             ClassificationTask)}
DEFAULT_TASK = "translation"  # a config that names no task; also what unreadable data is loaded as


def task_class(name: str) -> type[Task]:
    if name not in TASKS:
        raise DataError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[name]


def task_name_of(data_dir: str | Path, default: str = DEFAULT_TASK) -> str:
    """The task of a prepared data directory, from its data.json; `default` if it is missing, unreadable or of
    no known task: that task's loader then reports what is wrong."""
    try:
        meta: Any = json.loads((Path(data_dir) / "data.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default
    if isinstance(meta, dict):
        for name, task in TASKS.items():
            if task.owns_data(meta):
                return name
    return default


def task_for_data(cfg: ExperimentConfig, data_dir: str | Path) -> Task:
    """Load the prepared data in `data_dir` with its task, and record the task in `cfg.task`.

    The data decides the task; a config that names another one (a classification preset on translation
    data, say) is refused rather than silently trained as the data's task. The default task also fits
    code data (code generation is translation with code metrics). On classification data it trains a
    classifier from the config's model section (its encoder), with a warning: the default cannot tell a
    translation preset from a config that names no task."""
    found = task_name_of(data_dir, default=cfg.task)  # no data of a known task: the config's task loader says why
    if cfg.task not in (DEFAULT_TASK, found):
        raise DataError(f"the config is for {cfg.task} but {data_dir} holds {found} data; prepare it with "
                        f"`multibranch prepare --task {task_class(cfg.task).prepare_flag}` or pick a {found} preset")
    if cfg.task == DEFAULT_TASK and found == "classification":
        log.warning("%s holds classification data but the config is not a classification one (no `task: "
                    "classification`, e.g. a translation preset): training a classifier from its model section's "
                    "encoder (its decoder and decode settings are unused); pick a classification preset (`multibranch "
                    "info --list`) or set task: classification", data_dir)
    cfg.task = found
    return task_class(found)(cfg, Path(data_dir))


def check_resume_task(run_dir: str | Path, data_dir: str | Path) -> None:
    """DataError, before any data is loaded, when the run to resume trains a classifier and the data is not
    classification data, or the other way round (else the data's task would be taken with a warning first, and
    the resume refused after it). Runs and data whose task cannot be read are left to the trainer's checks."""
    try:
        saved: Any = yaml.safe_load((Path(run_dir) / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return
    run_task = saved.get("task") if isinstance(saved, dict) else None
    data_task = task_name_of(data_dir, default="")
    if run_task in TASKS and data_task and (run_task == "classification") != (data_task == "classification"):
        raise DataError(f"cannot resume {run_dir}: it trains a {run_task} model and {data_dir} holds {data_task} "
                        "data; resume it on the data it was trained on, or start a new run")


def build_task_model(cfg: ExperimentConfig) -> nn.Module:
    """A freshly initialised model for the experiment config (its `task` chooses the model)."""
    return task_class(cfg.task).build_model(cfg)



def model_for_counting(cfg: ExperimentConfig, vocab_size: int, num_labels: int | None = None,
                       tgt_vocab_size: int | None = None) -> tuple[nn.Module, str]:
    """The model of a preset's config with the data facts it lacks filled in (`multibranch info`): the
    vocabulary `vocab_size` (target: `tgt_vocab_size`, default the same) unless the config sets one, and for
    a classifier `num_labels` (default: the config's, else 2); with the words that say what was assumed. Built
    on the meta device: parameters with shapes and no storage, so a full-size preset counts in milliseconds."""
    if not cfg.model.src_vocab_size:
        cfg.model.src_vocab_size = vocab_size
        cfg.model.tgt_vocab_size = tgt_vocab_size or vocab_size
    counting = f"vocabulary {cfg.model.src_vocab_size}/{cfg.model.tgt_vocab_size}"
    if cfg.task == "classification":
        labels = num_labels or cfg.classifier.num_labels or 2
        if labels < 2:
            raise ConfigError(f"--num-labels {labels}: a classifier needs at least 2 labels")
        cfg.classifier.num_labels = labels
        counting = f"classification, vocabulary {cfg.model.src_vocab_size}, {labels} labels"
    with torch.device("meta"):
        return build_task_model(cfg), counting
