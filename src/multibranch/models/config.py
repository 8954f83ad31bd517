"""The typed contract of a model: `ModelConfig` and the per-kind layer configs.

A model is fully described by a ModelConfig. Encoder and decoder layers are polymorphic sections
(`LayerConfig` variants registered by kind: transformer/MAT, weighted, mute, muse); each variant
knows how to build its encoder and decoder layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from multibranch.config import ConfigError, Tagged
from multibranch.schedules import RateConfig

if TYPE_CHECKING:
    from torch import nn


class LayerConfig(Tagged):
    """Base of every layer kind. Variants are dataclasses with a `kind` field and two builders."""

    kind: str

    def build_encoder_layer(self, model: ModelConfig, index: int) -> nn.Module:
        raise ConfigError(f"layer kind {self.kind!r} has no encoder layer")

    def build_decoder_layer(self, model: ModelConfig, index: int) -> nn.Module:
        raise ConfigError(f"layer kind {self.kind!r} has no decoder layer")

    def check(self, model: ModelConfig) -> None:
        """Validate against the whole model config (e.g. head counts); raise ConfigError."""


@dataclass
class DropHeadConfig:
    """Scheduled DropHead (docs/papers.md#scheduled-drophead): whole-head dropout on the chosen attention modules."""

    rate: RateConfig = field(default_factory=RateConfig)
    encoder_self: bool = True
    decoder_self: bool = True
    cross: bool = True
    max_redraws: int = 10


@dataclass
class ModelConfig:
    """An encoder-decoder Transformer of any layer kind.

    Widths follow the papers' notation: `ffn_dim` is the inner width d_h of one FFN (branch).
    `share_embeddings`: "none" (three tables), "decoder" (decoder input = output projection),
    "all" (joint vocabulary: encoder, decoder and output share one table).
    `embedding_norm` adds a LayerNorm on the summed token + position embeddings (before dropout; BERT,
    RoBERTa); `norm_eps` is the epsilon of every LayerNorm. `segments` > 0 adds a table of that many
    segment (BERT token-type) embeddings to the encoder's input: segment 1 from the first position after
    the first EOS (SEP) on, so `[CLS] a [SEP] b [SEP]` gives BERT's token-type ids (encoder only).
    """

    d_model: int = 512
    heads: int = 8
    ffn_dim: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    norm: Literal["post", "pre"] = "post"
    activation: Literal["relu", "gelu", "swish"] = "relu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    positions: Literal["sinusoidal", "learned", "none"] = "sinusoidal"
    max_positions: int = 1024
    relative_positions: int = 0
    share_relative_kv: bool = False
    share_embeddings: Literal["none", "decoder", "all"] = "all"
    scale_embedding: bool = True
    embedding_norm: bool = False
    segments: int = 0
    norm_eps: float = 1e-5
    output_bias: bool = False
    init: Literal["xavier", "torch"] = "xavier"
    encoder: LayerConfig = field(default_factory=lambda: LayerConfig.variant("transformer")())
    decoder: LayerConfig = field(default_factory=lambda: LayerConfig.variant("transformer")())
    drophead: DropHeadConfig = field(default_factory=DropHeadConfig)
    # vocabulary facts, filled in from the data by `train`
    src_vocab_size: int = 0
    tgt_vocab_size: int = 0
    pad_id: int = 0
    bos_id: int = 2
    eos_id: int = 3

    def validate(self) -> None:
        if self.d_model % self.heads:
            raise ConfigError(f"d_model={self.d_model} must be divisible by heads={self.heads}")
        if self.segments < 0 or self.segments == 1:
            raise ConfigError(f"segments={self.segments} must be 0 (none) or >= 2")
        if not self.norm_eps > 0:
            raise ConfigError(f"norm_eps={self.norm_eps} must be > 0")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name}={getattr(self, name)} must be in [0, 1)")
        if self.share_embeddings == "all" and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError(
                f"share_embeddings='all' needs one joint vocabulary, but src_vocab_size={self.src_vocab_size} "
                f"and tgt_vocab_size={self.tgt_vocab_size}; prepare the data with --joint or use 'decoder'"
            )
        self.encoder.check(self)
        self.decoder.check(self)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads
