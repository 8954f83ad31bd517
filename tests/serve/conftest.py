"""Fixtures of the server tests: a SentencePiece tokenizer trained on generated text, and real
engines on tiny random models (a translation model with attention maps, a classifier)."""

from __future__ import annotations

import io
import random

import pytest
import sentencepiece as spm
import torch


def corpus(n: int, seed: int) -> list[str]:
    """`n` lines of made-up words (what the tokenizer is trained on)."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(40)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(n)]


@pytest.fixture(scope="session")
def serve_tokenizer():  # noqa: ANN201
    from multibranch.data.tokenizer import Tokenizer

    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus(300, seed=0)), model_writer=buffer, vocab_size=48, model_type="unigram",
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
    )
    return Tokenizer(buffer.getvalue(), buffer.getvalue())


@pytest.fixture(scope="session")
def translation_engine(serve_tokenizer):  # noqa: ANN001, ANN201
    """TorchEngine over a random 1+1-layer model (learned positions, beam 2)."""
    from multibranch.config import from_dict
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.models import ModelConfig, build_model
    from multibranch.serve.engine import TorchEngine

    torch.manual_seed(7)
    vocab = serve_tokenizer.src_vocab_size
    cfg = from_dict(ModelConfig, {"d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 1,
                                  "positions": "learned", "max_positions": 24, "src_vocab_size": vocab,
                                  "tgt_vocab_size": vocab})
    model = build_model(cfg).eval()
    return TorchEngine(model, serve_tokenizer, DecodeConfig(beam=2, max_len_a=1.0, max_len_b=4), kind="transformer")


@pytest.fixture(scope="session")
def classifier_engine(serve_tokenizer):  # noqa: ANN001, ANN201
    """ClassifierEngine over a random 1-layer classifier with three labels."""
    from multibranch.config import from_dict
    from multibranch.experiment import ExperimentConfig
    from multibranch.loading.checkpoint import LoadedCheckpoint
    from multibranch.loading.model import LoadedModel
    from multibranch.models.classifier import Classifier
    from multibranch.serve.engine import ClassifierEngine

    torch.manual_seed(7)
    vocab = serve_tokenizer.src_vocab_size
    config = from_dict(ExperimentConfig, {
        "task": "classification",
        "model": {"d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 0,
                  "src_vocab_size": vocab, "tgt_vocab_size": vocab},
        "classifier": {"num_labels": 3, "labels": ["colour", "number", "place"]}})
    model = Classifier(config.model, config.classifier).eval()
    loaded = LoadedModel.from_checkpoints(["<random classifier>"], [LoadedCheckpoint(model, serve_tokenizer, config, {})],
                                          torch.device("cpu"))
    return ClassifierEngine(loaded)
