"""Labelling raw text with a trained classifier: its tokenizer (SentencePiece or HF), batches, softmax;
an ensemble of classifiers averages their probabilities."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from multibranch.data.tokenizer import AnyTokenizer
from multibranch.errors import CheckpointError
from multibranch.tasks.classification.task import encode_batch
from multibranch.tasks.loading import load_model


@torch.no_grad()
def classify_lines(model: nn.Module, tokenizer: AnyTokenizer, lines: list[str], device: torch.device | str = "cpu",
                   batch_size: int = 64) -> Tensor:
    """Class probabilities [n, C] (fp32) of `lines` (non-empty texts); inputs longer than the model's
    positions are truncated."""
    cfg = model.config
    limit = cfg.max_positions - 2  # BOS + EOS
    ids = [seq[:limit] for seq in tokenizer.encode_src(lines)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths together: less padding
    probs = torch.zeros(len(ids), model.head.num_labels)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = encode_batch([ids[i] for i in chunk], cfg.pad_id, cfg.bos_id, cfg.eos_id).to(device)  # [B, S]
        probs[chunk] = model(src).float().softmax(-1).cpu()  # [B, C]
    return probs


def label_names(config: object) -> list[str]:
    """The label names of a classifier's ExperimentConfig, in output order ("0", "1", ... if unnamed)."""
    head = config.classifier  # type: ignore[attr-defined]
    return head.labels or [str(i) for i in range(head.num_labels)]


def classify_text_lines(ckpts: list[str], lines: list[str], device: torch.device | str = "cpu",
                        batch_size: int = 64) -> tuple[list[str], list[list[float] | None]]:
    """(label names, per line its probabilities or None for an empty line) of `lines` under the mean
    of the classifiers `ckpts` (one: itself). Members are loaded one at a time (the memory of one model);
    each reads the text with its own tokenizer; all must have the same labels in the same order."""
    texts = [i for i, line in enumerate(lines) if line.strip()]
    labels: list[str] = []
    total = None  # [n, C] sum of the members' probabilities
    for ckpt in ckpts:
        loaded = load_model(ckpt, device, task="classification")
        if loaded.tokenizer is None:
            raise CheckpointError(f"{ckpt} has no tokenizer, so it cannot label raw text")
        names = label_names(loaded.config)
        if labels and names != labels:
            raise CheckpointError(f"{ckpt} has the labels {names}, {ckpts[0]} has {labels}: "
                                  "an ensemble needs the same labels in the same order")
        labels = names
        probs = classify_lines(loaded.model, loaded.tokenizer, [lines[i] for i in texts], device, batch_size)
        total = probs if total is None else total + probs
        del loaded
    assert total is not None, "no checkpoint given"
    mean = total / len(ckpts)
    per_line: list[list[float] | None] = [None] * len(lines)
    for row, i in enumerate(texts):
        per_line[i] = mean[row].tolist()
    return labels, per_line
