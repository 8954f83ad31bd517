"""Keyword-labelled synthetic text and a tiny classifier experiment for the classification tests."""

from __future__ import annotations

import random
from pathlib import Path

from multibranch.config import from_dict
from multibranch.experiment import ExperimentConfig

KEYWORDS = {"north": "place", "seven": "number", "red": "colour"}
FILLER = "the a of to is on in it and at by we you they this that what how where".split()
TEXTS = ["the red of it", "seven and a on", "north the is", "red red seven", "a of north to"]


def synthetic_lines(n: int, seed: int) -> list[str]:
    """'label<TAB>text' lines whose label is given by the one keyword among filler words."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        keyword = list(KEYWORDS)[i % 3]
        words = rng.choices(FILLER, k=rng.randint(2, 7))
        words.insert(rng.randint(0, len(words)), keyword)
        lines.append(f"{KEYWORDS[keyword]}\t{' '.join(words)}\n")
    return lines


def classifier_experiment(pooling: str = "first", token_dropout: float = 0.0, subword_sampling: float = 0.0,
                          **train_overrides) -> ExperimentConfig:
    train_cfg = {"max_tokens": 400, "lr": {"schedule": "inverse_sqrt", "lr": 0.003, "warmup": 5},
                 "valid_every": 10, "log_every": 1, "max_steps": 20, "seed": 7, "label_smoothing": 0.0,
                 "best_metric": "accuracy", "deterministic": True}
    train_cfg.update(train_overrides)
    model = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "dropout": 0.1,
             "drophead": {"rate": {"schedule": "v", "rate": 0.1, "warmup_ratio": 0.1}}}
    return from_dict(ExperimentConfig, {"model": model, "train": train_cfg,
                                        "classifier": {"pooling": pooling, "token_dropout": token_dropout,
                                                       "subword_sampling": subword_sampling}})


def train_classifier(root: Path) -> Path:
    """best.pt of a short classifier run in `root` on keyword data (labels colour / number / place)."""
    import yaml

    from multibranch.cli import main

    (root / "train.tsv").write_text("".join(synthetic_lines(240, seed=3)), encoding="utf-8")
    assert main(["prepare", "--task", "classify", "--train", str(root / "train.tsv"), "--holdout", "0.1",
                 "--out", str(root / "data"), "--vocab-size", "60", "--seed", "2"]) == 0
    (root / "exp.yaml").write_text(yaml.safe_dump(classifier_experiment(max_steps=30, valid_every=30).to_dict()),
                                   encoding="utf-8")
    assert main(["train", "--data", str(root / "data"), "--out", str(root / "run"), "--config", str(root / "exp.yaml"),
                 "--no-progress", "--threads", "1"]) == 0
    return root / "run" / "best.pt"
