"""Labelling raw text with a trained classifier: its tokenizer (SentencePiece or HF), batches, softmax;
an ensemble of classifiers averages their probabilities."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from multibranch.data.tokenizer import AnyTokenizer
from multibranch.tasks.classification.task import encode_batch


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
