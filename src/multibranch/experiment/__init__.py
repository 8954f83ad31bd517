"""An experiment = model + training + decoding config; presets carry the papers' names.

Presets are YAML files in `multibranch/configs/` (one per paper configuration and size). A preset may
name a `base` preset whose values it overrides (deep merge).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from multibranch.checkpoint.format import load_checkpoint
from multibranch.config import ConfigError, deep_merge, from_dict, load_yaml, parse_override, to_dict
from multibranch.experiment.decoding import DecodeConfig
from multibranch.experiment.training import TrainConfig
from multibranch.models import ModelConfig
from multibranch.models.classifier import ClassifierConfig

# the most common training settings under short names (`train --max-steps`, `fit(max_steps=...)`) -> config keys
TRAIN_SHORTCUTS = {
    "max_steps": "train.max_steps", "max_epochs": "train.max_epochs", "max_minutes": "train.max_minutes",
    "max_tokens": "train.max_tokens", "update_freq": "train.update_freq", "lr": "train.lr.lr",
    "warmup": "train.lr.warmup", "seed": "train.seed", "valid_every": "train.valid_every",
    "patience": "train.patience", "amp": "train.amp", "threads": "train.threads", "log_every": "train.log_every",
    "graphs": "train.graphs", "length_buckets": "train.length_buckets", "ema_decay": "train.ema_decay",
}


@dataclass
class ExperimentConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(max_epochs=100))
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    description: str = ""
    # the task (a name in multibranch.tasks.registry.TASKS), set by `train` from the prepared data's format
    task: str = "translation"
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentConfig:
        return from_dict(cls, data)


def preset_dir() -> Path:
    return Path(str(resources.files("multibranch") / "configs"))


def list_presets() -> list[str]:
    return sorted(p.stem for p in preset_dir().glob("*.yaml"))


def load_preset_dict(name: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The plain dict of preset `name` (or a YAML file path) with its `base` chain merged."""
    path = Path(name)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = preset_dir() / f"{name}.yaml"
        if not path.exists():

            close = difflib.get_close_matches(name, list_presets(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown preset {name!r}{hint}; known presets: {', '.join(list_presets())}")
    if name in _seen:
        raise ConfigError(f"preset {name!r} has a circular base chain: {' -> '.join(_seen + (name,))}")
    data = load_yaml(path)
    data.pop("paper_size", None)  # the published size of this file's configuration (paper_sizes.py); not inherited
    base = data.pop("base", None)
    if base:
        data = deep_merge(load_preset_dict(base, _seen + (name,)), data)
    return data


def resolve_config(
    preset: str | None = None, config_file: str | None = None, overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> ExperimentConfig:
    """Preset (or the config dict `base`, e.g. a checkpoint's), then a config file, then `key=value`
    overrides, validated into an ExperimentConfig."""
    data: dict[str, Any] = load_preset_dict(preset) if preset else deep_merge({}, base or {})
    if config_file:
        file_data = load_yaml(config_file)
        base = file_data.pop("base", None)
        if base:
            data = deep_merge(data, load_preset_dict(base))
        data = deep_merge(data, file_data)
    for text in overrides or []:
        data = deep_merge(data, parse_override(text))
    return ExperimentConfig.from_dict(data)


def train_config(preset: str | None, config_file: str | None, overrides: list[str], run_dir: str | Path,
                 resume: bool = False, init_from: str | Path | None = None) -> ExperimentConfig:
    """The config a `train` run starts from: the preset and/or config file, then the overrides. Without
    either, a --resume continues with the run's config.yaml, and a fresh --init-from start with the
    checkpoint's config (the model and settings its weights come with, e.g. an imported BERT)."""
    base = None
    if preset is None and config_file is None:
        saved = Path(run_dir) / "config.yaml"
        if resume and saved.exists():
            config_file = str(saved)
        elif init_from is not None and not resume:
            base = load_checkpoint(init_from)["config"]
        elif resume:
            raise ConfigError(f"--resume: no {saved} to continue from (no run there to resume); start a run with "
                              "--preset NAME or --config FILE")
        else:
            raise ConfigError("choose a model with --preset NAME or --config FILE (presets: `multibranch info --list`)")
    return resolve_config(preset, config_file, overrides, base=base)
