"""Training a SentencePiece vocabulary in memory, for every task's `prepare`: the settings every task
refuses, the seeded sample of the training text it is trained on, and the training itself."""

from __future__ import annotations

import io
import random
from typing import Any

import numpy as np
import sentencepiece as spm

from multibranch.config import ConfigError
from multibranch.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from multibranch.errors import DataError


def check_spm_settings(model_type: str, vocab_size: int, character_coverage: float, max_len: int | None) -> None:
    """ConfigError for SentencePiece / length settings that every `prepare` (any task) refuses."""
    if model_type not in ("bpe", "unigram"):
        raise ConfigError(f"model_type={model_type!r} must be 'bpe' or 'unigram'")
    if vocab_size < 8:
        raise ConfigError(f"vocab_size={vocab_size} is too small (4 ids are special)")
    if not 0.0 < character_coverage <= 1.0:
        raise ConfigError(f"character_coverage={character_coverage} must be in (0, 1]")
    if max_len is not None and max_len < 1:
        raise ConfigError(f"max_len={max_len} must be >= 1 (or None to disable)")


class Reservoir:
    """A uniform seeded sample of at most `capacity` strings from a stream (Algorithm R); while the
    stream is no longer than `capacity` it holds every item in order."""

    def __init__(self, capacity: int, seed: int) -> None:
        self.capacity, self.items, self.seen = capacity, [], 0
        self.rng = np.random.default_rng([seed, capacity])

    def add(self, items: list[str]) -> None:
        room = max(self.capacity - len(self.items), 0)
        self.items.extend(items[:room])
        self.seen += min(room, len(items))
        rest = items[room:]
        if not rest:
            return
        # item t (0-based over the stream) replaces slot j ~ U[0, t] when j < capacity
        t = self.seen + np.arange(len(rest))  # [m]
        slots = (self.rng.random(len(rest)) * (t + 1)).astype(np.int64)  # [m]
        for position in np.flatnonzero(slots < self.capacity):
            self.items[slots[position]] = rest[position]
        self.seen += len(rest)


def train_spm(cfg: Any, sentences: list[str]) -> bytes:
    """Train one SentencePiece model in memory on at most `cfg.spm_max_sentences` of `sentences` (a
    sample seeded by `cfg.seed`); returns the serialized model."""
    if len(sentences) > cfg.spm_max_sentences:
        picked = sorted(random.Random(cfg.seed).sample(range(len(sentences)), cfg.spm_max_sentences))
        sentences = [sentences[i] for i in picked]
    spm.set_random_generator_seed(cfg.seed)
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=writer,
            model_type=cfg.model_type,
            vocab_size=cfg.vocab_size,
            character_coverage=cfg.character_coverage,
            hard_vocab_limit=False,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=cfg.threads,
            minloglevel=2,
        )
    except RuntimeError as err:
        raise DataError(
            f"SentencePiece training on {cfg.train}.* failed: {err}; "
            "try another --vocab-size or a lower --character-coverage"
        ) from None
    return writer.getvalue()
