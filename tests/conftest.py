"""Fixtures shared across test folders: deterministic torch, the real corpora's location, a tiny prepared data
directory, a tiny trained checkpoint, and the tiny random translation model with its SentencePiece model.

Plain helpers (builders also used outside fixtures) live in tests/helpers/; test modules never import this file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from tests.helpers.configs import tiny_experiment
from tests.helpers.kernels import require_kernels
from tests.helpers.translation import MAX_POSITIONS, corpus_lines

if TYPE_CHECKING:
    from multibranch.data.tokenizer import Tokenizer
    from multibranch.experiment import ExperimentConfig

torch.set_num_threads(min(2, torch.get_num_threads()))
# Every test runs with deterministic algorithms (`_seed_and_determinism`); on CUDA, cuBLAS is deterministic only
# with a fixed workspace, which it reads from this variable when it makes its first handle (and which PyTorch
# builds for older CUDA versions demand under deterministic algorithms): set before any CUDA work, and inherited
# by the CLI runs the tests start. Nothing reads it on a machine without CUDA.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

SHARED_DATA_DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data"

# corpus -> (per-corpus environment variable, folder under the shared data root, a file it must have)
CORPORA = {
    "multi30k": ("MULTIBRANCH_MULTI30K", "multi30k", "train.en"),
    "trec6": ("MULTIBRANCH_TREC6", "trec6", "train.label"),
    "sst2": ("MULTIBRANCH_SST2", "sst2", "train.tsv"),
    "code_docstring": ("MULTIBRANCH_CODE_DOCSTRING", "code-docstring", "valid.code"),
    "rte": ("MULTIBRANCH_RTE", "rte", "train.tsv"),
    "mrpc": ("MULTIBRANCH_MRPC", "mrpc", "train.tsv"),
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
                  "MULTIBRANCH_SHARED_DATA to the folder holding multi30k/, trec6/, sst2/, code-docstring/, rte/ "
                  "and mrpc/")
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


@pytest.fixture
def rte() -> Path:
    return require_corpus("rte")


@pytest.fixture
def mrpc() -> Path:
    return require_corpus("mrpc")


@pytest.fixture(autouse=True)
def _seed_and_determinism():
    """Every test starts seeded and deterministic, and leaves torch's thread count as it found it (an
    in-process `train --threads 1` would otherwise slow every later test)."""
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A prepared data directory from the built-in synthetic task (400 pairs, joint vocabulary of 200)."""
    from multibranch.data.parallel_prepare import PrepareConfig
    from multibranch.tasks.translation.prepare import prepare
    from multibranch.tasks.translation.synthetic import generate_synthetic_task

    root = tmp_path_factory.mktemp("tiny_data")
    generate_synthetic_task(root / "raw", seed=3, n_train=400, n_valid=24, n_test=24)
    prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(root / "raw" / "train"),
                          valid=str(root / "raw" / "valid"), test=[str(root / "raw" / "test")],
                          out=str(root / "data"), vocab_size=200))
    return root / "data"


# Every device this machine has: the CPU always, CUDA where present. Tests that exercise a device take the
# `device` fixture and so run once per device (in CI, the CPU only; on a GPU machine, both).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`): tiny models
    gain nothing from threads, and lose a lot on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_data, tmp_path_factory) -> Path:
    """last.pt of a 12-update deterministic run of `tiny_experiment` on `tiny_data`."""
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions

    run = tmp_path_factory.mktemp("tiny_checkpoint") / "run"
    train(tiny_experiment(max_steps=12, deterministic=True), RunOptions(tiny_data, run, device="cpu", progress=False))
    return run / "last.pt"


@pytest.fixture(scope="module")
def weighted_checkpoint(tiny_data, tmp_path_factory) -> Path:
    """last.pt of a small Weighted Transformer trained for 20 updates on `tiny_data` (kappa/alpha trained too)."""
    from multibranch.config import from_dict
    from multibranch.experiment import ExperimentConfig
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions

    weighted = {"kind": "weighted", "kappa_alpha_lr": {"schedule": "inverse_sqrt", "lr": 0.05, "warmup": 2},
                "freeze_last": 0}
    model = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1,
             "encoder": weighted, "decoder": weighted}
    train_cfg = {"max_tokens": 600, "lr": {"schedule": "inverse_sqrt", "lr": 0.002, "warmup": 5}, "valid_every": 20,
                 "log_every": 5, "valid_bleu": False, "max_steps": 20, "seed": 5, "deterministic": True}

    run = tmp_path_factory.mktemp("weighted") / "run"
    train(from_dict(ExperimentConfig, {"model": model, "train": train_cfg}),
          RunOptions(tiny_data, run, device="cpu", progress=False))
    return run / "last.pt"


# ---- the tiny random translation model (translator and serve tests) -----------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """A SentencePiece model (48 pieces) trained on generated text (`corpus_lines`)."""
    import io

    import sentencepiece as spm

    from multibranch.data.tokenizer import Tokenizer

    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines(300, seed=0)), model_writer=buffer, vocab_size=48, model_type="unigram",
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, character_coverage=1.0, hard_vocab_limit=False,
        minloglevel=2,
    )
    proto = buffer.getvalue()
    return Tokenizer(proto, proto)


@pytest.fixture(scope="module")
def experiment(tokenizer) -> tuple[ExperimentConfig, torch.nn.Module]:
    """A random tiny transformer (learned positions, MAX_POSITIONS of them) and its config with beam 3."""
    from multibranch.config import from_dict
    from multibranch.data.tokenizer import EOS_ID
    from multibranch.experiment import ExperimentConfig
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.models import ModelConfig, build_model

    torch.manual_seed(7)
    vocab = tokenizer.src_vocab_size
    model_cfg = from_dict(ModelConfig, {
        "d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "positions": "learned",
        "max_positions": MAX_POSITIONS, "src_vocab_size": vocab, "tgt_vocab_size": vocab, "output_bias": True,
    })
    model = build_model(model_cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        model.output_bias[EOS_ID] = 1.0
    decode = DecodeConfig(beam=3, length_penalty=1.0, max_len_a=1.0, max_len_b=4, batch_tokens=64)
    return ExperimentConfig(model=model_cfg, decode=decode), model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer, experiment) -> Path:
    """The `experiment` model saved as a checkpoint with its tokenizer."""
    from multibranch.checkpoint.format import save_checkpoint

    config, model = experiment
    path = tmp_path_factory.mktemp("ckpt") / "tiny.pt"
    save_checkpoint(path, {"config": config.to_dict(), "model": model.state_dict(), "tokenizer": tokenizer.to_state(),
                           "meta": {}})
    return path


@pytest.fixture
def cpu_kernels_built() -> None:
    """Skip where multibranch's CPU kernels cannot be built; fail instead under MULTIBRANCH_REQUIRE_CPU_KERNELS=1."""
    require_kernels()

