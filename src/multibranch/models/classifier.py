"""Sequence classifier: the shared Transformer encoder + pooling + dense tanh + dropout + linear.

    src [B, S] (BOS + ids + EOS, right-padded) -> Encoder -> [B, S, d] -> pool -> [B, d]
        -> (dropout, if input_dropout) -> tanh(dense) -> dropout -> logits [B, C]

Pooling "first" takes the encoder state of the first position (the tasks put BOS there, as a CLS
token); "mean" averages the states of the non-pad positions; "max" takes each feature's largest value
over the non-pad positions (max-over-time, as text CNNs pool).

`token_dropout` (training only) is word dropout (Iyyer et al. 2015, deep averaging networks): each text
token becomes padding with that probability, so attention and pooling skip it for that batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from multibranch.config import ConfigError
from multibranch.models.config import ModelConfig
from multibranch.models.encoder import Encoder, reset_model_parameters
from multibranch.modules.dropout import dropout


@dataclass
class ClassifierConfig:
    """The classification head; `num_labels` and the label names are filled in from the data by `train`.

    `dropout`: the head's dropout rate (None: model.dropout); `input_dropout` also applies it to the
    pooled vector before the dense layer (RoBERTa's head does; BERT's does not). `token_dropout`: the
    probability that a text token (not BOS/EOS) is dropped from a training example (`drop_tokens`).
    `subword_sampling`: SentencePiece's sampling alpha for training texts (subword regularisation; BPE-
    dropout for a BPE model): each training batch re-segments its raw texts (the task's collate); 0 keeps
    the segmentation `prepare` stored. `pairs`: the model reads sentence pairs (`BOS a SEP b EOS`, filled in
    from the data by `train`); a pair model is refused single texts and the reverse.
    """

    pooling: Literal["first", "mean", "max"] = "first"
    num_labels: int = 0
    labels: list[str] = field(default_factory=list)
    dropout: float | None = None
    input_dropout: bool = False
    token_dropout: float = 0.0
    subword_sampling: float = 0.0
    pairs: bool = False

    def validate(self) -> None:
        if self.pooling not in ("first", "mean", "max"):
            raise ConfigError(f"classifier.pooling={self.pooling!r} must be 'first', 'mean' or 'max'")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"classifier.dropout={self.dropout} must be in [0, 1)")
        if not 0.0 <= self.token_dropout < 1.0:
            raise ConfigError(f"classifier.token_dropout={self.token_dropout} must be in [0, 1)")
        if not 0.0 <= self.subword_sampling < 1.0:
            raise ConfigError(f"classifier.subword_sampling={self.subword_sampling} must be in [0, 1)")


def pool(states: Tensor, padding_mask: Tensor, how: str) -> Tensor:
    """states [B, S, d], padding_mask [B, S] (True at padding) -> [B, d]."""
    if how == "first":
        return states[:, 0]
    if how == "max":
        return states.masked_fill(padding_mask.unsqueeze(-1), float("-inf")).amax(1)
    keep = (~padding_mask).unsqueeze(-1).to(states.dtype)  # [B, S, 1]
    return (states * keep).sum(1) / keep.sum(1).clamp_min(1.0)


def drop_tokens(src: Tensor, rate: float, cfg: ModelConfig) -> Tensor:
    """src [B, S] -> src with each text token (not pad, BOS or EOS) replaced by pad with probability
    `rate`; the encoder's padding mask then hides it from attention and pooling."""
    text = src.ne(cfg.pad_id) & src.ne(cfg.bos_id) & src.ne(cfg.eos_id)  # [B, S]
    dropped = text & (torch.rand(src.shape, device=src.device) < rate)  # [B, S]
    return src.masked_fill(dropped, cfg.pad_id)


class Classifier(nn.Module):
    """Encoder of any layer kind + pooling head (see module docstring)."""

    def __init__(self, cfg: ModelConfig, head: ClassifierConfig):
        super().__init__()
        cfg.validate()
        head.validate()
        if head.num_labels < 2:
            raise ConfigError(f"classifier.num_labels={head.num_labels} must be >= 2 (it is filled in from the data)")
        self.config, self.head = cfg, head
        self.encoder = Encoder(cfg, nn.Embedding(cfg.src_vocab_size, cfg.d_model, padding_idx=cfg.pad_id))
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.out = nn.Linear(cfg.d_model, head.num_labels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_model_parameters(self, self.config)

    def forward(self, src: Tensor) -> Tensor:
        """src [B, S] -> logits [B, C]."""
        if self.training and self.head.token_dropout > 0:
            src = drop_tokens(src, self.head.token_dropout, self.config)
        enc = self.encoder(src)
        rate = self.config.dropout if self.head.dropout is None else self.head.dropout
        pooled = pool(enc.out, enc.padding_mask, self.head.pooling)  # [B, d]
        if self.head.input_dropout:
            pooled = dropout(pooled, rate, self.training)
        hidden = dropout(torch.tanh(self.dense(pooled)), rate, self.training)  # [B, d]
        return self.out(hidden)

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per component: embeddings, encoder (layers), head, total."""
        counts = {"embeddings": 0, "encoder": 0, "head": 0}
        for name, param in self.named_parameters():
            component = "embeddings" if ".embed." in name else name.split(".")[0]
            counts["head" if component in ("dense", "out") else component] += param.numel()
        counts["total"] = sum(counts.values())
        return counts
