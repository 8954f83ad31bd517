"""bench/classify_quality.py --tiny on a GLUE-RTE-shaped file (synthetic pairs, a tiny random BERT as the
"pretrained" model): the pair split is disjoint and stratified, every system runs and is scored. TF-IDF + LR
and the Hugging Face Trainer peer join when their extras (scikit-learn; accelerate) are installed."""

from __future__ import annotations

import importlib.util
import json
import random
import sys

import pytest

pytest.importorskip("transformers")
import bench.classify_quality as cq  # noqa: E402
from tests.helpers.hf_bert import WORDS, bert_dir  # noqa: E402

# the presets are MiniLM-shaped; the tiny random BERT's shape, for `train --init-from` of its import
TINY_BERT = [x for o in ("model.d_model=16", "model.heads=2", "model.ffn_dim=24", "model.encoder_layers=2",
                         "model.max_positions=48") for x in ("--set", o)]


def _rte_like(path, n: int = 140) -> None:
    """RTE's layout (index, sentence1, sentence2, label); `entailment` when sentence2 is a prefix of sentence1."""
    rng = random.Random(0)
    rows = ["index\tsentence1\tsentence2\tlabel"]
    for i in range(n):
        a = [rng.choice(WORDS) for _ in range(rng.randint(4, 7))]
        entailed = i % 2 == 0
        b = a[: rng.randint(2, 3)] if entailed else [rng.choice(WORDS) for _ in range(3)]
        rows.append(f"{i}\t{' '.join(a)} {i}\t{' '.join(b)}\t{'entailment' if entailed else 'not_entailment'}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


@pytest.mark.slow
def test_tiny_pair_benchmark_runs_every_system(tmp_path, monkeypatch, capsys):
    (tmp_path / "shared" / "rte").mkdir(parents=True)
    _rte_like(tmp_path / "shared" / "rte" / "train.tsv")
    bert_dir(tmp_path / "bert", num_labels=2)
    monkeypatch.setattr(cq, "SHARED", tmp_path / "shared")
    monkeypatch.setattr(cq, "RESULTS", tmp_path / "results")
    monkeypatch.setenv("MULTIBRANCH_BENCH_DIR", str(tmp_path / "work"))
    systems = ["rte-minilm", "rte-minilm-drophead", "rte-minilm-mat"]
    if importlib.util.find_spec("sklearn"):
        systems.insert(0, "tfidf-lr")
    if importlib.util.find_spec("accelerate"):
        systems.append("hf-trainer-rte-minilm")
    monkeypatch.setattr(sys, "argv", ["classify_quality.py", "--datasets", "rte", "--tiny", "--pretrained",
                                      str(tmp_path / "bert"), "--seeds", "1", "2", "--threads", "1", "--name", "tiny",
                                      *TINY_BERT, "--systems", *systems])
    cq.main()
    rows = json.loads((tmp_path / "results" / "tiny.json").read_text())["rows"]
    assert [row["system"] for row in rows] == systems
    for row in rows:
        assert row["splits"]["test"]["examples"] == cq.TINY_HOLDOUT == row["splits"]["valid"]["examples"]
        assert row["splits"]["test"]["label_counts"] == {"entailment": 10, "not_entailment": 10}  # stratified
        # tfidf-lr is deterministic (one run); every other system has each seed's run, in seed order
        assert [run["seed"] for run in row["runs"]] == ([None] if row["system"] == "tfidf-lr" else [1, 2])
        for run in row["runs"]:
            assert 0 <= run["accuracy"] <= 1 and -1 <= run["mcc"] <= 1 and run["cpu_s"] > 0
    data = tmp_path / "work" / "classify" / "rte-tiny" / "data-bert"
    meta = json.loads((data / "data.json").read_text())
    assert meta["pairs"] and meta["pair_separator"] == [3]  # the tiny BERT's [SEP]
    train, test = (set((data / f"{split}.txt").read_text().splitlines()) for split in ("train", "test"))
    assert len(test) == cq.TINY_HOLDOUT and not train & test and all(line.count("\t") == 1 for line in train)


def test_the_hf_peer_predicts_test_examples_in_their_order():
    """The peer's test predictions line up with the test labels (transformers' Trainer.predict reorders them
    under group_by_length): a stand-in model predicts 1 for an odd number of real tokens."""
    import torch

    import bench.classify_hf_peer as peer

    lengths = [3, 8, 1, 6, 5, 2, 9, 4, 7, 10, 11, 2, 2, 5]
    examples = peer.Examples.__new__(peer.Examples)
    examples.encodings = [{"input_ids": list(range(1, n + 1))} for n in lengths]
    examples.labels = [n % 2 for n in lengths]

    def collator(rows):
        width = max(len(r["input_ids"]) for r in rows)
        return {"input_ids": torch.tensor([r["input_ids"] + [0] * (width - len(r["input_ids"])) for r in rows])}

    class OddLength(torch.nn.Module):
        def forward(self, input_ids):
            odd = input_ids.ne(0).sum(1) % 2  # [B]
            return type("Output", (), {"logits": torch.stack([1.0 - odd, odd.float()], dim=1)})

    assert peer.predict_in_order(OddLength(), collator, examples, 4, bf16=False) == examples.labels
