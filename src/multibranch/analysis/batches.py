"""The evaluation set of an analysis: teacher-forced batches of a prepared split (or its first N examples)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from multibranch.data.batching import Batch, collate, token_batches
from multibranch.data.errors import DataError

if TYPE_CHECKING:
    from multibranch.data.dataset import ParallelSplit, PreparedData
    from multibranch.models import ModelConfig


def check_vocabulary(data: PreparedData, model_cfg: ModelConfig, ckpt: str) -> None:
    """DataError unless the prepared data has the vocabulary sizes the model was trained with."""
    sizes = data.meta["vocab_size"]
    if (sizes["src"], sizes["tgt"]) != (model_cfg.src_vocab_size, model_cfg.tgt_vocab_size):
        raise DataError(f"{data.directory} has vocabulary sizes {sizes['src']}/{sizes['tgt']} but {ckpt} was trained "
                        f"with {model_cfg.src_vocab_size}/{model_cfg.tgt_vocab_size}: not the model's data")


def teacher_forced_batches(
    split: ParallelSplit,
    model_cfg: ModelConfig,
    max_tokens: int = 4096,
    limit: int | None = None,
    device: torch.device | str = "cpu",
) -> list[Batch]:
    """Length-sorted batches of at most `max_tokens` padded tokens over the first `limit` examples of
    `split` (all when None), in a fixed order, on `device`."""
    n = len(split) if limit is None else min(limit, len(split))
    src_lengths = np.asarray(split.src_lengths[:n])
    tgt_lengths = np.asarray(split.tgt_lengths[:n])
    groups = token_batches(src_lengths, tgt_lengths, max_tokens, seed=0, epoch=0, shuffle=False)
    return [collate(split, indices, model_cfg.pad_id, model_cfg.bos_id, model_cfg.eos_id).to(device)
            for indices in groups]
