"""Translation: parallel data, the encoder-decoder model, label-smoothed token loss, loss/ppl/BLEU."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from multibranch.config import ConfigError
from multibranch.data.batching import (
    LengthBuckets,
    collate,
    length_buckets,
    sharded_token_batches,
    token_batches,
)
from multibranch.data.parallel_prepare import FORMAT
from multibranch.evaluate.metrics import score_corpus
from multibranch.models import build_model
from multibranch.tasks.translation.dataset import PreparedData
from multibranch.tasks.translation.translator import Translator, show_progress
from multibranch.train.loss import output_layer_loss
from multibranch.train.task import Autocast, Task

if TYPE_CHECKING:
    from multibranch.data.batching import Batch
    from multibranch.experiment import ExperimentConfig
    from multibranch.tasks.translation.dataset import PreparedData


class TranslationTask(Task):
    name = "translation"
    best_metric = "bleu"
    sample_unit, speed_unit = "tokens", "tok/s"  # target tokens
    prepare_flag, command = "translate", "multibranch translate"

    @classmethod
    def owns_data(cls, meta: dict[str, Any]) -> bool:
        return meta.get("format") == FORMAT

    @staticmethod
    def load_data(data_dir: Path) -> PreparedData:
        return PreparedData.load(data_dir)

    def fill_config(self) -> None:
        m, tok = self.cfg.model, self._tokenizer
        m.src_vocab_size, m.tgt_vocab_size = tok.src_vocab_size, tok.tgt_vocab_size
        m.pad_id, m.bos_id, m.eos_id = tok.pad_id, tok.bos_id, tok.eos_id
        if m.share_embeddings == "all" and not tok.joint:
            raise ConfigError(
                "model.share_embeddings='all' needs a joint vocabulary, but the data was prepared with separate "
                "source/target SentencePiece models; re-run prepare without --separate-vocab or set "
                "model.share_embeddings=decoder"
            )
        m.validate()
        self._check_lengths()

    def _check_lengths(self) -> None:
        """Refuse (before the trainer creates the run directory) data that the batches or a learned position table
        cannot hold: a training or validation example over train.max_tokens, a sentence longer than
        model.max_positions. Reads each shard's lengths in turn, never all shards' at once."""
        t, m = self.cfg.train, self.cfg.model
        longest = [0, 0, 0]  # src, tgt, count of training examples over max_tokens
        for src, tgt in self.train_split.shard_lengths():
            if len(src):
                sizes = np.maximum(src, tgt) + 1  # [n] padded size of each example (+ EOS / BOS)
                longest = [max(longest[0], int(src.max())), max(longest[1], int(tgt.max())),
                           longest[2] + int(np.count_nonzero(sizes > t.max_tokens))]
        if longest[2]:
            size = max(longest[:2]) + 1
            raise ConfigError(f"train.max_tokens (--max-tokens) is {t.max_tokens}, but the longest training example "
                              f"in {self.data_dir} needs {size} (its {size - 1} tokens + EOS; {longest[2]} example(s) "
                              f"do not fit); raise --max-tokens to at least {size}, or prepare the data with a "
                              f"smaller --max-len")
        valid = self.valid_split
        if valid is not None and len(valid):
            found = _first_over(valid, t.max_tokens)
            if found is not None:
                i, size, count, largest = found
                raise ConfigError(
                    f"train.max_tokens (--max-tokens) is {t.max_tokens}, but validation example {i + 1} (line {i + 1} "
                    f"of {self.data_dir / 'valid.src.txt'} and valid.tgt.txt) needs {size} (its "
                    f"{size - 1} tokens + EOS; {count} validation example(s) do not fit); raise --max-tokens "
                    f"to at least {largest}, or {self._valid_remedy()}")
        if m.positions == "learned":  # a learned table has no row beyond max_positions
            needed = max(longest[:2]) + 1  # the source + EOS, BOS + the target
            if needed > m.max_positions:
                raise ConfigError(
                    f"model.max_positions={m.max_positions} (learned positions) is shorter than the training data "
                    f"in {self.data_dir}: its longest source has {longest[0]} tokens and its longest target "
                    f"{longest[1]}, which need {needed} positions (+1 for EOS/BOS); set model.max_positions to at "
                    f"least {needed}, or prepare the data with --max-len {m.max_positions - 1}")
            if valid is not None and len(valid):
                self._check_valid_positions(valid, m.max_positions)

    def _check_valid_positions(self, valid: Any, max_positions: int) -> None:
        """Refuse a validation example longer than a learned position table holds, naming its line: prepare's
        --max-len filters only the training pairs, so the remedy is the model's positions or the line itself."""
        found = _first_over(valid, max_positions)
        if found is not None:
            i, size, count, largest = found
            raise ConfigError(
                f"model.max_positions={max_positions} (learned positions) is shorter than validation example "
                f"{i + 1} (line {i + 1} of {self.data_dir / 'valid.src.txt'} and valid.tgt.txt), which needs "
                f"{size} positions ({count} validation example(s) do not fit; --max-len in prepare "
                f"filters only the training pairs); set model.max_positions to at least {largest} "
                f"(--set model.max_positions=N), or {self._valid_remedy()}")

    def _valid_remedy(self) -> str:
        """The end of a too-long validation example's message: the line to change, and where."""
        prefix = self.data.meta["splits"].get("valid", {}).get("prefix")
        return f"shorten or remove that line of the --valid files{f' ({prefix}.*)' if prefix else ''} and prepare again"

    @classmethod
    def build_model(cls, cfg: ExperimentConfig) -> nn.Module:
        return build_model(cfg.model)

    def describe_model(self) -> str:
        return f"{self.cfg.model.encoder.kind}/{self.cfg.model.decoder.kind} layers"

    supports_fixed_shapes = True
    buckets: LengthBuckets | None = None
    _train_lengths: tuple[np.ndarray, np.ndarray] | None = None  # (src, tgt) [n] each, with buckets

    def use_length_buckets(self, count: int) -> list[tuple[int, ...]]:
        t, split = self.cfg.train, self.train_split
        self._train_lengths = (np.asarray(split.src_lengths), np.asarray(split.tgt_lengths))
        self.buckets = length_buckets(*self._train_lengths, t.max_tokens, count, max_sentences=t.max_sentences,
                                      multiple=t.length_multiple)
        self.fixed_shapes = True
        return self.buckets.shapes

    def train_batches(self, epoch: int) -> list[np.ndarray]:
        t, split = self.cfg.train, self.train_split
        return sharded_token_batches(split.shard_lengths(), t.max_tokens, seed=t.seed, epoch=epoch, shuffle=True,
                                     max_sentences=t.max_sentences, buckets=self.buckets)

    def collate(self, indices: np.ndarray, device: torch.device, split=None) -> Batch:
        """A batch of `split` (default: train); training batches take their bucket's shape when buckets are on."""
        m = self.cfg.model
        shape = None
        if split is None and self.buckets is not None:
            src, tgt = self._train_lengths
            shape = self.buckets.shape(int(src[indices].max()), int(tgt[indices].max()))
        return collate(split or self.train_split, indices, m.pad_id, m.bos_id, m.eos_id, shape=shape).to(device)

    def sample_size(self, batch: Batch) -> float:
        return float(batch.n_tgt_tokens)

    def loss(self, forward: nn.Module, model: nn.Module, batch: Batch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        t, m = self.cfg.train, self.cfg.model
        features = forward(batch.src, batch.prev, features_only=True)  # [B, T, d]
        keep = batch.tgt.ne(m.pad_id)  # [B, T]
        if self.fixed_shapes:  # every position, pad weighted 0: no shape depends on the data
            loss, nll = output_layer_loss(features.flatten(0, 1), model.output_projection, model.output_bias,
                                          batch.tgt.flatten(), eps=t.label_smoothing, kind=t.label_smoothing_kind,
                                          pad_id=m.pad_id, weights=keep.flatten())
        else:  # the non-pad positions only: less work where shapes may vary
            loss, nll = output_layer_loss(features[keep], model.output_projection, model.output_bias,
                                          batch.tgt[keep], eps=t.label_smoothing, kind=t.label_smoothing_kind,
                                          pad_id=m.pad_id)
        return loss, nll, {}

    def train_fields(self, sums: dict[str, float]) -> dict[str, float]:
        return {"ppl": math.exp(min(sums["nll"] / max(sums["size"], 1.0), 50.0))}

    def describe_train(self, record: dict[str, Any]) -> str:
        return f"ppl {record['ppl']:.2f}"

    def validate(self, model: nn.Module, device: torch.device, autocast: Autocast,
                 progress: bool | None) -> dict[str, Any]:
        """Valid loss / NLL / perplexity (+ BLEU with the decode settings)."""

        split = self.valid_split
        loss_sum = nll_sum = tokens = 0.0
        for indices in token_batches(split.src_lengths, split.tgt_lengths, self.cfg.train.max_tokens, seed=0,
                                     epoch=0, shuffle=False):
            batch = self.collate(indices, device, split)
            with autocast():
                loss, nll, _ = self.loss(model, model, batch)
            loss_sum += float(loss)
            nll_sum += float(nll)
            tokens += batch.n_tgt_tokens
        result: dict[str, Any] = {"loss": loss_sum / tokens, "nll": nll_sum / tokens,
                                  "ppl": math.exp(min(nll_sum / tokens, 50.0))}
        if self.cfg.train.valid_bleu:
            result.update(self._valid_bleu(model, device, progress))
        return result

    def _valid_bleu(self, model: nn.Module, device: torch.device, progress: bool | None) -> dict[str, Any]:
        sources = self.valid_split.raw_src_lines()
        references = self.valid_split.raw_tgt_lines()
        if self.cfg.train.valid_max_sentences:
            sources = sources[: self.cfg.train.valid_max_sentences]
            references = references[: self.cfg.train.valid_max_sentences]
        start = time.perf_counter()
        translator = Translator(model, self._tokenizer, self.cfg.decode, device=device)
        hypotheses = translator.translate(sources, progress=show_progress(progress))  # a bar on a TTY
        return {**self.decode_scores(hypotheses, references), "decode_s": time.perf_counter() - start,
                "samples": list(zip(sources[:3], hypotheses[:3], references[:3]))}

    def decode_scores(self, hypotheses: list[str], references: list[str]) -> dict[str, Any]:
        """The validation scores of decoded valid sentences (translation: corpus BLEU and its signature)."""

        scores = score_corpus(hypotheses, [references], metrics=("bleu",))
        return {"bleu": scores["bleu"]["score"], "bleu_signature": scores["bleu"]["signature"]}

    def describe_valid(self, result: dict[str, Any]) -> str:
        bleu = f" | bleu {result['bleu']:.2f}" if "bleu" in result else ""
        return f"loss {result['loss']:.3f} | ppl {result['ppl']:.2f}{bleu}"


def _first_over(valid: Any, limit: int) -> tuple[int, int, int, int] | None:
    """The first validation example longer than `limit` (the longer side + EOS/BOS): (its index, its size, how
    many are over, the largest size), or None when every example fits."""
    sizes = np.maximum(valid.src_lengths, valid.tgt_lengths) + 1  # [n] the source + EOS, BOS + the target
    over = np.flatnonzero(sizes > limit)
    if not len(over):
        return None
    return int(over[0]), int(sizes[over[0]]), len(over), int(sizes.max())
