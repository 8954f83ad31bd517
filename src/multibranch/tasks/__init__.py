"""Tasks: what the trainer trains. A task owns its data, model, batches, loss, validation and inference,
each in its own folder (translation/, classification/, code/); registry.py lists them.

    task = task_for_data(cfg, data_dir)   # chosen by the prepared directory's data.json "format"
    model = build_task_model(cfg)         # the model of a config (`cfg.task` records the task)
    train(cfg, RunOptions(data_dir, run_dir))
"""

from __future__ import annotations

from multibranch.experiment import ExperimentConfig
from multibranch.tasks.registry import (
    TASKS,
    build_task_model,
    check_resume_task,
    model_for_counting,
    task_class,
    task_for_data,
    task_name_of,
)
from multibranch.train.task import Task
from multibranch.train.trainer import RunOptions, Trainer, TrainState

__all__ = ["TASKS", "Task", "build_task_model", "model_for_counting", "task_class", "task_for_data",
           "task_name_of", "train"]


def train(cfg: ExperimentConfig, opts: RunOptions) -> TrainState:
    """Train `cfg` on the prepared data in `opts.data_dir` (its task chosen by the data), writing `opts.run_dir`."""
    if opts.resume:
        check_resume_task(opts.run_dir, opts.data_dir)
    return Trainer(cfg, opts, task_for_data).train()
