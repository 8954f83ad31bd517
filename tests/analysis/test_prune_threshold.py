"""`prune --max-drop` (threshold walk of the pruning curve) and the before/after report of `multibranch prune`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from multibranch.analysis.heads import attention_sites
from multibranch.cli import main
from multibranch.config import from_dict
from multibranch.models import ModelConfig, build_model
from multibranch.pruning.curve import planned_counts, within_drop
from multibranch.pruning.selection import heads_within_drop
from multibranch.pruning.speed import side_by_side
from tests.helpers.configs import tiny_model_dict


def _sites():
    cfg = from_dict(ModelConfig, tiny_model_dict())
    return attention_sites(build_model(cfg).eval())  # 6 modules x 4 heads


def test_threshold_keeps_the_last_step_within_the_drop_and_stops_at_the_first_one_beyond():
    sites = _sites()
    gen = torch.Generator().manual_seed(4)
    scores = {s.name: torch.rand(s.heads, generator=gen) for s in sites}
    ranking = sorted((float(scores[s.name][h]), s.name, h) for s in sites for h in range(s.heads))
    # hand-built curve: unpruned 30.0; 29.8, 29.5 (exactly at the limit: kept), 29.4 (beyond), then it would recover
    curve = iter([30.0, 29.8, 29.5, 29.4, 31.0, 31.0])
    calls = []

    def evaluate() -> float:
        calls.append(1)
        return next(curve)

    chosen, walked = heads_within_drop(sites, lambda gates: scores, evaluate, max_drop=0.5, step=0.1)
    counts = [c for _, c in planned_counts(24, 0.1, 24 - 6)]
    assert [p.score for p in walked] == [30.0, 29.8, 29.5, 29.4]
    assert len(calls) == 4  # the walk stopped at the first step beyond the threshold
    assert chosen.fraction == 0.2 and len(chosen.masked) == counts[2] == 5
    assert set(chosen.masked) == {(name, h) for _, name, h in ranking[:5]}  # the 5 least important
    assert all(s.module.head_gate is None for s in sites)

    nothing, walked = heads_within_drop(sites, lambda gates: scores, iter([30.0, 20.0]).__next__, max_drop=0.5)
    assert nothing.masked == [] and len(walked) == 2  # even the first step drops too much: prune nothing


def test_threshold_walk_reaches_the_end_when_nothing_drops():
    from multibranch.pruning.curve import CurvePoint

    points = [CurvePoint(0.1 * i, 10.0 - 0.1 * i) for i in range(5)]
    chosen, walked = within_drop(iter(points), max_drop=1.0)
    assert chosen is points[-1] and walked == points
    with pytest.raises(ValueError):
        within_drop(iter(points), max_drop=-1.0)


def test_speed_rounds_alternate_the_order_and_keep_every_time():
    order: list[str] = []
    ticks = iter(range(100))

    def scorer(label: str, score: float):
        def call() -> float:
            order.append(label)
            return score
        return call

    timed = side_by_side({"before": scorer("before", 1.0), "after": scorer("after", 2.0)}, rounds=3,
                         clock=lambda: float(next(ticks)))
    assert order == ["before", "after", "after", "before", "before", "after"]
    assert timed["before"]["score"] == 1.0 and timed["after"]["score"] == 2.0
    assert timed["before"]["seconds"] == [1.0, 1.0, 1.0] and len(timed["after"]["seconds"]) == 3


def _parameters(path: Path) -> int:
    from multibranch.loading.checkpoint import load_model

    return sum(p.numel() for p in load_model(path).model.parameters())


def test_prune_max_drop_report_is_complete_and_consistent(tiny_checkpoint, tiny_data, tmp_path, capsys):
    from multibranch.evaluate.metrics import score_corpus
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.loading.checkpoint import load_model
    from multibranch.tasks.translation.dataset import PreparedData
    from multibranch.tasks.translation.translator import Translator

    out = tmp_path / "pruned.pt"
    argv = ["prune", "--ckpt", str(tiny_checkpoint), "--out", str(out), "--data", str(tiny_data), "--max-drop", "100",
            "--step", "0.25", "--max-sentences", "4", "--beam", "1", "--speed-rounds", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.with_suffix(".json").read_text())

    assert {"checkpoint", "pruned", "selection", "removed", "parameters", "metric", "set", "before", "after",
            "score_change", "speedup", "identical_outputs", "masked_score"} <= set(report)
    # parameters counted independently, from the two checkpoints' models
    before, after = _parameters(tiny_checkpoint), _parameters(out)
    assert report["parameters"]["before"] == before and report["parameters"]["after"] == after
    assert before - after == len(report["removed"]) * (4 * 32 * 8 + 3 * 8)  # per head: Q/K/V rows+bias, W_O cols
    # a 100-point budget never stops: the walk reaches the last step where every module keeps one head
    assert report["selection"]["mode"] == "max_drop" and len(report["removed"]) == 24 - 6
    assert [p["masked_heads"] for p in report["selection"]["walked"]] == [0, 6, 12, 18]
    # the scores: before = BLEU of the unpruned model computed here; after = the masked model's score
    data = PreparedData.load(tiny_data)
    split = data.split("valid")
    loaded = load_model(tiny_checkpoint)
    hyps = Translator(loaded.model, loaded.tokenizer, DecodeConfig(**{**loaded.config.decode.__dict__, "beam": 1})
                      ).translate(split.raw_src_lines()[:4])
    bleu = score_corpus(hyps, [split.raw_tgt_lines()[:4]], metrics=("bleu",))["bleu"]["score"]
    assert report["before"]["score"] == pytest.approx(bleu)
    assert report["after"]["score"] == report["masked_score"]
    assert report["selection"]["walked"][-1]["score"] == report["masked_score"]
    assert report["score_change"] == pytest.approx(report["after"]["score"] - report["before"]["score"])
    for side in ("before", "after"):
        assert len(report[side]["seconds"]) == 2
        assert report[side]["sentences_per_s"] == pytest.approx(4 / min(report[side]["seconds"]))
    assert report["set"] == {**report["set"], "split": "valid", "sentences": 4, "rounds": 2}
    assert report["set"]["decode"]["beam"] == 1
    assert f"{before:,} -> {after:,}" in printed and "sentences/s" in printed

    # refuses to overwrite the checkpoint or its report without --force
    assert main(argv) == 2
    out.unlink()
    assert main(argv) == 2  # the report is still there
    assert main([*argv, "--force"]) == 0


def test_prune_heads_json_without_data_reports_parameters_only(tiny_checkpoint, tmp_path, capsys):
    heads = tmp_path / "heads.json"
    heads.write_text(json.dumps([["decoder.layers.1.cross_attn", 2]]))
    out = tmp_path / "one.pt"
    report_path = tmp_path / "r" / "report.json"
    assert main(["prune", "--ckpt", str(tiny_checkpoint), "--out", str(out), "--heads-json", str(heads),
                 "--report", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["removed"] == [["decoder.layers.1.cross_attn", 2]] and "before" not in report
    assert report["parameters"]["after"] == _parameters(out)


@pytest.mark.parametrize("argv, message", [
    (["--max-drop", "-1", "--data", "D"], "--max-drop"),
    (["--max-drop", "0.5"], "--data"),
    (["--max-drop", "0.5", "--data", "D", "--step", "0"], "--step"),
    (["--max-drop", "0.5", "--fraction", "0.2", "--data", "D"], "not allowed"),
])
def test_prune_threshold_bad_flags(tiny_checkpoint, tmp_path, capsys, argv, message):
    code = None
    try:
        code = main(["prune", "--ckpt", str(tiny_checkpoint), "--out", str(tmp_path / "x.pt"), *argv])
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x.pt").exists()
