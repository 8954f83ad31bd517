"""Encoder-decoder model for every layer kind: embeddings, encoder stack, decoder stack, output layer.

    src [B, S] -> encode -> EncoderOut(out [B, S, d], padding_mask [B, S])
    prev_tokens [B, T] + EncoderOut -> decoder features [B, T, d] -> logits [B, T, V]

Incremental decoding: `decode_step(tokens [B, 1], enc, state)` advances a `DecoderState`; `enc` may
have B / g rows, each shared by g consecutive token rows (beam search's hypotheses of one sentence).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multibranch.models.config import ModelConfig
from multibranch.models.encoder import Embedder, Encoder, EncoderOut, reset_model_parameters
from multibranch.modules.packed_linear import PackedLinear, PackKind, pack_linear
from multibranch.modules.state import DecoderState

__all__ = ["Decoder", "Embedder", "Encoder", "EncoderOut", "Seq2SeqModel"]


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding):
        super().__init__()
        self.embed = Embedder(cfg, tokens)
        self.layers = nn.ModuleList(cfg.decoder.build_decoder_layer(cfg, i) for i in range(cfg.decoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.norm == "pre" else None

    def forward(self, prev_tokens: Tensor, enc: EncoderOut, state: DecoderState | None = None) -> Tensor:
        """prev_tokens [B, T] (the new tokens only, when `state` is given) -> features [B, T, d]."""
        offset = state.offset() if state is not None else 0
        y = self.embed(prev_tokens, offset)
        for i, layer in enumerate(self.layers):
            cache = state.view(f"decoder.{i}") if state is not None else None
            y = layer(y, enc.out, enc.padding_mask, cache)
        if self.final_norm is not None:
            y = self.final_norm(y)
        if state is not None:
            state.advance(prev_tokens.shape[1])
        return y


class Seq2SeqModel(nn.Module):
    """Encoder-decoder Transformer of any layer kind (see ModelConfig)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        d = cfg.d_model
        src_tokens = nn.Embedding(cfg.src_vocab_size, d, padding_idx=cfg.pad_id)
        if cfg.share_embeddings == "all":
            tgt_tokens = src_tokens
        else:
            tgt_tokens = nn.Embedding(cfg.tgt_vocab_size, d, padding_idx=cfg.pad_id)
        self.encoder = Encoder(cfg, src_tokens)
        self.decoder = Decoder(cfg, tgt_tokens)
        if cfg.share_embeddings == "none":
            self.output_weight: nn.Parameter | None = nn.Parameter(torch.empty(cfg.tgt_vocab_size, d))
        else:
            self.output_weight = None  # tied to the decoder's token embedding
        self.output_bias = nn.Parameter(torch.zeros(cfg.tgt_vocab_size)) if cfg.output_bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embeddings N(0, d^-1/2) with a zero padding row; every other module initialises itself
        according to `config.init` ("xavier", fairseq-style, or "torch", PyTorch's defaults)."""
        reset_model_parameters(self, self.config)
        if self.output_weight is not None:
            nn.init.normal_(self.output_weight, std=self.config.d_model**-0.5)

    # ---- output layer ----------------------------------------------------------------------------

    @property
    def output_projection(self) -> Tensor:
        """[V, d] output embedding (tied to the decoder's input embedding unless share_embeddings='none')."""
        return self.decoder.embed.tokens.weight if self.output_weight is None else self.output_weight

    packed_output: PackedLinear | None = None  # set by pack_linears on a decoding copy

    def pack_linears(self, kind: PackKind) -> None:
        """A packed output layer (modules/packed_linear.py), used in eval mode; the layers pack their own."""
        with torch.no_grad():
            self.packed_output = pack_linear(self.output_projection, self.output_bias, kind)

    def logits(self, features: Tensor) -> Tensor:
        """features [..., d] -> logits [..., V]."""
        if self.packed_output is not None and not self.training:
            return self.packed_output(features)
        return F.linear(features, self.output_projection, self.output_bias)

    # ---- full-sequence and incremental forward ---------------------------------------------------

    def encode(self, src: Tensor) -> EncoderOut:
        return self.encoder(src)

    def features(self, src: Tensor, prev_tokens: Tensor) -> Tensor:
        """Teacher-forced decoder features [B, T, d] (the trainer projects only non-pad positions)."""
        return self.decoder(prev_tokens, self.encoder(src))

    def forward(self, src: Tensor, prev_tokens: Tensor, features_only: bool = False) -> Tensor:
        """src [B, S], prev_tokens [B, T] -> logits [B, T, V] (or features [B, T, d] if features_only;
        the trainer uses that through DDP and projects only the non-pad positions)."""
        features = self.features(src, prev_tokens)
        return features if features_only else self.logits(features)

    def decode_step(self, tokens: Tensor, enc: EncoderOut, state: DecoderState) -> Tensor:
        """One incremental step: tokens [B, 1] (the newest token of each hypothesis) -> logits [B, V] (fp32)."""
        features = self.decoder(tokens, enc, state)  # [B, 1, d]
        return self.logits(features[:, -1]).float()

    # ---- introspection ---------------------------------------------------------------------------

    def parameter_counts(self) -> dict[str, int]:
        """Unique parameters per component: embeddings (incl. output layer), encoder, decoder, total."""
        seen: set[int] = set()
        counts = {"embeddings": 0, "encoder": 0, "decoder": 0}
        for name, param in self.named_parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            component = "embeddings" if ".embed." in name or name.startswith("output_") else name.split(".")[0]
            counts[component] += param.numel()
        counts["total"] = sum(counts.values())
        return counts
