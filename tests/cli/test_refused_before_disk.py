"""Bad input met at a train start or while loading a model: one line on stderr, exit code 2, nothing on disk.

A refused `train` start leaves no run directory (and the corrected rerun needs no --force): batches too
small for the longest training or validation example, a learned position table shorter than the data,
corrupted shards. `translate --sampling` refuses a temperature it cannot divide by; an exported model or
CTranslate2 directory with a truncated SentencePiece model is refused by name.

One case of each kind of refusal runs in a real `python -m multibranch` process (`process=True`: exactly one
line on stderr, nothing logged before it); the others run `main()` in this process (tests/helpers/refusals.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from multibranch.cli import main
from multibranch.tasks.translation.dataset import PreparedData
from tests.helpers.refusals import main_here, refusal

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--set", "model.d_model=32", "--set", "model.ffn_dim=64", "--set", "model.heads=4",
        "--set", "model.encoder_layers=1", "--set", "model.decoder_layers=1"]


def train(data: Path, run: Path, *extra: str) -> list:
    return ["train", "--data", data, "--out", run, "--preset", "transformer-tiny", *TINY, "--max-steps", "1",
            "--valid-every", "1", "--no-progress", "--device", "cpu", *extra]


def longest(data: Path, split: str) -> tuple[int, int]:
    part = PreparedData.load(data).split(split)
    return int(part.src_lengths.max()), int(part.tgt_lengths.max())


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- A: a refused train start leaves no run directory -------------------------------------------------------


def test_max_tokens_below_the_longest_training_example_is_refused_before_the_run_directory(tiny_data, tmp_path,
                                                                                            capfd, caplog):
    run = tmp_path / "run"
    size = max(longest(tiny_data, "train")) + 1
    line = refusal(train(tiny_data, run, "--max-tokens", "20"), capfd, caplog, process=True)
    assert "max_tokens" in line and str(size) in line, line
    assert not run.exists()
    assert main_here(train(tiny_data, run, "--max-tokens", str(max(size, 600))), caplog)[0] == 0  # no --force needed


def test_learned_positions_shorter_than_the_data_are_refused_with_both_numbers(tiny_data, tmp_path, capfd, caplog):
    run = tmp_path / "run"
    needed = max(max(longest(tiny_data, name)) for name in ("train", "valid")) + 1
    line = refusal(train(tiny_data, run, "--set", "model.positions=learned", "--set", "model.max_positions=40"),
                   capfd, caplog)
    assert "max_positions" in line and "40" in line and str(needed) in line, line
    assert not run.exists()


@pytest.fixture(scope="module")
def long_valid_data(tmp_path_factory) -> Path:
    """Prepared data whose validation split ends with a line far longer than any training line."""
    from multibranch.data.parallel_prepare import PrepareConfig
    from multibranch.tasks.translation.prepare import prepare
    from multibranch.tasks.translation.synthetic import generate_synthetic_task

    root = tmp_path_factory.mktemp("long_valid")
    generate_synthetic_task(root / "raw", seed=3, n_train=400, n_valid=6, n_test=4)
    for side in ("src", "tgt"):
        lines = (root / "raw" / f"train.{side}").read_text().splitlines()
        with open(root / "raw" / f"valid.{side}", "a") as handle:
            handle.write(" ".join(sorted(lines, key=len)[-3:]) + "\n")
    prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(root / "raw" / "train"),
                          valid=str(root / "raw" / "valid"), test=[str(root / "raw" / "test")],
                          out=str(root / "data"), vocab_size=200))
    return root / "data"


def test_a_validation_example_over_max_tokens_is_refused_at_the_start_with_its_line(long_valid_data, tmp_path,
                                                                                    capfd, caplog):
    run = tmp_path / "run"
    train_size = max(longest(long_valid_data, "train")) + 1
    valid_size = max(longest(long_valid_data, "valid")) + 1
    assert train_size < valid_size
    line = refusal(train(long_valid_data, run, "--max-tokens", str(train_size)), capfd, caplog)
    assert "valid" in line and "line 7" in line and str(valid_size) in line and "--max-len" not in line, line
    assert not run.exists()


def corrupt(tiny_data: Path, tmp_path: Path, how: str) -> Path:
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    if how == "offsets":  # two offsets swapped in place: first 0, last the token count, but not increasing
        offsets = np.load(data / "train.src.offsets.npy", mmap_mode="r+")
        offsets[5], offsets[6] = int(offsets[6]), int(offsets[5])
        offsets.flush()
    elif how == "ids":  # an id beyond the vocabulary
        tokens = np.load(data / "train.tgt.tokens.npy", mmap_mode="r+")
        tokens[3] = 5000
        tokens.flush()
    elif how == "truncated":  # the token file cut short, header and all
        path = data / "train.src.tokens.npy"
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "shortened":  # a shorter array saved over it: the offsets point past its end
        tokens = np.load(data / "train.src.tokens.npy")
        np.save(data / "train.src.tokens.npy", tokens[: len(tokens) // 2])
    return data


@pytest.mark.parametrize("how, words, process", [("offsets", "offsets", False), ("ids", "vocabulary", False),
                                                 ("truncated", "truncated", True),
                                                 ("shortened", "corrupted", False)])
def test_corrupted_shards_are_refused_by_name_before_the_run_directory(tiny_data, tmp_path, capfd, caplog, how,
                                                                       words, process):
    data, run = corrupt(tiny_data, tmp_path, how), tmp_path / "run"
    before = snapshot(data)
    line = refusal(train(data, run), capfd, caplog, process=process)
    assert words in line and str(data) in line and "prepare" in line, line
    assert not run.exists()
    assert snapshot(data) == before


# ---- B: one line instead of a traceback ---------------------------------------------------------------------


@pytest.mark.parametrize("temperature, process", [("inf", False), ("nan", True), ("0", False), ("-1", False)])
def test_sampling_temperature_that_cannot_scale_is_one_line(tiny_checkpoint, tmp_path, capfd, caplog, temperature,
                                                            process):
    source = tmp_path / "in.txt"
    source.write_text("sagun nivnikib rapzubfo\n")
    out = tmp_path / "out.txt"
    line = refusal(["translate", "--ckpt", tiny_checkpoint, "-i", source, "-o", out, "--sampling", "--temperature",
                    temperature, "--device", "cpu"], capfd, caplog, process=process)
    assert "--temperature" in line or "temperature" in line, line
    assert not out.exists()


@pytest.fixture(scope="module")
def exported(tiny_checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "model"
    assert main(["convert", "export", "--ckpt", str(tiny_checkpoint), "--out", str(out)]) == 0
    return out


# some cuts still parse as a (smaller) SentencePiece model
@pytest.mark.parametrize("cut, process", [(100, True), (2000, False), (-50, False)])
def test_export_with_a_truncated_sentencepiece_model_is_refused_by_name(exported, tmp_path, capfd, caplog, cut,
                                                                        process):
    broken, spm, line, unchanged = _translate_with_a_truncated_spm(exported, tmp_path / "model", cut, capfd, caplog,
                                                                   process)
    assert spm.name in line, line
    assert unchanged and not (tmp_path / "out.txt").exists()


def _translate_with_a_truncated_spm(model: Path, copy: Path, cut: int, capfd, caplog,
                                    process: bool) -> tuple[Path, Path, str, bool]:
    """`translate` with a copy of `model` whose SentencePiece model is cut at `cut` bytes: (the copy, its cut model,
    the refusal line, whether the copy is as it was before)."""
    shutil.copytree(model, copy)
    spm = next(p for p in copy.iterdir() if p.suffix == ".model")
    spm.write_bytes(spm.read_bytes()[:cut])
    source = copy.parent / "in.txt"
    source.write_text("sagun nivnikib rapzubfo\n")
    before = snapshot(copy)
    line = refusal(["translate", "--ckpt", copy, "-i", source, "-o", copy.parent / "out.txt", "--device", "cpu"],
                   capfd, caplog, process=process)
    return copy, spm, line, snapshot(copy) == before


@pytest.fixture(scope="module")
def ct2_model(tiny_checkpoint, tmp_path_factory) -> Path:
    """`convert ct2` of the tiny checkpoint (built once; each test truncates a copy)."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'multibranch[ct2]')")
    out = tmp_path_factory.mktemp("ct2") / "ct2"
    assert main(["convert", "ct2", "--ckpt", str(tiny_checkpoint), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("cut, process", [(100, True), (-50, False)])
def test_ct2_directory_with_a_truncated_sentencepiece_model_is_refused_by_name(ct2_model, tmp_path, capfd, caplog,
                                                                               cut, process):
    directory, spm, line, unchanged = _translate_with_a_truncated_spm(ct2_model, tmp_path / "ct2", cut, capfd, caplog,
                                                                      process)
    assert spm.name in line and str(directory) in line, line
    assert unchanged and not (tmp_path / "out.txt").exists()
