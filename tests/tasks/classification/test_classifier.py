"""Classification on the task-agnostic trainer: the model (pooling, every layer kind), the scores,
training to high accuracy on a synthetic labelled set, exact resume, and `load_model`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from multibranch.config import ConfigError, from_dict
from multibranch.experiment import ExperimentConfig
from multibranch.loading.checkpoint import load_model
from multibranch.models import ModelConfig
from multibranch.models.classifier import Classifier, ClassifierConfig, drop_tokens, pool
from multibranch.schedules import RateConfig, rate_at
from multibranch.tasks import train
from multibranch.tasks.classification.metrics import classification_scores
from multibranch.tasks.classification.task import encode_batch
from multibranch.train.trainer import RunOptions
from tests.helpers.classification import classifier_experiment, synthetic_lines


@pytest.fixture(scope="module")
def labelled_data(tmp_path_factory) -> Path:
    from multibranch.tasks.classification.prepare import ClassifyPrepareConfig, prepare_classification

    root = tmp_path_factory.mktemp("labelled")
    (root / "train.tsv").write_text("".join(synthetic_lines(240, seed=1)), encoding="utf-8")
    prepare_classification(ClassifyPrepareConfig(train=str(root / "train.tsv"), holdout=30, out=str(root / "data"),
                                                 vocab_size=60, seed=2))
    return root / "data"


def _records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


# ------------------------------------------------------------------------------------------ model


def _tiny_model_config(**overrides) -> ModelConfig:
    values = {"d_model": 16, "heads": 4, "ffn_dim": 32, "encoder_layers": 2, "decoder_layers": 0, "dropout": 0.0,
              "src_vocab_size": 30, "tgt_vocab_size": 30}
    values.update(overrides)
    return from_dict(ModelConfig, values)


def test_mean_pooling_ignores_padding_by_hand():
    states = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])  # [1, 3, 2], last position is padding
    mask = torch.tensor([[False, False, True]])
    assert pool(states, mask, "mean").tolist() == [[2.0, 3.0]]
    assert pool(states, mask, "first").tolist() == [[1.0, 2.0]]
    assert pool(torch.tensor([[[1.0, 5.0], [3.0, 4.0], [100.0, 100.0]]]), mask, "max").tolist() == [[3.0, 5.0]]


@pytest.mark.parametrize("pooling", ["first", "mean", "max"])
def test_padding_does_not_change_the_logits(pooling):
    model = Classifier(_tiny_model_config(), ClassifierConfig(pooling=pooling, num_labels=3)).eval()
    short = torch.tensor([[2, 7, 8, 9, 3]])
    padded = torch.tensor([[2, 7, 8, 9, 3, 0, 0, 0]])
    torch.testing.assert_close(model(padded), model(short))


def test_drop_tokens_drops_only_text_tokens_at_the_rate():
    cfg = _tiny_model_config()
    src = torch.randint(4, 30, (200, 50))  # [B, S] text tokens
    src[:, 0], src[:, -5], src[:, -4:] = cfg.bos_id, cfg.eos_id, cfg.pad_id
    torch.manual_seed(0)
    dropped = drop_tokens(src, 0.25, cfg)
    changed = dropped.ne(src)
    assert changed.any() and dropped[changed].eq(cfg.pad_id).all()
    assert not changed[:, 0].any() and not changed[:, -5:].any()  # BOS, EOS and padding stay
    assert changed[:, 1:-5].float().mean().item() == pytest.approx(0.25, abs=0.01)  # 8,800 draws
    assert torch.equal(drop_tokens(src, 0.0, cfg), src)
    with pytest.raises(ConfigError, match="classifier.token_dropout=1.0"):
        ClassifierConfig(num_labels=2, token_dropout=1.0).validate()


@pytest.mark.parametrize("pooling", ["first", "mean", "max"])
def test_a_dropped_token_is_as_if_it_were_not_there(pooling):
    """Without positions, a token turned into padding gives the logits of the text without it; the
    model drops tokens only in training mode."""
    model = Classifier(_tiny_model_config(positions="none"),
                       ClassifierConfig(pooling=pooling, num_labels=3, token_dropout=0.5)).eval()
    src = torch.tensor([[2, 7, 8, 9, 10, 3]])
    torch.testing.assert_close(model(src.masked_fill(src.eq(8), 0)), model(torch.tensor([[2, 7, 9, 10, 3]])))
    assert torch.equal(model(src), model(src))  # eval: nothing dropped, deterministic
    model.train()
    torch.manual_seed(1)
    trained = [model(src) for _ in range(8)]
    assert any(not torch.equal(trained[0], t) for t in trained[1:])


def test_scores_against_a_hand_computation():
    gold = ["a", "a", "a", "b", "b", "c"]
    pred = ["a", "a", "b", "b", "c", "c"]
    scores = classification_scores(pred, gold)
    assert scores["accuracy"] == pytest.approx(4 / 6)
    # a: P 2/2 R 2/3 F1 0.8; b: P 1/2 R 1/2 F1 0.5; c: P 1/2 R 1/1 F1 2/3
    assert scores["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    assert scores["confusion"] == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    # a label of the list that occurs on neither side stays out of the macro average
    assert classification_scores(pred, gold, labels=["a", "b", "c", "d"])["macro_f1"] == scores["macro_f1"]
    with pytest.raises(ValueError):
        classification_scores(["a"], ["a", "b"])


def test_v_schedule_warmup_ratio():
    cfg = RateConfig(schedule="v", rate=0.1, warmup_ratio=0.1)
    assert rate_at(cfg, 5, warmup=999, total=100) == pytest.approx(0.1 * (1 - 5 / 10))  # T_w = 0.1 * T = 10
    assert rate_at(cfg, 10, warmup=999, total=100) == 0.0
    assert rate_at(cfg, 55, warmup=999, total=100) == pytest.approx(0.1 * 45 / 90)


ENCODERS = {
    "transformer": {"kind": "transformer"},
    "mat": {"kind": "transformer", "attention_branches": 2, "drop_branch": {"schedule": "v", "rate": 0.2,
                                                                           "warmup_ratio": 0.1}},
    "weighted": {"kind": "weighted", "freeze_last": 10},
    "mute": {"kind": "mute", "units": 2},
    "muse": {"kind": "muse", "kernel_sizes": [3]},
}


@pytest.mark.parametrize("kind", sorted(ENCODERS))
def test_every_layer_kind_builds_a_classifier_and_trains_a_step(kind, device):
    from multibranch.hooks import ModuleHooks

    cfg = _tiny_model_config(encoder=ENCODERS[kind], dropout=0.1, norm="pre" if kind == "mute" else "post",
                             drophead={"rate": {"schedule": "v", "rate": 0.2, "warmup_ratio": 0.1}})
    model = Classifier(cfg, ClassifierConfig(pooling="mean", num_labels=4)).to(device).train()
    hooks = ModuleHooks(model)
    hooks.update_start(3, None, 50)
    src = torch.tensor([[2, 5, 6, 7, 3], [2, 9, 3, 0, 0]], device=device)
    logits = model(src)  # [2, 4]
    assert logits.shape == (2, 4) and logits.device.type == device.type
    torch.nn.functional.cross_entropy(logits, torch.tensor([1, 3], device=device)).backward()
    layer_grads = [p.grad for n, p in model.named_parameters() if n.startswith("encoder.layers.")]
    assert layer_grads and any(g is not None and g.abs().sum() > 0 for g in layer_grads)


# ------------------------------------------------------------------------------------------ training


def test_tiny_classifier_learns_and_reloads(labelled_data, tmp_path):
    run = tmp_path / "run"
    train(classifier_experiment(pooling="first", max_steps=60, valid_every=20), RunOptions(labelled_data, run))
    valid = _records(run, "valid")
    assert valid[-1]["accuracy"] >= 0.9 and {"loss", "macro_f1"} <= set(valid[-1])

    loaded = load_model(run / "best.pt")
    assert isinstance(loaded.model, Classifier) and loaded.config.task == "classification"
    assert loaded.config.classifier.num_labels == 3 and loaded.model.out.out_features == 3
    best = max(r["accuracy"] for r in valid)
    assert loaded.payload["meta"]["valid"]["accuracy"] == best


@pytest.mark.parametrize(("token_dropout", "subword_sampling"), [(0.0, 0.0), (0.3, 0.0), (0.0, 0.3)])
def test_classification_resume_is_exact(token_dropout, subword_sampling, labelled_data, tmp_path, device):
    def experiment() -> ExperimentConfig:
        return classifier_experiment(pooling="mean", token_dropout=token_dropout,
                                     subword_sampling=subword_sampling, max_steps=16, valid_every=4)

    on = device.type
    train(experiment(), RunOptions(labelled_data, tmp_path / "straight", device=on))
    # paused at 8 of 16 planned updates: the V schedule of DropHead (T_w = 0.1 * 16) plans for 16
    train(experiment(), RunOptions(labelled_data, tmp_path / "legs", stop_at_step=8, device=on))
    train(experiment(), RunOptions(labelled_data, tmp_path / "legs", resume=True, device=on))
    straight = {r["step"]: r["loss"] for r in _records(tmp_path / "straight", "train")}
    legs = {r["step"]: r["loss"] for r in _records(tmp_path / "legs", "train")}
    assert sorted(legs) == list(range(1, 17))
    assert legs == straight


def test_subword_sampling_resegments_training_texts_only(labelled_data):
    """Sampled training batches: other segmentations of the same texts (they decode to them), new ones at
    every draw, reproducible from torch's seed; validation batches and labels are the stored ones."""
    from multibranch.tasks import task_for_data

    task = task_for_data(classifier_experiment(subword_sampling=0.5), labelled_data)
    task.fill_config()
    split, tok = task.train_split, task.tokenizer
    lines = split.raw_lines()
    assert tok.encode_src(lines) == [split.ids(i).tolist() for i in range(len(split))]  # what prepare stored
    indices = np.arange(40)
    stored = task.collate(indices, torch.device("cpu"), split)
    torch.manual_seed(3)
    first, second = task.collate(indices, torch.device("cpu")), task.collate(indices, torch.device("cpu"))
    torch.manual_seed(3)
    again = task.collate(indices, torch.device("cpu"))
    assert torch.equal(first.src, again.src) and not torch.equal(first.src, second.src)
    assert first.src.shape[1] > stored.src.shape[1]  # BPE-dropout: more, shorter pieces
    for batch in (first, second):
        assert torch.equal(batch.labels, stored.labels)
        rows = [[t for t in row if t not in (task.cfg.model.pad_id, task.cfg.model.bos_id, task.cfg.model.eos_id)]
                for row in batch.src.tolist()]
        assert tok.src.decode(rows) == [lines[i] for i in indices]
    valid = task.collate(np.arange(len(task.valid_split)), torch.device("cpu"), task.valid_split)
    assert valid.src.tolist() == encode_batch([task.valid_split.ids(i) for i in range(len(task.valid_split))],
                                              task.cfg.model.pad_id, task.cfg.model.bos_id,
                                              task.cfg.model.eos_id).tolist()
    with pytest.raises(ConfigError, match="classifier.subword_sampling=1.0"):
        ClassifierConfig(num_labels=2, subword_sampling=1.0).validate()


