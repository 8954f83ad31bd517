"""`prune` (and `analyze heads`) name the real cause: an unknown attention module (with the modules the model
has and the closest name), a head the module does not have, and a checkpoint of one task with the data of
another (not the loader's "not a ... data directory")."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from multibranch.checkpoint.format import save_checkpoint
from multibranch.cli import main
from multibranch.config import from_dict
from multibranch.experiment import ExperimentConfig
from multibranch.tasks import build_task_model
from multibranch.tasks.translation.dataset import PreparedData

MODEL = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1}


def _checkpoint(path: Path, task: str = "translation", vocab: int = 40) -> Path:
    """An untrained checkpoint (weights-only payload) of a tiny model of `task`."""
    model = {**MODEL, "src_vocab_size": vocab, "tgt_vocab_size": vocab}
    if task == "classification":
        model["decoder_layers"] = 0
    cfg = from_dict(ExperimentConfig, {"task": task, "model": model,
                                       **({"classifier": {"num_labels": 3}} if task == "classification" else {})})
    net = build_task_model(cfg)
    save_checkpoint(path, {"config": cfg.to_dict(), "model": {k: v.clone() for k, v in net.state_dict().items()},
                           "meta": {}})
    return path


@pytest.fixture(scope="module")
def labelled_data(tmp_path_factory) -> Path:
    """A prepared classification directory (three labels, a keyword each)."""
    from multibranch.tasks.classification.prepare import ClassifyPrepareConfig, prepare_classification

    root = tmp_path_factory.mktemp("prune_messages_labelled")
    rng = random.Random(0)
    filler = ["the", "a", "one", "was", "green", "small", "house", "river", "quickly", "said"]
    lines = []
    for i in range(120):
        words = rng.choices(filler, k=rng.randint(2, 6))
        words.insert(rng.randint(0, len(words)), ["apple", "storm", "violin"][i % 3])
        lines.append(f"{i % 3}\t{' '.join(words)}\n")
    (root / "train.tsv").write_text("".join(lines), encoding="utf-8")
    prepare_classification(ClassifyPrepareConfig(train=str(root / "train.tsv"), holdout=12, out=str(root / "data"),
                                                 vocab_size=40, seed=2))
    return root / "data"


def _prune(argv: list[str], capsys) -> str:
    assert main(["prune", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def _heads_json(tmp_path: Path, heads: list) -> str:
    path = tmp_path / "heads.json"
    path.write_text(json.dumps(heads))
    return str(path)


def test_an_unknown_module_is_named_with_the_modules_the_model_has(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "model.pt")
    err = _prune(["--ckpt", str(ckpt), "--out", str(tmp_path / "p.pt"),
                  "--heads-json", _heads_json(tmp_path, [["nope.attn", 0]])], capsys)
    assert "no attention module 'nope.attn'" in err and "no head 0" not in err
    assert ("encoder.layers.{0-1}.self_attn, decoder.layers.{0-1}.self_attn, decoder.layers.{0-1}.cross_attn"
            in err)
    assert not (tmp_path / "p.pt").exists()


def test_a_misspelt_module_gets_the_closest_name(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "model.pt")
    err = _prune(["--ckpt", str(ckpt), "--out", str(tmp_path / "p.pt"),
                  "--heads-json", _heads_json(tmp_path, [["decoder.layers.1.cros_attn", 0]])], capsys)
    assert "no attention module 'decoder.layers.1.cros_attn'" in err
    assert "did you mean 'decoder.layers.1.cross_attn'?" in err


def test_a_head_the_module_lacks_says_which_heads_it_has(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "model.pt")
    err = _prune(["--ckpt", str(ckpt), "--out", str(tmp_path / "p.pt"),
                  "--heads-json", _heads_json(tmp_path, [["encoder.layers.0.self_attn", 7]])], capsys)
    assert "no head 7 in attention module 'encoder.layers.0.self_attn' (its heads are 0-3)" in err


def test_listed_heads_are_checked_before_the_data_is_read(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "model.pt")
    err = _prune(["--ckpt", str(ckpt), "--out", str(tmp_path / "p.pt"), "--data", str(tmp_path / "no-such-data"),
                  "--heads-json", _heads_json(tmp_path, [["nope.attn", 0]])], capsys)
    assert "no attention module 'nope.attn'" in err  # not the missing data directory


def test_translation_checkpoint_with_classification_data(tmp_path, labelled_data, capsys):
    ckpt = _checkpoint(tmp_path / "model.pt")
    err = _prune(["--ckpt", str(ckpt), "--out", str(tmp_path / "p.pt"), "--data", str(labelled_data),
                  "--fraction", "0.25"], capsys)
    assert f"{ckpt} is a translation checkpoint but {labelled_data} holds classification data" in err
    assert "not a multibranch data directory" not in err


def test_classification_checkpoint_with_translation_data(tmp_path, tiny_data, capsys):
    vocab = PreparedData.load(tiny_data).meta["vocab_size"]["src"]
    ckpt = _checkpoint(tmp_path / "model.pt", "classification", vocab)
    err = _prune(["--ckpt", str(ckpt), "--out", str(tmp_path / "p.pt"), "--data", str(tiny_data),
                  "--fraction", "0.25"], capsys)
    assert f"{ckpt} is a classification checkpoint but {tiny_data} holds translation data" in err


def test_analyze_heads_names_the_task_mismatch_too(tmp_path, labelled_data, capsys):
    ckpt = _checkpoint(tmp_path / "model.pt")
    assert main(["analyze", "heads", "--ckpt", str(ckpt), "--data", str(labelled_data),
                 "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert f"is a translation checkpoint but {labelled_data} holds classification data" in err
    assert not (tmp_path / "report").exists()


def test_a_missing_data_directory_still_says_so(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "model.pt")
    err = _prune(["--ckpt", str(ckpt), "--out", str(tmp_path / "p.pt"), "--data", str(tmp_path / "none"),
                  "--fraction", "0.25"], capsys)
    assert "not found" in err and "checkpoint but" not in err

