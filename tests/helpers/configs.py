"""Tiny model and experiment configs for unit tests."""

from __future__ import annotations


def tiny_model_dict(**overrides) -> dict:
    """A tiny model config as a plain dict (d=32, 4 heads, 2+2 layers, vocab 40)."""
    cfg = {
        "d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2,
        "dropout": 0.1, "src_vocab_size": 40, "tgt_vocab_size": 40,
    }
    cfg.update(overrides)
    return cfg


def tiny_experiment(**train_overrides):
    """A tiny transformer experiment config for trainer tests (no BLEU during validation)."""
    from multibranch.config import from_dict
    from multibranch.experiment import ExperimentConfig

    train = {"max_tokens": 600, "lr": {"schedule": "inverse_sqrt", "lr": 0.002, "warmup": 5},
             "valid_every": 4, "log_every": 1, "valid_bleu": False, "max_steps": 12, "seed": 7}
    train.update(train_overrides)
    model = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1}
    return from_dict(ExperimentConfig, {"model": model, "train": train})