CLASSIFY_PRESETS = ["trec6-tiny", "trec6-tiny-drophead", "trec6-tiny-mat", "sst2-tiny", "sst2-tiny-drophead",
                    "sst2-tiny-mat"]


@pytest.mark.parametrize("name", CLASSIFY_PRESETS)
def test_classification_presets_train_shrunk(name, labelled_data, tmp_path):
    from multibranch.experiment import resolve_config

    shrink = ["model.d_model=32", "model.heads=4", "model.ffn_dim=64", "model.encoder_layers=2", "train.max_steps=4",
              "train.valid_every=2", "train.max_minutes=null", "train.lr.warmup=2", "train.max_tokens=400"]
    cfg = resolve_config(name, None, shrink)
    train(cfg, RunOptions(labelled_data, tmp_path / "run"))
    assert cfg.task == "classification" and cfg.train.best_metric == "accuracy"
    assert [r["step"] for r in _records(tmp_path / "run", "valid")] == [2, 4]
    assert isinstance(load_model(tmp_path / "run" / "best.pt").model, Classifier)


def test_mat_presets_match_the_standard_encoder_parameters():
    from multibranch.experiment import resolve_config

    def encoder_parameters(name: str) -> int:
        cfg = resolve_config(name)
        cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = 1000
        cfg.classifier.num_labels = 6
        return Classifier(cfg.model, cfg.classifier).parameter_counts()["encoder"]

    for data in ("trec6", "sst2"):
        standard = encoder_parameters(f"{data}-tiny")
        assert encoder_parameters(f"{data}-tiny-drophead") == standard
        assert abs(encoder_parameters(f"{data}-tiny-mat") - standard) / standard < 0.001
