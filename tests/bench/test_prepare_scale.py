"""bench/prepare_scale.py in its tiny mode: the generated corpus, each measured step, the goals table."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import prepare_scale
from multibranch.tasks.translation.dataset import PreparedData


def _args(**overrides) -> argparse.Namespace:
    values = dict(vocab_size=prepare_scale.TINY["vocab_size"], spm_sample=prepare_scale.TINY["spm_sample"],
                  shard_pairs=700, workers=1, chunk_lines=10_000)
    values.update(overrides)
    return argparse.Namespace(**values)


def test_steps_generate_prepare_reuse_and_encode(tmp_path):
    corpus = tmp_path / "corpus"
    generated = prepare_scale.generate(corpus, 1500)
    train_lines = (corpus / "train.src").read_text(encoding="utf-8").splitlines()
    assert len(train_lines) == 1500 and generated["bytes"] > 0
    args = _args()
    first = prepare_scale.run_prepare(corpus, tmp_path / "data", args, None)
    data = PreparedData.load(tmp_path / "data")
    assert first["pairs_kept"] == len(data.split("train")) and first["shards"] == -(-first["pairs_kept"] // 700)
    reuse = prepare_scale.run_prepare(corpus, tmp_path / "reuse", args, str(tmp_path / "data" / "spm.model"))
    reused = PreparedData.load(tmp_path / "reuse").split("train")
    assert [reused.src(i).tolist() for i in range(0, len(reused), 97)] == \
        [data.split("train").src(i).tolist() for i in range(0, len(reused), 97)]
    floor = prepare_scale.run_spm_encode(corpus, tmp_path / "data" / "spm.model", args)
    for row in (first, reuse, floor):
        assert row["seconds"] > 0 and row["pairs_per_s"] > 0 and row["peak_rss_mb"] > 0
    assert reuse["pairs_per_s"] * reuse["seconds"] == pytest.approx(1500 + 1000)
    trained = prepare_scale.run_train(tmp_path / "data", tmp_path / "run", 3)
    assert trained["seconds"] > 0 and (tmp_path / "run" / "last.pt").is_file()
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("type") == "train"]
    assert max(steps) == 3


@pytest.mark.slow
def test_tiny_run_end_to_end(tmp_path, capsys):
    assert prepare_scale.main(["--tiny", "--no-save", "--dir", str(tmp_path / "scratch")]) == 0
    out = capsys.readouterr().out
    assert "| 6000 |" in out and "train_rss_growth" in out and "floor_ratio" in out
    assert not (tmp_path / "scratch").exists()  # generated corpora are removed unless --keep
    json.dumps(out)
