"""Messages that name the real cause: each wrong input ends in one line, exit 2, that
says what is wrong rather than what it led to; a translation preset on classification data warns."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from multibranch.checkpoint.format import load_checkpoint, save_checkpoint
from multibranch.cli import main
from multibranch.pruning.removal import prune_heads
from tests.helpers.cli import TINY_MODEL, one_error_line

pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.fixture(scope="module")
def checkpoint(tiny_data, tmp_path_factory) -> Path:
    """best.pt of a one-update tiny translation run."""
    run = tmp_path_factory.mktemp("run") / "run"
    assert main(["train", "--data", str(tiny_data), "--out", str(run), "--preset", "transformer-tiny", *TINY_MODEL,
                 "--max-steps", "1", "--valid-every", "1", "--no-progress", "--set", "train.valid_bleu=false"]) == 0
    return run / "best.pt"


def test_convert_ct2_names_code_generation_as_the_reason(checkpoint, tmp_path, capsys):
    payload = load_checkpoint(checkpoint)
    payload["config"]["task"] = "code"  # what `train` records on data from `prepare --task code`
    code_ckpt = tmp_path / "code.pt"
    save_checkpoint(code_ckpt, payload)
    capsys.readouterr()
    assert main(["convert", "ct2", "--ckpt", str(code_ckpt), "--out", str(tmp_path / "ct2")]) == 2
    err = one_error_line(capsys)
    assert "is a code-generation model" in err and "multibranch translate" in err
    assert "pooling head" not in err and "classif" not in err  # the classifier's reason
    assert not (tmp_path / "ct2").exists()


def test_serve_torch_engine_on_a_ct2_directory_says_so(checkpoint, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    ct2_dir = tmp_path / "ct2"
    assert main(["convert", "ct2", "--ckpt", str(checkpoint), "--out", str(ct2_dir)]) == 0
    capsys.readouterr()
    assert main(["serve", "--ckpt", str(ct2_dir), "--engine", "torch", "--port", "0", "--device", "cpu"]) == 2
    err = one_error_line(capsys)
    assert f"{ct2_dir} is a CTranslate2 model directory" in err and "--engine ct2" in err
    assert "no such checkpoint file" not in err


def test_prepare_names_a_directory_given_as_train(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("train.de", "train.en", "valid.de", "valid.en"):
        (raw / name).write_text("a b\n", encoding="utf-8")
    cases = [
        (["--src", "de", "--tgt", "en", "--valid", str(raw / "valid")],
         f"--train {raw}: is a directory; --train takes the files' PREFIX (PREFIX.de and PREFIX.en), e.g. "
         f"{raw / 'train'} or {raw / 'valid'}"),
        (["--task", "code", "--valid", str(raw / "valid")], f"--train {raw}: is a directory"),
        (["--task", "classify", "--holdout", "0.1"], f"--train {raw}: is a directory; --train takes a labelled"),
    ]
    for extra, message in cases:
        out = tmp_path / "data"
        assert main(["prepare", "--train", str(raw), *extra, "--out", str(out)]) == 2
        err = one_error_line(capsys)
        assert message in err and "not found" not in err
        assert not out.exists()


def test_init_from_a_pruned_checkpoint_names_the_pruning(checkpoint, tiny_data, tmp_path, capsys):
    pruned = tmp_path / "pruned.pt"
    save_checkpoint(pruned, prune_heads(load_checkpoint(checkpoint), [("encoder.layers.0.self_attn", 1)]))
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["train", "--data", str(tiny_data), "--out", str(run), "--preset", "transformer-tiny", *TINY_MODEL,
                 "--max-steps", "1", "--init-from", str(pruned), "--no-progress"]) == 2
    err = one_error_line(capsys)
    assert "a pruned checkpoint (encoder.layer_heads [[3]]; decoder.layer_heads [[4, 4]])" in err
    assert "without --preset and --config" in err
    assert "{" not in err and len(err) < 400  # no config dicts
    assert not run.exists()


@pytest.fixture(scope="module")
def classify_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("classify")
    lines = [f"{'pos' if i % 2 else 'neg'}\t{'good nice' if i % 2 else 'bad awful'} thing {i}\n" for i in range(120)]
    (root / "train.tsv").write_text("".join(lines), encoding="utf-8")
    assert main(["prepare", "--task", "classify", "--train", str(root / "train.tsv"), "--holdout", "20",
                 "--out", str(root / "data"), "--vocab-size", "60"]) == 0
    return root / "data"


def test_translation_preset_on_classification_data_warns(classify_data, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="multibranch")
    run = tmp_path / "run"
    assert main(["train", "--data", str(classify_data), "--out", str(run), "--preset", "transformer-tiny",
                 *TINY_MODEL, "--max-steps", "1", "--no-progress"]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("holds classification data but the config is not a classification one" in w for w in warnings)
    assert "task: classification" in (run / "config.yaml").read_text()


def test_a_translation_run_resumed_on_classification_data_is_one_refusal_without_a_warning(
        tiny_checkpoint, classify_data, tmp_path, capsys, caplog):
    run = tmp_path / "run"
    shutil.copytree(tiny_checkpoint.parent, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    caplog.set_level(logging.INFO, logger="multibranch")
    assert main(["train", "--data", str(classify_data), "--out", str(run), "--resume", "--preset",
                 "transformer-tiny", *TINY_MODEL, "--no-progress"]) == 2
    err = one_error_line(capsys)
    assert f"cannot resume {run}: it trains a translation model and {classify_data} holds classification data" in err
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_classification_preset_on_classification_data_does_not_warn(classify_data, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="multibranch")
    run = tmp_path / "run"
    assert main(["train", "--data", str(classify_data), "--out", str(run), "--preset", "trec6-tiny",
                 "--set", "model.d_model=32", "--set", "model.ffn_dim=64", "--set", "model.encoder_layers=1",
                 "--max-steps", "1", "--no-progress"]) == 0
    assert not [r for r in caplog.records if "not a classification one" in r.getMessage()]


@pytest.mark.parametrize("preset", ["trec6-tiny", "transformer-tiny"])
def test_missing_data_is_named_as_missing_whatever_the_preset(preset, tmp_path, capsys):
    """No data.json tells nothing of the data's task: every preset says the directory does not exist (a
    classification preset used to call it translation data)."""
    missing = tmp_path / "nowhere"
    assert main(["train", "--data", str(missing), "--out", str(tmp_path / "run"), "--preset", preset]) == 2
    err = one_error_line(capsys)
    assert f"{missing / 'data.json'}: not found (the directory does not exist)" in err and "holds" not in err
    assert not (tmp_path / "run").exists()


def test_a_classification_preset_on_translation_data_names_the_data(tiny_data, tmp_path, capsys):
    assert main(["train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), "--preset", "trec6-tiny"]) == 2
    assert f"the config is for classification but {tiny_data} holds translation data" in one_error_line(capsys)


def test_prepare_spm_sample_names_the_option_and_its_range(tmp_path, capsys):
    from multibranch.tasks.translation.synthetic import generate_synthetic_task

    generate_synthetic_task(tmp_path / "raw", seed=3, n_train=40, n_valid=4, n_test=4)
    raw = tmp_path / "raw"
    for option in ("--spm-sample", "--shard-pairs"):
        out = tmp_path / "data"
        assert main(["prepare", "--src", "src", "--tgt", "tgt", "--train", str(raw / "train"), "--valid",
                     str(raw / "valid"), "--out", str(out), option, "0"]) == 2
        err = one_error_line(capsys)
        assert f"{option} 0: must be >= 1" in err
        assert "spm_max_sentences" not in err and "ratio_allowance" not in err and "shard_pairs" not in err
        assert not out.exists()


def test_a_validation_example_over_the_learned_positions_names_the_split_and_the_remedy(tmp_path, capsys):
    from multibranch.tasks.translation.synthetic import generate_synthetic_task

    raw = tmp_path / "raw"
    generate_synthetic_task(raw, seed=3, n_train=60, n_valid=4, n_test=4)
    long_line = " ".join(["zork"] * 80)  # far beyond the training sentences, which --max-len would filter
    for side in ("src", "tgt"):
        with (raw / f"valid.{side}").open("a", encoding="utf-8") as f:
            f.write(long_line + "\n")
    data = tmp_path / "data"
    assert main(["prepare", "--src", "src", "--tgt", "tgt", "--train", str(raw / "train"), "--valid",
                 str(raw / "valid"), "--out", str(data), "--vocab-size", "100", "--max-len", "40"]) == 0
    capsys.readouterr()
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(run), "--preset", "transformer-tiny", *TINY_MODEL,
                 "--set", "model.positions=learned", "--set", "model.max_positions=48", "--max-steps", "1",
                 "--no-progress"]) == 2
    err = one_error_line(capsys)
    assert "validation example" in err and "valid.src.txt" in err
    assert "set model.max_positions to at least" in err and "shorten or remove that line of the --valid files" in err
    assert "prepare the data with --max-len" not in err
    assert not run.exists()


def test_translate_ct2_refusals_name_the_option_as_typed(checkpoint, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    ct2_dir = tmp_path / "ct2"
    assert main(["convert", "ct2", "--ckpt", str(checkpoint), "--out", str(ct2_dir)]) == 0
    source = tmp_path / "in.txt"
    source.write_text("a b\n", encoding="utf-8")
    cases = [(["--sampling"], "--sampling: not with a CTranslate2 directory"),
             (["--print-alignment"], "--print-alignment: not with a CTranslate2 directory"),
             (["--lenpen-kind", "gnmt"], "--lenpen-kind gnmt: not with a CTranslate2 directory")]
    for extra, message in cases:
        capsys.readouterr()
        assert main(["translate", "--ckpt", str(ct2_dir), "-i", str(source), "--device", "cpu", *extra]) == 2
        err = one_error_line(capsys)
        assert message in err and "True" not in err
