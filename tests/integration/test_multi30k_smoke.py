"""Multi30k end to end: prepare a few thousand pairs, train a tiny MAT for a few dozen updates (library),
translate test_2016_flickr lines (CLI, in a subprocess). A smoke test: the pipeline runs on real data, the
training loss goes down and `translate` gives one non-empty line per input. No corpus text is copied
into the repository (subsets are written to the test's temporary directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest

pytestmark = pytest.mark.multi30k

SRC = Path(__file__).resolve().parents[2] / "src"


def _head(source: Path, target: Path, lines: int) -> None:
    with source.open(encoding="utf-8", newline="") as f, target.open("w", encoding="utf-8", newline="") as out:
        out.writelines(islice(f, lines))


def _cli(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "multibranch", *args], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"multibranch {args[0]} failed:\n{proc.stderr[-2000:]}"


def test_multi30k_train_then_translate(multi30k, tmp_path):
    from multibranch.config import from_dict
    from multibranch.data.parallel_prepare import PrepareConfig
    from multibranch.experiment import ExperimentConfig
    from multibranch.tasks import train
    from multibranch.tasks.translation.prepare import prepare
    from multibranch.train.trainer import RunOptions

    raw = tmp_path / "raw"
    raw.mkdir()
    for split, lines in (("train", 3000), ("val", 100)):
        for lang in ("en", "de"):
            _head(multi30k / f"{split}.{lang}", raw / f"{split}.{lang}", lines)
    _head(multi30k / "test_2016_flickr.en", tmp_path / "input.en", 20)
    prepare(PrepareConfig(src_lang="en", tgt_lang="de", train=str(raw / "train"), valid=str(raw / "val"),
                          out=str(tmp_path / "data"), vocab_size=1000))

    layer = {"kind": "transformer", "attention_branches": 2, "drop_branch": 0.2}  # MAT, the toolkit's point
    model = {"d_model": 64, "heads": 4, "ffn_dim": 128, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1,
             "encoder": layer, "decoder": layer}
    trn = {"max_tokens": 1000, "lr": {"schedule": "inverse_sqrt", "lr": 0.003, "warmup": 10}, "max_steps": 30,
           "valid_every": 30, "log_every": 1, "valid_bleu": False, "seed": 1, "amp": "none"}
    cfg = from_dict(ExperimentConfig, {"model": model, "train": trn, "decode": {"beam": 2}})
    train(cfg, RunOptions(tmp_path / "data", tmp_path / "run", device="cpu", progress=False))
    _cli("translate", "--ckpt", str(tmp_path / "run" / "last.pt"), "-i", str(tmp_path / "input.en"),
         "-o", str(tmp_path / "output.de"), "--max-len-b", "30", "--device", "cpu")

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["type"] == "train"]
    assert len(losses) == 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, f"training loss did not go down: {first:.2f} -> {last:.2f}"
    inputs = (tmp_path / "input.en").read_text(encoding="utf-8").split("\n")[:-1]
    outputs = (tmp_path / "output.de").read_text(encoding="utf-8").split("\n")
    assert outputs[-1] == "", "the output ends with a newline"
    assert len(outputs[:-1]) == len(inputs) == 20, "exactly one output line per input line"
    assert all(line.strip() for line in outputs[:-1]), "every translation is non-empty"
