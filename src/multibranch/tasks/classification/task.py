"""Text classification: labelled prepared data, encoder + pooling classifier, cross-entropy,
validation loss / accuracy / macro-F1 (best metric: accuracy).

Every example is fed as BOS + ids + EOS: BOS is the CLS position that "first" pooling reads. With
`classifier.subword_sampling` each training batch re-segments its raw texts with SentencePiece
sampling; batches are still formed from the stored lengths (sampled segmentations are longer).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multibranch.checkpoint.format import CheckpointError
from multibranch.config import ConfigError
from multibranch.data.batching import token_batches
from multibranch.models.classifier import Classifier
from multibranch.tasks.classification.dataset import ClassificationData
from multibranch.tasks.classification.metrics import classification_scores
from multibranch.tasks.classification.prepare import FORMAT
from multibranch.train.task import Autocast, Task

if TYPE_CHECKING:
    from multibranch.experiment import ExperimentConfig
    from multibranch.tasks.classification.dataset import ClassificationData, ClassificationSplit


log = logging.getLogger("multibranch.train")


@dataclass
class LabelBatch:
    """src [B, S] long: BOS + ids + EOS, right-padded; labels [B] long; indices [B] into the split."""

    src: Tensor
    labels: Tensor
    indices: np.ndarray

    def __len__(self) -> int:
        return self.src.shape[0]

    def to(self, device: torch.device | str) -> LabelBatch:
        return dataclasses.replace(self, src=self.src.to(device), labels=self.labels.to(device))


def encode_batch(ids: list[np.ndarray] | list[list[int]], pad_id: int, bos_id: int, eos_id: int) -> Tensor:
    """Token id sequences (no BOS/EOS) -> [B, max_len + 2] long: BOS + ids + EOS, right-padded."""
    width = max(len(x) for x in ids) + 2
    src = torch.full((len(ids), width), pad_id, dtype=torch.long)
    for row, seq in enumerate(ids):
        src[row, 0] = bos_id
        src[row, 1 : len(seq) + 1] = torch.as_tensor(np.asarray(seq, dtype=np.int64))
        src[row, len(seq) + 1] = eos_id
    return src


def collate_labels(split: ClassificationSplit, indices: np.ndarray, pad_id: int, bos_id: int,
                   eos_id: int, ids: list[list[int]] | None = None) -> LabelBatch:
    """The batch of examples `indices` of `split`; `ids` replaces their stored token ids (sampled ones)."""
    idx = np.asarray(indices, dtype=np.int64)
    src = encode_batch(ids if ids is not None else [split.ids(int(i)) for i in idx], pad_id, bos_id, eos_id)
    return LabelBatch(src, torch.as_tensor(np.asarray(split.labels[idx], dtype=np.int64)), idx)


class ClassificationTask(Task):
    name = "classification"
    best_metric = "accuracy"
    sample_unit, speed_unit = "sentences", "sent/s"  # examples (texts), whatever their length
    prepare_flag, command = "classify", "multibranch classify"
    _train_lines: list[str] | None = None  # raw training texts, read when subword sampling first needs them

    @classmethod
    def owns_data(cls, meta: dict[str, Any]) -> bool:
        return meta.get("format") == FORMAT

    @staticmethod
    def load_data(data_dir: Path) -> ClassificationData:
        return ClassificationData.load(data_dir)

    def fill_config(self) -> None:
        m, tok = self.cfg.model, self._tokenizer
        m.src_vocab_size = m.tgt_vocab_size = tok.src_vocab_size
        m.pad_id, m.bos_id, m.eos_id = tok.pad_id, tok.bos_id, tok.eos_id
        m.decoder_layers = 0  # no decoder: keeps the parameter count and the config honest
        self.cfg.classifier.num_labels = self.data.num_labels
        self.cfg.classifier.labels = self.data.labels
        self.cfg.classifier.pairs = self.data.pairs
        m.validate()
        self.cfg.classifier.validate()
        if self.cfg.classifier.subword_sampling > 0 and not hasattr(tok, "sample_src"):
            raise ConfigError(f"classifier.subword_sampling samples SentencePiece segmentations, but {self.data_dir} "
                              "was prepared with a Hugging Face tokenizer; set it to 0")
        if self.data.pairs and self.cfg.classifier.subword_sampling > 0:
            raise ConfigError(f"classifier.subword_sampling re-segments single texts; {self.data_dir} holds sentence "
                              "pairs: set it to 0")
        if m.positions == "learned":  # a learned table has no row beyond max_positions
            splits = [s for s in (self.train_split, self.valid_split) if s is not None and len(s)]
            longest = max(int(s.lengths.max()) for s in splits) + 2  # + BOS + EOS
            if longest > m.max_positions:
                raise ConfigError(f"{self.data_dir}: texts of up to {longest - 2} tokens (+ BOS and EOS) do not fit "
                                  f"model.max_positions={m.max_positions} (learned positions); prepare the data "
                                  f"with --max-len {m.max_positions - 2}")

    @classmethod
    def build_model(cls, cfg: ExperimentConfig) -> nn.Module:
        return Classifier(cfg.model, cfg.classifier)

    def check_init_from(self, config: dict[str, Any], path: Path) -> None:
        """The head's rows are the checkpoint's labels: the data's labels in another order would train each
        row on another label (refused); other names (a new task on the same number of labels) get a warning."""

        theirs = list((config.get("classifier") or {}).get("labels") or [])
        ours = list(self.data.labels)
        if not theirs or theirs == ours or len(theirs) != len(ours):  # a count mismatch is a shape mismatch
            return
        if sorted(theirs) == sorted(ours):
            raise CheckpointError(f"--init-from {path}: its classifier has the data's labels in another order "
                                  f"({', '.join(theirs)} vs the data's {', '.join(ours)}); convert it again with "
                                  f"--labels {','.join(ours)}")
        log.warning("--init-from %s: its classifier head was made for the labels %s; the data's %s take its rows "
                    "in that order", path, ", ".join(theirs), ", ".join(ours))

    def describe_model(self) -> str:
        return f"{self.cfg.model.encoder.kind} encoder, {self.cfg.classifier.pooling} pooling, " \
               f"{self.cfg.classifier.num_labels} labels"

    def train_batches(self, epoch: int) -> list[np.ndarray]:
        return self._batches(self.train_split, epoch, shuffle=True)

    def _batches(self, split: ClassificationSplit, epoch: int, shuffle: bool) -> list[np.ndarray]:
        t = self.cfg.train
        lengths = split.lengths + 1  # + BOS; token_batches adds the EOS
        return token_batches(lengths, lengths, t.max_tokens, seed=t.seed, epoch=epoch, shuffle=shuffle,
                             max_sentences=t.max_sentences)

    def collate(self, indices: np.ndarray, device: torch.device, split: ClassificationSplit | None = None) -> LabelBatch:
        """Training examples `indices` (resegmented with classifier.subword_sampling), or those of `split`."""
        m = self.cfg.model
        ids = self._sampled_ids(indices) if split is None and self.cfg.classifier.subword_sampling > 0 else None
        return collate_labels(split or self.train_split, indices, m.pad_id, m.bos_id, m.eos_id, ids).to(device)

    def _sampled_ids(self, indices: np.ndarray) -> list[list[int]]:
        """Sampled segmentations of training texts `indices`, cut as `prepare` cut the stored ones (its
        --max-len) and to the model's positions. The seed comes from torch's generator, which a
        checkpoint saves, so a resumed run samples what the uninterrupted one does."""
        if self._train_lines is None:
            self._train_lines = self.train_split.raw_lines()
        limit = self.cfg.model.max_positions - 2  # + BOS + EOS
        max_len = self.data.meta.get("config", {}).get("max_len")
        if isinstance(max_len, int) and max_len > 0:
            limit = min(limit, max_len)
        seed = int(torch.randint(2**31 - 1, ()))
        lines = [self._train_lines[int(i)] for i in indices]
        sampled = self.tokenizer.sample_src(lines, self.cfg.classifier.subword_sampling, seed)  # type: ignore[union-attr]
        return [ids[:limit] for ids in sampled]

    def sample_size(self, batch: LabelBatch) -> float:
        return float(len(batch))

    def loss(self, forward: nn.Module, model: nn.Module, batch: LabelBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Cross-entropy (label-smoothed by train.label_smoothing) and NLL, summed over the sentences;
        counts: "correct", the sentences whose arg-max label is right (with dropout: the training forward)."""
        logits = forward(batch.src).float()  # [B, C]
        nll = F.cross_entropy(logits, batch.labels, reduction="sum")
        eps = self.cfg.train.label_smoothing
        loss = F.cross_entropy(logits, batch.labels, reduction="sum", label_smoothing=eps) if eps > 0 else nll
        correct = logits.detach().argmax(-1).eq(batch.labels).sum()
        return loss, nll, {"correct": correct}

    def train_fields(self, sums: dict[str, float]) -> dict[str, float]:
        """accuracy: the fraction of the window's training sentences predicted right (dropout on)."""
        return {"accuracy": sums["correct"] / max(sums["size"], 1.0)}

    def describe_train(self, record: dict[str, Any]) -> str:
        return f"accuracy {100 * record['accuracy']:.2f}"

    def validate(self, model: nn.Module, device: torch.device, autocast: Autocast,
                 progress: bool | None) -> dict[str, Any]:
        """Valid loss / NLL per sentence, accuracy and macro-F1 (fractions in [0, 1])."""

        split = self.valid_split
        loss_sum = nll_sum = 0.0
        predictions = np.zeros(len(split), dtype=np.int64)
        for indices in self._batches(split, 0, shuffle=False):
            batch = self.collate(indices, device, split)
            with autocast():
                logits = model(batch.src).float()  # [B, C]
            loss_sum += float(F.cross_entropy(logits, batch.labels, reduction="sum",
                                              label_smoothing=self.cfg.train.label_smoothing))
            nll_sum += float(F.cross_entropy(logits, batch.labels, reduction="sum"))
            predictions[batch.indices] = logits.argmax(-1).cpu().numpy()
        scores = classification_scores(predictions.tolist(), np.asarray(split.labels).tolist(),
                                       labels=list(range(self.data.num_labels)))
        n = len(split)
        return {"loss": loss_sum / n, "nll": nll_sum / n, "accuracy": scores["accuracy"],
                "macro_f1": scores["macro_f1"]}

    def describe_valid(self, result: dict[str, Any]) -> str:
        return f"loss {result['loss']:.3f} | accuracy {100 * result['accuracy']:.2f} | " \
               f"macro-F1 {100 * result['macro_f1']:.2f}"
