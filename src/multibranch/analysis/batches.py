"""The evaluation set of an analysis, for either task: batches of a prepared split (or its first N
examples) and how the model reads them.

A translation split gives teacher-forced `Batch`es (source, decoder input, target); a classification
split gives `LabelBatch`es (BOS + ids + EOS, label). The analyses stay task-agnostic through:

    batch_units(batch)             -> target tokens (translation) or sentences (classification)
    run_batch(model, batch)        -> {role: real query positions [B, L]} after one eval forward
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from multibranch.data.batching import Batch, collate, token_batches
from multibranch.data.parallel_prepare import FORMAT as TRANSLATION_FORMAT
from multibranch.errors import DataError
from multibranch.tasks.classification.prepare import FORMAT as CLASSIFICATION_FORMAT
from multibranch.tasks.classification.task import LabelBatch, collate_labels
from multibranch.tasks.registry import task_class, task_name_of

if TYPE_CHECKING:
    from multibranch.models import ModelConfig

AnyBatch = Batch | LabelBatch


def load_task_data(task: str, data_dir: str | Path, ckpt: str) -> Any:
    """The prepared data in `data_dir`, read as `task` (the checkpoint's). DataError naming both tasks when
    the directory holds another task's data (a translation checkpoint with classification data, say),
    rather than the loader's complaint about a format it does not read."""
    try:
        return task_class(task).load_data(Path(data_dir))
    except DataError:
        found = data_task(data_dir)
        if found is not None and found != task:
            raise DataError(f"{ckpt} is a {task} checkpoint but {data_dir} holds {found} data: give the "
                            f"{task} data the model was trained on") from None
        raise


def data_task(data_dir: str | Path) -> str | None:
    """The task of a prepared data directory whose data.json names a format of ours; None otherwise."""
    try:
        meta = json.loads((Path(data_dir) / "data.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") not in (TRANSLATION_FORMAT, CLASSIFICATION_FORMAT):
        return None
    return task_name_of(data_dir)


def check_vocabulary(data: Any, model_cfg: ModelConfig, ckpt: str) -> None:
    """DataError unless the prepared data (translation or classification) has the vocabulary sizes the
    model was trained with."""
    sizes = data.meta["vocab_size"]
    src, tgt = (sizes["src"], sizes["tgt"]) if isinstance(sizes, dict) else (sizes, sizes)
    if (src, tgt) != (model_cfg.src_vocab_size, model_cfg.tgt_vocab_size):
        raise DataError(f"{data.directory} has vocabulary sizes {src}/{tgt} but {ckpt} was trained "
                        f"with {model_cfg.src_vocab_size}/{model_cfg.tgt_vocab_size}: not the model's data")


def teacher_forced_batches(
    split: Any,
    model_cfg: ModelConfig,
    max_tokens: int = 4096,
    limit: int | None = None,
    device: torch.device | str = "cpu",
) -> list[AnyBatch]:
    """Length-sorted batches of at most `max_tokens` padded tokens over the first `limit` examples of
    `split` (all when None), in a fixed order, on `device`: `Batch`es of a translation split,
    `LabelBatch`es of a classification split."""
    n = len(split) if limit is None else min(limit, len(split))
    m = model_cfg
    if hasattr(split, "labels"):  # a ClassificationSplit: BOS + ids (+ EOS, added by token_batches' count)
        lengths = np.asarray(split.lengths[:n]) + 1
        groups = token_batches(lengths, lengths, max_tokens, seed=0, epoch=0, shuffle=False)
        return [collate_labels(split, indices, m.pad_id, m.bos_id, m.eos_id).to(device) for indices in groups]
    src_lengths = np.asarray(split.src_lengths[:n])
    tgt_lengths = np.asarray(split.tgt_lengths[:n])
    groups = token_batches(src_lengths, tgt_lengths, max_tokens, seed=0, epoch=0, shuffle=False)
    return [collate(split, indices, m.pad_id, m.bos_id, m.eos_id).to(device) for indices in groups]


def batch_units(batch: AnyBatch) -> int:
    """What a summed loss of the batch is normalised by: target tokens, or sentences of a LabelBatch."""
    return len(batch) if isinstance(batch, LabelBatch) else int(batch.n_tgt_tokens)


def run_batch(model: nn.Module, batch: AnyBatch) -> dict[str, Tensor]:
    """One forward of `model` on `batch` (for the attention probes); returns the real (non-pad) query
    positions [B, L] of each attention type the model has."""
    pad = model.config.pad_id
    if isinstance(batch, LabelBatch):
        model(batch.src)
        return {"encoder_self": batch.src.ne(pad)}
    model(batch.src, batch.prev, features_only=True)
    tgt_real = batch.tgt.ne(pad)
    return {"encoder_self": batch.src.ne(pad), "decoder_self": tgt_real, "cross": tgt_real}
