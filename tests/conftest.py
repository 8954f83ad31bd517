"""Shared fixtures: tiny configs, deterministic torch, the Multi30k location."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))

MULTI30K_DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def multi30k_dir() -> Path | None:
    """The Multi30k corpus: $MULTIBRANCH_MULTI30K, else ../shared/data/multi30k beside the checkout."""
    path = Path(os.environ.get("MULTIBRANCH_MULTI30K", MULTI30K_DEFAULT))
    return path if (path / "train.en").is_file() else None


@pytest.fixture
def multi30k() -> Path:
    """The Multi30k directory; skips when absent, fails instead under CI (MULTIBRANCH_REQUIRE_MULTI30K=1)."""
    path = multi30k_dir()
    if path is None:
        reason = "Multi30k not found: set MULTIBRANCH_MULTI30K to a directory with train/val/test_2016_flickr.{en,de}"
        if os.environ.get("MULTIBRANCH_REQUIRE_MULTI30K") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture(autouse=True)
def _seed_and_determinism():
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def tiny_model_dict(**overrides) -> dict:
    """A tiny model config as a plain dict (d=32, 4 heads, 2+2 layers, vocab 40)."""
    cfg = {
        "d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2,
        "dropout": 0.1, "src_vocab_size": 40, "tgt_vocab_size": 40,
    }
    cfg.update(overrides)
    return cfg


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A prepared data directory from the built-in synthetic task (400 pairs, joint vocabulary of 200)."""
    from multibranch.data.prepare import PrepareConfig, prepare
    from multibranch.data.synthetic import generate_synthetic_task

    root = tmp_path_factory.mktemp("tiny_data")
    generate_synthetic_task(root / "raw", seed=3, n_train=400, n_valid=24, n_test=24)
    prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(root / "raw" / "train"),
                          valid=str(root / "raw" / "valid"), test=[str(root / "raw" / "test")],
                          out=str(root / "data"), vocab_size=200))
    return root / "data"


def tiny_experiment(**train_overrides):
    """A tiny transformer experiment config for trainer tests (no BLEU during validation)."""
    from multibranch.config import from_dict
    from multibranch.experiment import ExperimentConfig

    train = {"max_tokens": 600, "lr": {"schedule": "inverse_sqrt", "lr": 0.002, "warmup": 5},
             "valid_every": 4, "log_every": 1, "valid_bleu": False, "max_steps": 12, "seed": 7}
    train.update(train_overrides)
    model = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1}
    return from_dict(ExperimentConfig, {"model": model, "train": train})
