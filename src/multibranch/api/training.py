"""`fit` and `presets`: `multibranch train` and `multibranch info --list` for Python callers."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multibranch.api.checks import check_device, check_paths
from multibranch.api.model import user_errors
from multibranch.errors import ConfigError, UserError
from multibranch.experiment import (
    TRAIN_SHORTCUTS,
    ExperimentConfig,
    list_presets,
    resolve_config,
    train_config,
)
from multibranch.tasks import build_task_model
from multibranch.tasks import train as run_training
from multibranch.train.run_directory import auto_resume as auto_resume_choice
from multibranch.train.trainer import CheckpointEvent, RunCallback, RunOptions, ValidationEvent

__all__ = ["CheckpointEvent", "TrainResult", "ValidationEvent", "build", "fit", "presets"]

# the CLI's run-control flags in messages, as fit's arguments
RUN_ARGUMENTS = {"--auto-resume": "auto_resume=True", "--resume": "resume=True", "--force": "force=True"}


@contextmanager
def torch_settings_kept() -> Iterator[None]:
    """Training sets torch's thread count (`train.threads`) and deterministic algorithms (`train.deterministic`)
    for the process; a caller of `fit` gets its own back afterwards (the seeded random states stay seeded)."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def presets() -> list[str]:
    """The named presets (`multibranch info --list`), for `fit`."""
    return list_presets()


def build(preset_or_config: str | Path | ExperimentConfig, **overrides: Any) -> nn.Module:
    """An untrained model (torch module, eval mode) of a preset, a YAML config file or an ExperimentConfig, its
    weights drawn from the config's `train.seed` (the caller's random state is left as it was). `overrides`: dotted config keys
    (`**{"model.encoder.attention_branches": 3}`) or model fields by name (d_model=256, src_vocab_size=8000, ...)."""
    texts = []
    for name, value in overrides.items():
        key = name if "." in name else f"model.{name}"
        texts.append(f"{key}={json.dumps(value) if isinstance(value, (bool, str, list, dict)) or value is None else value}")
    if isinstance(preset_or_config, ExperimentConfig):
        cfg = resolve_config(overrides=texts, base=preset_or_config.to_dict())
    elif isinstance(preset_or_config, (str, Path)):
        name = str(preset_or_config)
        is_file = Path(name).suffix in (".yaml", ".yml")
        cfg = resolve_config(None if is_file else name, name if is_file else None, texts)
    else:
        raise UserError(f"build: give a preset name, a YAML config file or an ExperimentConfig, not "
                        f"{type(preset_or_config).__name__}")
    missing = [name for name in ("src_vocab_size", "tgt_vocab_size") if getattr(cfg.model, name) <= 0]
    if missing:
        raise ConfigError(f"build: {' and '.join(missing)} not set; give {'= and '.join(missing)}= (`train` takes "
                          "them from the prepared data)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed)
        return build_task_model(cfg).eval()


@dataclass
class TrainResult:
    """What a `train` run leaves: its directory, checkpoints (None when not written), the last update and
    the metrics of the last validation (loss, and bleu where measured)."""

    run_dir: Path
    best_checkpoint: Path | None
    last_checkpoint: Path | None
    step: int
    valid: dict[str, Any]


def _overrides(overrides: Mapping[str, Any]) -> list[str]:
    """`key=value` override texts of dotted keys ("train.max_steps") and of the CLI's shortcuts (max_steps,
    lr, warmup, ...: `multibranch train --max-steps`); ConfigError naming any other key."""
    out = []
    for name, value in overrides.items():
        key = name if "." in name else TRAIN_SHORTCUTS.get(name)
        if key is None:
            raise ConfigError(f"unknown override {name!r}: give a dotted config key (train.max_steps=20, "
                              f"model.encoder.branches=3) or a shortcut of `multibranch train`: "
                              f"{', '.join(TRAIN_SHORTCUTS)}")
        text = json.dumps(value) if isinstance(value, (bool, str, list, dict)) or value is None else str(value)
        out.append(f"{key}={text}")
    return out


def fit(preset_or_config: str | Path | ExperimentConfig | None = None, data: str | Path | None = None,
          out: str | Path | None = None, resume: bool = False, force: bool = False,
          device: str | torch.device = "auto",
          init_from: str | Path | None = None, stop_at_step: int | None = None, progress: bool = False,
          auto_resume: bool = False, on_validation: RunCallback | None = None,
          on_checkpoint: RunCallback | None = None, **overrides: Any) -> TrainResult:
    """Train a model as `multibranch train` does: a preset name, a YAML config file or an ExperimentConfig (None
    with `resume`: the run's config.yaml), on the prepared data directory `data`, writing the run
    directory `out`. An existing run is refused unless `force` (start over) or `resume` (continue exactly
    from out/last.pt); `auto_resume` resumes where out/last.pt exists and starts a new run otherwise (also over a
    run stopped before its first checkpoint), as `train --auto-resume`. `overrides`: dotted config keys (`**{"train.max_steps": 20}`) or the CLI's
    shortcuts as keywords (max_steps=20, lr=5e-4, valid_every=100, seed=1, ...).

    `on_validation(event)` is called after every validation with a ValidationEvent (step, epoch, metrics,
    improved); `on_checkpoint(event)` after every save with a CheckpointEvent (step, last, best: the paths
    written). Either returning True stops the run there, its checkpoints written (`resume=True` goes on)."""
    if data is None or out is None:
        raise UserError("train: give data= (a directory made by `multibranch prepare`) and out= (the run directory)")
    check_paths("fit", data=data, out=out, init_from=init_from)
    check_device("fit", device)
    for name, callback in (("on_validation", on_validation), ("on_checkpoint", on_checkpoint)):
        if callback is not None and not callable(callback):
            raise UserError(f"{name}: give a function of one event, not {type(callback).__name__}")
    if auto_resume:
        with user_errors(RUN_ARGUMENTS):
            resume, force = auto_resume_choice(out, resume=resume, force=force)
    texts = _overrides(overrides)
    if isinstance(preset_or_config, ExperimentConfig):
        cfg = resolve_config(overrides=texts, base=preset_or_config.to_dict())
    else:
        name = None if preset_or_config is None else str(preset_or_config)
        is_file = name is not None and Path(name).suffix in (".yaml", ".yml")
        cfg = train_config(None if is_file else name, name if is_file else None, texts, out, resume=resume,
                           init_from=init_from)
    run_dir = Path(out)
    opts = RunOptions(data_dir=Path(data), run_dir=run_dir, resume=resume, force=force,
                      init_from=None if init_from is None else Path(init_from), device=str(device), progress=progress,
                      stop_at_step=stop_at_step, on_validation=on_validation, on_checkpoint=on_checkpoint)
    with user_errors(RUN_ARGUMENTS), torch_settings_kept():
        state = run_training(cfg, opts)
    best, last = run_dir / "best.pt", run_dir / "last.pt"
    return TrainResult(run_dir, best if best.is_file() else None, last if last.is_file() else None, state.step,
                       dict(state.last_valid))
