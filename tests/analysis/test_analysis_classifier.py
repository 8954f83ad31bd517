"""Head analyses of a classifier: importance from the classification loss, accuracy pruning curve and
dominant heads (`analyze heads`), and `prune` of a classifier checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from multibranch.analysis.batches import teacher_forced_batches
from multibranch.analysis.heads import attention_sites, gates_installed, mask_gates
from multibranch.cli import main
from multibranch.pruning.importance import head_importance
from multibranch.tasks.classification.dataset import ClassificationSplit
from tests.helpers.classification import classifier_experiment, synthetic_lines


def _classifier() -> torch.nn.Module:
    from multibranch.tasks import build_task_model

    cfg = classifier_experiment()
    cfg.task = "classification"
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = 40
    cfg.model.decoder_layers = 0
    cfg.model.activation = "gelu"  # smooth in the gates for finite differences
    cfg.classifier.num_labels = 3
    model = build_task_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _split(n: int = 10) -> ClassificationSplit:
    gen = torch.Generator().manual_seed(1)
    ids = [torch.randint(4, 40, (int(k),), generator=gen).tolist() for k in torch.randint(2, 9, (n,), generator=gen)]
    return ClassificationSplit.from_sequences(ids, torch.randint(0, 3, (n,), generator=gen).tolist())


def test_classifier_importance_equals_finite_differences_of_the_classification_loss():
    model = _classifier().double()
    batches = teacher_forced_batches(_split(), model.config, max_tokens=10_000)
    assert len(batches) == 1
    batch = batches[0]
    sites = attention_sites(model)
    assert [s.role for s in sites] == ["encoder_self", "encoder_self"]
    scores = head_importance(model, batches, sites, normalize=False)
    eps = 1e-4
    for site in sites:
        for head in range(site.heads):
            losses = []
            for sign in (1.0, -1.0):
                gate = torch.ones(site.heads, dtype=torch.float64)
                gate[head] += sign * eps
                with gates_installed(sites, {site.name: gate}), torch.no_grad():
                    losses.append(float(F.cross_entropy(model(batch.src), batch.labels, reduction="sum")))
            expected = abs(losses[0] - losses[1]) / (2 * eps) / len(batch)  # per sentence
            assert float(scores[site.name][head]) == pytest.approx(expected, rel=1e-4, abs=1e-8)


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory) -> Path:
    import yaml

    root = tmp_path_factory.mktemp("classifier_heads")
    (root / "train.tsv").write_text("".join(synthetic_lines(240, seed=3)), encoding="utf-8")
    assert main(["prepare", "--task", "classify", "--train", str(root / "train.tsv"), "--holdout", "0.1",
                 "--out", str(root / "data"), "--vocab-size", "60", "--seed", "2"]) == 0
    (root / "exp.yaml").write_text(yaml.safe_dump(classifier_experiment(max_steps=40, valid_every=20).to_dict()))
    assert main(["train", "--data", str(root / "data"), "--out", str(root / "run"), "--config", str(root / "exp.yaml"),
                 "--no-progress", "--threads", "1"]) == 0
    return root


def _accuracy(ckpt: Path, data_dir: Path, split: str = "valid", masked=()) -> float:
    """Accuracy (%) through the `classify` path: raw text -> tokenizer -> probabilities."""
    from multibranch.loading.checkpoint import load_model
    from multibranch.tasks.classification.dataset import ClassificationData
    from multibranch.tasks.classification.inference import classify_lines

    loaded = load_model(ckpt)
    data = ClassificationData.load(data_dir)
    chosen = data.split(split)
    sites = attention_sites(loaded.model)
    with gates_installed(sites, mask_gates(sites, masked)):
        predicted = classify_lines(loaded.model, loaded.tokenizer, chosen.raw_lines()).argmax(-1)
    return 100.0 * float((predicted == torch.tensor(chosen.labels.tolist())).double().mean())


def test_analyze_heads_of_a_classifier_uses_accuracy(classifier_run, tmp_path):
    out = tmp_path / "report"
    ckpt, data = classifier_run / "run" / "best.pt", classifier_run / "data"
    assert main(["analyze", "heads", "--ckpt", str(ckpt), "--data", str(data), "--out", str(out), "--step", "0.25"]) == 0
    report = json.loads((out / "heads.json").read_text())
    assert report["task"] == "classification" and report["metric"] == "accuracy" and report["bleu"] is None
    assert report["target_tokens"] is None and report["score"]["sentences"] == report["examples"] == 24
    assert {m["role"] for m in report["modules"]} == {"encoder_self"} and len(report["modules"]) == 2
    for module in report["modules"]:
        assert sum(v * v for v in module["importance"]) == pytest.approx(1.0, abs=1e-5)
    points = report["pruning_curve"]["points"]
    assert [p["masked_heads"] for p in points] == [0, 2, 4, 6, 8]
    assert points[0]["score"] == pytest.approx(_accuracy(ckpt, data))  # 0% = the unpruned accuracy
    assert points[2]["score"] == pytest.approx(_accuracy(ckpt, data, masked=[tuple(h) for h in points[2]["masked"]]))
    table = report["dominant_heads"]
    assert table["baseline"] == points[0]["score"] and set(table["mean_dominant_delta"]) == {"encoder_self"}
    first = table["modules"][0]
    head = first["dominant_head"]
    assert first["dominant_delta"] == pytest.approx(_accuracy(ckpt, data, masked=[(first["name"], head)])
                                                    - table["baseline"])
    index = (out / "index.md").read_text()
    assert "accuracy (%)" in index and "BLEU" not in index
    assert (out / "pruning_curve.png").stat().st_size > 1000


def test_prune_a_classifier_by_accuracy_threshold(classifier_run, tmp_path):
    from multibranch.loading.checkpoint import load_model

    ckpt, data = classifier_run / "run" / "best.pt", classifier_run / "data"
    out = tmp_path / "pruned.pt"
    assert main(["prune", "--ckpt", str(ckpt), "--out", str(out), "--data", str(data), "--max-drop", "100",
                 "--step", "0.25", "--speed-rounds", "1"]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["metric"] == "accuracy" and report["set"]["decode"] is None
    removed = [tuple(h) for h in report["removed"]]
    assert report["before"]["score"] == pytest.approx(_accuracy(ckpt, data))
    assert report["after"]["score"] == pytest.approx(_accuracy(out, data)) == report["masked_score"]
    assert len(removed) == 8 - 2  # a 100-point budget: every module keeps exactly one head
    # the pruned classifier computes what the masked one does
    model, pruned = load_model(ckpt).model, load_model(out).model
    src = torch.tensor([[1, 5, 9, 12, 2], [1, 7, 2, 0, 0]])
    sites = attention_sites(model)
    with torch.no_grad(), gates_installed(sites, mask_gates(sites, removed)):
        torch.testing.assert_close(pruned(src), model(src), rtol=1e-5, atol=1e-5)
    assert sum(s.heads for s in attention_sites(pruned)) == 8 - len(removed)
