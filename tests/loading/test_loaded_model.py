"""LoadedModel: one checkpoint or an ensemble loaded for use, what it refuses, and that its translator decodes
exactly as a Translator over the same weights built by hand."""

from __future__ import annotations

import pytest
import torch

from multibranch.errors import CheckpointError, UserError
from multibranch.loading.checkpoint import load_model
from multibranch.loading.model import TRANSLATION_TASKS, LoadedModel, UnsupportedError, check_ct2_options
from tests.helpers.translation import corpus_lines


def _save(path, config, model, tokenizer):  # noqa: ANN001, ANN202
    from multibranch.checkpoint.format import save_checkpoint

    save_checkpoint(path, {"config": config.to_dict(), "model": model.state_dict(),
                           "tokenizer": tokenizer.to_state() if tokenizer is not None else None, "meta": {}})
    return path


def test_one_checkpoint_decodes_as_a_translator_built_by_hand(checkpoint, experiment, tokenizer):
    from multibranch.tasks.translation.translator import Translator

    config, model = experiment
    loaded = LoadedModel.load(checkpoint, "cpu", tasks=TRANSLATION_TASKS, decode={"beam": 2})
    assert loaded.kind == "checkpoint" and loaded.task == "translation" and loaded.config is not None
    assert loaded.parameters_count == sum(p.numel() for p in model.parameters())
    lines = corpus_lines(4, seed=3)
    by_hand = Translator(model, tokenizer, config.decode.__class__(**{**config.decode.__dict__, "beam": 2}))
    assert loaded.translator().translate(lines) == by_hand.translate(lines)
    assert loaded.translator(beam=1).cfg.beam == 1 and loaded.decode_config().beam == 2


def test_an_ensemble_of_one_model_twice_translates_as_the_model(checkpoint):
    single = LoadedModel.load(checkpoint, "cpu")
    pair = LoadedModel.load([checkpoint, checkpoint], "cpu")
    assert pair.kind == "ensemble" and pair.parameters_count == 2 * single.parameters_count
    lines = corpus_lines(4, seed=5)
    assert pair.translator().translate(lines) == single.translator().translate(lines)
    with pytest.raises(UnsupportedError, match="maps are drawn from one model"):
        pair.check_supported({"attention": True})


def test_what_cannot_be_loaded_is_refused_with_its_reason(checkpoint, experiment, tokenizer, tmp_path):
    config, model = experiment
    bare = _save(tmp_path / "bare.pt", config, model, None)
    with pytest.raises(CheckpointError, match="has no tokenizer, which it needs to translate raw text"):
        LoadedModel.load(bare, "cpu")
    with pytest.raises(CheckpointError, match="not a classification model"):
        LoadedModel.load(checkpoint, "cpu", tasks=("classification",))
    with pytest.raises(CheckpointError, match=r"bare\.pt has no tokenizer"):  # the member that lacks it
        LoadedModel.load([checkpoint, bare], "cpu")
    with pytest.raises(UserError, match="beem"):
        LoadedModel.load(checkpoint, "cpu", decode={"beem": 2})
    ct2 = tmp_path / "ct2"
    ct2.mkdir()
    (ct2 / "multibranch_ct2.json").write_text("{}")
    with pytest.raises(UserError, match="CTranslate2 directory, which cannot be an ensemble member"):
        LoadedModel.load([checkpoint, ct2], "cpu")


def test_ct2_refusals_name_the_option_as_the_caller_spells_it():
    with pytest.raises(UnsupportedError, match=r"^--sampling: not with a CTranslate2 directory \(d\): sampling"):
        check_ct2_options("d", {"sampling": True})
    with pytest.raises(UnsupportedError, match=r"^prefixes: not with a CTranslate2 directory"):
        check_ct2_options("d", {"prefix": "x"}, lambda name, value: "prefixes")
    check_ct2_options("d", {"sampling": False, "prefix": None, "precision": "fp32"})  # nothing refused


def test_a_classifier_is_labelled_with_the_mean_of_its_members(tokenizer, tmp_path):
    from multibranch.config import from_dict
    from multibranch.experiment import ExperimentConfig
    from multibranch.models.classifier import Classifier
    from tests.helpers.classification import TEXTS

    config = from_dict(ExperimentConfig, {
        "task": "classification",
        "model": {"d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 0,
                  "src_vocab_size": tokenizer.src_vocab_size, "tgt_vocab_size": tokenizer.src_vocab_size},
        "classifier": {"num_labels": 3, "labels": ["colour", "number", "place"]}})
    paths = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        paths.append(_save(tmp_path / f"c{seed}.pt", config, Classifier(config.model, config.classifier).eval(),
                           tokenizer))
    members = [LoadedModel.load(path, "cpu") for path in paths]
    both = LoadedModel.load(paths, "cpu")
    assert both.labels == ["colour", "number", "place"] and not both.pairs
    probs = both.classify(TEXTS[:3])  # [3, 3]
    mean = (members[0].classify(TEXTS[:3]) + members[1].classify(TEXTS[:3])) / 2
    assert torch.allclose(probs, mean) and torch.allclose(probs.sum(-1), torch.ones(3))
    with pytest.raises(UserError, match="is a classifier: decode settings \\(beam\\)"):
        LoadedModel.load(paths[0], "cpu", decode={"beam": 2})


def test_loading_leaves_the_caller_s_random_state_alone(checkpoint):
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    LoadedModel.load([str(checkpoint)], "cpu")
    load_model(checkpoint)
    assert torch.equal(torch.rand(3), expected)
