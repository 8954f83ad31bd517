"""The Task interface: everything task-specific the trainer needs, and nothing else.

A task is built from the experiment config and a prepared data directory. The trainer asks it for
the model, the training batches (index arrays into the train split), their collation, the loss of
a batch (summed, with the count it is normalised by) and the validation metrics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from multibranch.config import ConfigError
from multibranch.data.meta import require_examples

if TYPE_CHECKING:
    from multibranch.data.tokenizer import AnyTokenizer
    from multibranch.experiment import ExperimentConfig

Autocast = Callable[[], AbstractContextManager]


class Task(ABC):
    """One kind of training objective over one kind of prepared data.

    `best_metric` is the task's default validation metric (higher is better; "loss" is lower-better).
    """

    name: ClassVar[str]
    best_metric: ClassVar[str]
    # what `sample_size` counts (the training log's `<unit>` and `<unit>_per_s` keys) and its short
    # form in train.log's speed ("tok/s")
    sample_unit: ClassVar[str]
    speed_unit: ClassVar[str]
    # the `prepare --task` value that makes this task's data, and the command that uses its checkpoints
    prepare_flag: ClassVar[str]
    command: ClassVar[str]

    @classmethod
    @abstractmethod
    def owns_data(cls, meta: dict[str, Any]) -> bool:
        """Whether a prepared directory's data.json (`meta`) holds this task's data."""

    def __init__(self, cfg: ExperimentConfig, data_dir: Path) -> None:
        self.cfg, self.data_dir = cfg, data_dir
        self.data = self.load_data(data_dir)
        self._tokenizer = self.data.tokenizer()
        self.train_split = self.data.split("train")
        self.valid_split = self.data.split("valid") if "valid" in self.data.split_names else None
        for name, split in (("train", self.train_split), ("valid", self.valid_split)):
            if split is not None:
                require_examples(data_dir, name, len(split))  # before the trainer creates the run directory

    # ---- data ------------------------------------------------------------------------------------

    @staticmethod
    @abstractmethod
    def load_data(data_dir: Path) -> Any:
        """The prepared directory's loader (PreparedData, ClassificationData): it has `fingerprint`,
        `verify()`, `tokenizer()`, `split_names` and `split(name)`; DataError when it is not one."""

    @property
    def fingerprint(self) -> str:
        """The prepared data's fingerprint (recorded in checkpoints; a resume checks it)."""
        return self.data.fingerprint

    @property
    def tokenizer(self) -> AnyTokenizer:
        return self._tokenizer

    def verify(self) -> None:
        """DataError if the data files changed since `prepare` (checked before a resume)."""
        self.data.verify()

    @property
    def train_size(self) -> int:
        """Number of training examples."""
        return len(self.train_split)

    @property
    def has_valid(self) -> bool:
        return self.valid_split is not None

    # ---- model -----------------------------------------------------------------------------------

    @abstractmethod
    def fill_config(self) -> None:
        """Fill the data facts (vocabulary sizes, special ids, label count) into `cfg` and validate it."""

    @classmethod
    @abstractmethod
    def build_model(cls, cfg: ExperimentConfig) -> nn.Module:
        """A freshly initialised model for `cfg` (also used by `load_model`)."""

    @abstractmethod
    def describe_model(self) -> str:
        """A few words for the log, e.g. 'transformer/transformer layers'."""

    def check_init_from(self, config: dict[str, Any], path: Path) -> None:
        """Refuse (CheckpointError) or warn about `train --init-from` weights made for other outputs than
        this data's, given the checkpoint's config; shapes are checked by the trainer."""
        return None  # default: weights of the right shape suit the task (translation, code)

    # ---- batches and loss ------------------------------------------------------------------------

    @abstractmethod
    def train_batches(self, epoch: int) -> list[np.ndarray]:
        """This epoch's batches of training example indices (seeded by train.seed and `epoch`)."""

    @abstractmethod
    def collate(self, indices: np.ndarray, device: torch.device) -> Any:
        """The batch of training examples `indices`, on `device`."""

    supports_fixed_shapes: ClassVar[bool] = False  # whether use_length_buckets works
    fixed_shapes = False  # True once use_length_buckets made every training batch one of a few shapes

    def use_length_buckets(self, count: int) -> list[tuple[int, ...]]:
        """Pad every training batch to one of at most `count` fixed shapes (from the training data's lengths),
        the loss weighting padded positions 0; returns the shapes. A task without fixed-shape batches
        refuses (ConfigError)."""
        raise ConfigError(f"train.length_buckets: the {self.name} task has no fixed-shape batches; "
                          "leave it unset (and train.graphs off or auto)")

    @abstractmethod
    def sample_size(self, batch: Any) -> float:
        """What the loss of `batch` is normalised by (target tokens, sentences...)."""

    @abstractmethod
    def loss(self, forward: nn.Module, model: nn.Module, batch: Any) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """(training loss, NLL, counts): loss and NLL summed over `batch`'s `sample_size` units; counts
        are further sums the training log turns into its task fields (`train_fields`), e.g. the
        number of correct predictions; may be empty. `forward` is the module to call (a
        DistributedDataParallel wrapper in multi-process runs), `model` the bare model."""

    def train_fields(self, sums: dict[str, float]) -> dict[str, float]:
        """The task's own fields of a metrics.jsonl train record, from the sums over a log window:
        "loss", "nll", "size" (sample_size units) and the loss's counts. Default: none."""
        return {}

    def describe_train(self, record: dict[str, Any]) -> str:
        """The task's part of the 'train | step N | epoch E | loss L | ... | lr R | speed' line."""
        return ""

    # ---- validation ------------------------------------------------------------------------------

    @abstractmethod
    def validate(self, model: nn.Module, device: torch.device, autocast: Autocast,
                 progress: bool | None) -> dict[str, Any]:
        """Metrics on the valid split (at least "loss"; an optional "samples" list is logged at debug)."""

    @abstractmethod
    def describe_valid(self, result: dict[str, Any]) -> str:
        """The metrics part of the 'valid | step N | ...' log line."""
