"""The shared Transformer encoder: embeddings + encoder layers of any kind (+ final norm).

    src [B, S] -> Encoder -> EncoderOut(out [B, S, d], padding_mask [B, S])

Used by the seq2seq model (models/seq2seq.py) and the classifier (models/classifier.py).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from multibranch.models.config import ModelConfig
from multibranch.modules.dropout import dropout
from multibranch.modules.positions import LearnedPositions, SinusoidalPositions


@dataclass
class EncoderOut:
    """Encoder output [B, S, d] and its padding mask [B, S] (True at padding)."""

    out: Tensor
    padding_mask: Tensor

    def index_select(self, index: Tensor) -> EncoderOut:
        return EncoderOut(self.out.index_select(0, index), self.padding_mask.index_select(0, index))


def segment_ids(src: Tensor, eos_id: int) -> Tensor:
    """src [B, S] -> [B, S] long: 0 up to and including the first EOS (SEP), 1 after it (BERT's token-type
    ids of `[CLS] a [SEP] b [SEP]`; all 0 for `[CLS] a [SEP]`). Padding after b gets 1: it is masked."""
    eos = src.eq(eos_id).long()  # [B, S]
    return (eos.cumsum(1) - eos).gt(0).long()  # EOS tokens strictly before each position > 0


class Embedder(nn.Module):
    """Token embedding * sqrt(d) (optional) + absolute positions + segments (optional), LayerNorm
    (optional), then dropout."""

    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding, segments: int = 0):
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        if cfg.positions == "sinusoidal":
            self.positions: nn.Module | None = SinusoidalPositions(cfg.d_model, cfg.max_positions)
        elif cfg.positions == "learned":
            self.positions = LearnedPositions(cfg.d_model, cfg.max_positions)
        else:
            self.positions = None
        self.segments = nn.Embedding(segments, cfg.d_model) if segments else None
        self.eos_id = cfg.eos_id
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.embedding_norm else None
        self.dropout = cfg.dropout

    def forward(self, ids: Tensor, offset: int | Tensor = 0) -> Tensor:
        """ids [B, L] -> [B, L, d]; `offset` is the position of ids[:, 0] (a 0-d tensor in a static decoding step)."""
        x = self.tokens(ids)
        if self.scale != 1.0:
            x = x * self.scale
        if self.positions is not None:
            x = x + self.positions(ids.shape[1], offset)
        if self.segments is not None:
            x = x + self.segments(segment_ids(ids, self.eos_id))  # [B, L, d]
        if self.norm is not None:
            x = self.norm(x)
        return dropout(x, self.dropout, self.training)


class Encoder(nn.Module):
    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding):
        super().__init__()
        self.embed = Embedder(cfg, tokens, cfg.segments)
        self.layers = nn.ModuleList(cfg.encoder.build_encoder_layer(cfg, i) for i in range(cfg.encoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.norm == "pre" else None
        self.pad_id = cfg.pad_id

    def forward(self, src: Tensor) -> EncoderOut:
        """src [B, S] -> EncoderOut."""
        padding_mask = src.eq(self.pad_id)  # [B, S]
        x = self.embed(src)
        for layer in self.layers:
            x = layer(x, padding_mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return EncoderOut(x, padding_mask)


def reset_model_parameters(root: nn.Module, cfg: ModelConfig) -> None:
    """Embeddings N(0, d^-1/2) with a zero padding row; every other module under `root` initialises
    itself according to `cfg.init` ("xavier", fairseq-style, or "torch", PyTorch's defaults)."""
    done: set[int] = set()  # modules initialised by an ancestor's own reset_parameters
    for module in root.modules():
        if module is root or id(module) in done:
            continue
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=cfg.d_model**-0.5)
            with torch.no_grad():
                module.weight[cfg.pad_id].zero_()
        elif "scheme" in inspect.signature(getattr(module, "reset_parameters", len)).parameters:
            module.reset_parameters(scheme=cfg.init)
            done.update(id(m) for m in module.modules())
        elif isinstance(module, nn.Linear) and cfg.init == "xavier":
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
