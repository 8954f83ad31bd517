"""`multibranch analyze lengths`: buckets partition the set, per-bucket BLEU is sacreBLEU on the subset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu

from multibranch.analysis.lengths import assign_buckets, bleu_by_length, make_buckets, parse_edges
from multibranch.cli import main
from multibranch.tasks import train
from multibranch.tasks.translation.dataset import PreparedData
from multibranch.train.trainer import RunOptions
from tests.helpers.configs import tiny_experiment
from tests.helpers.translation import translator_of

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_default_buckets_and_labels():
    buckets = make_buckets(parse_edges("15,30,45,60,75,90,105"))
    assert [b.label for b in buckets] == ["1-15", "16-30", "31-45", "46-60", "61-75", "76-90", "91-105", ">105"]
    assert assign_buckets([1, 15, 16, 30, 31, 105, 106, 500], buckets).tolist() == [0, 0, 1, 1, 2, 6, 7, 7]


@pytest.mark.parametrize("text", ["", "15,15", "30,15", "0,5", "a,b"])
def test_bad_edges_are_refused(text):
    with pytest.raises(ValueError):
        parse_edges(text)


def test_buckets_partition_and_bleu_per_subset():
    lengths = [3, 4, 20, 21, 22, 50]
    refs = ["a cat sat on the mat", "the dog runs", "it is raining today in town", "we eat bread", "blue sky",
            "one two three four"]
    hyps = ["a cat sat on a mat", "the dog runs", "it rains today in the town", "we eat", "blue sky",
            "one two three five"]
    rows = bleu_by_length(lengths, hyps, refs, make_buckets([5, 25, 40]))
    assert [r["sentences"] for r in rows] == [2, 3, 0, 1] and sum(r["sentences"] for r in rows) == len(lengths)
    assert rows[2]["bleu"] is None  # empty bucket reported, not dropped
    for row, members in zip(rows, [[0, 1], [2, 3, 4], [], [5]]):
        if members:
            expected = sacrebleu.corpus_bleu([hyps[i] for i in members], [[refs[i] for i in members]]).score
            assert row["bleu"] == pytest.approx(expected, abs=1e-9)


@pytest.fixture(scope="module")
def two_checkpoints(tiny_data, tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("lengths")
    out = []
    for steps in (6, 12):
        run = root / f"run{steps}"
        train(tiny_experiment(max_steps=steps, deterministic=True),
              RunOptions(tiny_data, run, device="cpu", progress=False))
        out.append(run / "last.pt")
    return out


def test_analyze_lengths_compares_two_checkpoints(two_checkpoints, tiny_data, tmp_path):
    out = tmp_path / "report"
    argv = ["analyze", "lengths", "--ckpt", str(two_checkpoints[0]), "--ckpt", str(two_checkpoints[1]),
            "--label", "short", "--label", "long", "--data", str(tiny_data), "--out", str(out), "--split", "valid",
            "--buckets", "4,8", "--beam", "1", "--max-sentences", "10"]
    assert main(argv) == 0
    report = json.loads((out / "lengths.json").read_text())
    split = PreparedData.load(tiny_data).split("valid")
    lengths = split.src_lengths[:10].tolist()
    sources, references = split.raw_src_lines()[:10], split.raw_tgt_lines()[:10]
    assert [m["label"] for m in report["models"]] == ["short", "long"]
    for model, ckpt in zip(report["models"], two_checkpoints):
        counts = [b["sentences"] for b in model["buckets"]]
        assert counts == [sum(1 for n in lengths if lo <= n <= hi) for lo, hi in [(0, 4), (5, 8), (9, 10**9)]]
        assert sum(counts) == 10
        hyps = translator_of(str(ckpt), beam=1).translate(sources)
        assert model["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [references]).score)
    assert (out / "lengths.png").read_bytes().startswith(PNG_MAGIC)
    assert "(lengths.png)" in (out / "index.md").read_text()
    assert main(argv) == 2  # non-empty report folder without --force


def test_analyze_lengths_bad_flags(two_checkpoints, tiny_data, tmp_path, capsys):
    base = ["analyze", "lengths", "--ckpt", str(two_checkpoints[0]), "--data", str(tiny_data),
            "--out", str(tmp_path / "r")]
    assert main([*base, "--buckets", "30,15"]) == 2
    assert main([*base, "--label", "a", "--label", "b"]) == 2
    err = capsys.readouterr().err
    assert "--buckets" in err and "--label" in err
    assert not (tmp_path / "r").exists()


def test_analyze_lengths_takes_several_checkpoints_after_one_ckpt_as_translate_does():
    from multibranch.cli import build_parser

    parser = build_parser()
    rest = ["--data", "D", "--out", "R"]
    together = parser.parse_args(["analyze", "lengths", "--ckpt", "a.pt", "b.pt", "--label", "A", "B", *rest])
    repeated = parser.parse_args(["analyze", "lengths", "--ckpt", "a.pt", "--label", "A", "--ckpt", "b.pt",
                                  "--label", "B", *rest])
    translate = parser.parse_args(["translate", "--ckpt", "a.pt", "b.pt"])
    assert together.ckpt == repeated.ckpt == translate.ckpt == ["a.pt", "b.pt"]
    assert together.label == repeated.label == ["A", "B"]
