"""Shared fixtures: tiny configs, deterministic torch, the Multi30k location."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))

SHARED_DATA_DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data"

# corpus -> (per-corpus environment variable, folder under the shared data root, a file it must have)
CORPORA = {
    "multi30k": ("MULTIBRANCH_MULTI30K", "multi30k", "train.en"),
    "trec6": ("MULTIBRANCH_TREC6", "trec6", "train.label"),
    "sst2": ("MULTIBRANCH_SST2", "sst2", "train.tsv"),
    "code_docstring": ("MULTIBRANCH_CODE_DOCSTRING", "code-docstring", "valid.code"),
}


def corpus_dir(name: str) -> Path | None:
    """A real corpus: its own variable (e.g. $MULTIBRANCH_MULTI30K), else $MULTIBRANCH_SHARED_DATA/FOLDER,
    else ../shared/data/FOLDER beside the checkout; None when absent."""
    variable, folder, probe = CORPORA[name]
    root = Path(os.environ.get("MULTIBRANCH_SHARED_DATA", SHARED_DATA_DEFAULT))
    path = Path(os.environ.get(variable, root / folder))
    return path if (path / probe).is_file() else None


def multi30k_dir() -> Path | None:
    return corpus_dir("multi30k")


def require_corpus(name: str) -> Path:
    """The corpus directory; skips with the reason when absent, fails instead under CI
    (MULTIBRANCH_REQUIRE_DATA=1, or the older MULTIBRANCH_REQUIRE_MULTI30K=1)."""
    path = corpus_dir(name)
    if path is None:
        variable, folder, probe = CORPORA[name]
        reason = (f"{folder} corpus not found (no {probe}): set {variable} to its directory, or "
                  "MULTIBRANCH_SHARED_DATA to the folder holding multi30k/, trec6/, sst2/ and code-docstring/")
        if "1" in (os.environ.get("MULTIBRANCH_REQUIRE_DATA"), os.environ.get("MULTIBRANCH_REQUIRE_MULTI30K")):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture
def multi30k() -> Path:
    return require_corpus("multi30k")


@pytest.fixture
def trec6() -> Path:
    return require_corpus("trec6")


@pytest.fixture
def sst2() -> Path:
    return require_corpus("sst2")


@pytest.fixture
def code_docstring() -> Path:
    return require_corpus("code_docstring")


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
    from multibranch.tasks.translation.prepare import PrepareConfig, prepare
    from multibranch.tasks.translation.synthetic import generate_synthetic_task

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


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`): tiny models
    gain nothing from threads, and lose a lot on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
