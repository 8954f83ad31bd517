"""`multibranch prune` as a library call (pruning/run.py) and its speed report: every round's
timing, each model's median with the spread of the rounds, and the per-round speed-up range, which
says "no measurable speed change" when it spans x1 (a shared machine gave x0.71, x9.75 and x0.26 for
one and the same change when only the fastest round was reported)."""

from __future__ import annotations

import ast
import json
import statistics
from pathlib import Path

import pytest

from multibranch.analysis.batches import teacher_forced_batches
from multibranch.analysis.heads import attention_sites
from multibranch.checkpoint.format import save_checkpoint
from multibranch.cli import main
from multibranch.config import from_dict
from multibranch.experiment import ExperimentConfig
from multibranch.loading.checkpoint import load_model
from multibranch.pruning.importance import head_importance
from multibranch.pruning.report import summary
from multibranch.pruning.run import PruneOptions, prune_checkpoint
from multibranch.pruning.selection import least_important
from multibranch.pruning.speed import speed_spread
from multibranch.tasks import build_task_model
from multibranch.tasks.translation.dataset import PreparedData

SRC = Path(__file__).resolve().parents[2] / "src" / "multibranch"


def _checkpoint(path: Path, vocab: int = 40) -> Path:
    """An untrained tiny translation checkpoint (2+2 layers, 4 heads: 24 heads in 6 attention modules)."""
    model = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1,
             "src_vocab_size": vocab, "tgt_vocab_size": vocab}
    cfg = from_dict(ExperimentConfig, {"model": model, "decode": {"beam": 1, "max_len_a": 0.0, "max_len_b": 4}})
    net = build_task_model(cfg)
    save_checkpoint(path, {"config": cfg.to_dict(), "model": {k: v.clone() for k, v in net.state_dict().items()},
                           "meta": {}})
    return path


def test_speed_spread_by_hand():
    spread = speed_spread([2.0, 4.0, 3.0], [1.0, 8.0, 3.0], sentences=12)
    assert spread["before"] == {"sentences_per_s": 6.0, "sentences_per_s_median": 4.0, "sentences_per_s_min": 3.0,
                                "seconds": [2.0, 4.0, 3.0]}
    assert spread["after"] == {"sentences_per_s": 12.0, "sentences_per_s_median": 4.0, "sentences_per_s_min": 1.5,
                               "seconds": [1.0, 8.0, 3.0]}
    # per round: before seconds / after seconds
    assert spread["speed"] == {"rounds": 3, "speedups": [2.0, 0.5, 1.0], "speedup_median": 1.0, "speedup_min": 0.5,
                               "speedup_max": 2.0}
    with pytest.raises(ValueError, match="same number"):
        speed_spread([1.0], [1.0, 2.0], 3)


def _report(speedups: list[float]) -> dict:
    before = [1.0] * len(speedups)
    after = [1.0 / s for s in speedups]
    spread = speed_spread(before, after, 10)
    return {"removed": [["encoder.layers.0.self_attn", 0]],
            "parameters": {"before": 1000, "after": 900, "change": -100, "change_percent": -10.0},
            "metric": "bleu", "set": {"split": "valid", "sentences": 10, "rounds": len(speedups)},
            "before": {"score": 20.0, **spread["before"]}, "after": {"score": 19.0, **spread["after"]},
            "score_change": -1.0, "speed": spread["speed"], "speedup": spread["speed"]["speedup_median"]}


def test_summary_gives_the_median_and_the_range_and_says_when_it_spans_one():
    noisy = summary(_report([0.71, 9.75, 0.26]))
    assert "x0.71 (rounds x0.26-x9.75)" in noisy and "no measurable speed change" in noisy
    steady = summary(_report([1.2, 1.3, 1.25]))
    assert "x1.25 (rounds x1.20-x1.30)" in steady and "no measurable" not in steady
    assert "10.0 -> 12.5 sentences/s (median of 3 alternating rounds" in steady
    assert "one round measures no spread" in summary(_report([1.1]))


def test_prune_checkpoint_is_one_library_call(tmp_path):
    ckpt = _checkpoint(tmp_path / "model.pt")
    out, report_path = tmp_path / "pruned.pt", tmp_path / "r" / "report.json"
    report = prune_checkpoint(ckpt, out, report_path,
                              PruneOptions(heads=[("encoder.layers.1.self_attn", 2)], heads_file="h.json"))
    assert json.loads(report_path.read_text()) == report
    assert report["removed"] == [["encoder.layers.1.self_attn", 2]]
    assert report["selection"] == {"mode": "heads_json", "file": "h.json"}
    assert report["parameters"]["change"] == -(4 * 32 * 8 + 3 * 8)  # Q/K/V rows and biases, W_O columns of a head
    assert out.is_file() and "before" not in report
    with pytest.raises(FileExistsError):
        prune_checkpoint(ckpt, out, report_path, PruneOptions(heads=[("encoder.layers.1.self_attn", 2)]))
    with pytest.raises(ValueError, match="exactly one"):
        prune_checkpoint(ckpt, tmp_path / "x.pt", tmp_path / "x.json", PruneOptions(fraction=0.2, max_drop=1.0))


def test_prune_report_gives_every_round_and_the_spread(tiny_data, tmp_path, capsys):
    vocab = PreparedData.load(tiny_data).meta["vocab_size"]["src"]
    ckpt = _checkpoint(tmp_path / "model.pt", vocab)
    out = tmp_path / "pruned.pt"
    assert main(["prune", "--ckpt", str(ckpt), "--out", str(out), "--data", str(tiny_data), "--fraction", "0.25",
                 "--max-examples", "8", "--max-sentences", "4", "--speed-rounds", "3"]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.with_suffix(".json").read_text())
    before, after = report["before"]["seconds"], report["after"]["seconds"]
    assert len(before) == len(after) == 3
    ratios = [b / a for b, a in zip(before, after)]
    assert report["speed"]["speedups"] == pytest.approx(ratios)
    assert report["speed"]["speedup_min"] == pytest.approx(min(ratios))
    assert report["speed"]["speedup_max"] == pytest.approx(max(ratios))
    assert report["speedup"] == report["speed"]["speedup_median"] == pytest.approx(statistics.median(ratios))
    for side, seconds in (("before", before), ("after", after)):
        assert report[side]["sentences_per_s_median"] == pytest.approx(4 / statistics.median(seconds))
        assert report[side]["sentences_per_s_min"] == pytest.approx(4 / max(seconds))
    assert f"(rounds x{min(ratios):.2f}-x{max(ratios):.2f})" in printed


def test_no_speed_scores_both_models_without_timing(tiny_data, tmp_path, capsys):
    vocab = PreparedData.load(tiny_data).meta["vocab_size"]["src"]
    ckpt = _checkpoint(tmp_path / "model.pt", vocab)
    out = tmp_path / "pruned.pt"
    assert main(["prune", "--ckpt", str(ckpt), "--out", str(out), "--data", str(tiny_data), "--fraction", "0.25",
                 "--max-examples", "8", "--max-sentences", "4", "--no-speed"]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.with_suffix(".json").read_text())
    assert "speed" not in report and "speedup" not in report and "seconds" not in report["before"]
    assert report["set"]["rounds"] is None and "score" in report["after"] and "identical_outputs" in report
    assert "sentences/s" not in printed and "BLEU on 4 sentences" in printed


def test_per_example_ranks_the_heads_by_the_per_example_importance(tiny_data, tmp_path):
    data = PreparedData.load(tiny_data)
    ckpt = _checkpoint(tmp_path / "model.pt", data.meta["vocab_size"]["src"])
    out = tmp_path / "pruned.pt"
    assert main(["prune", "--ckpt", str(ckpt), "--out", str(out), "--data", str(tiny_data), "--fraction", "0.25",
                 "--max-examples", "8", "--max-tokens", "200", "--max-sentences", "2", "--no-speed",
                 "--per-example"]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["selection"]["per_example"] is True
    model = load_model(ckpt).model
    sites = attention_sites(model)
    batches = teacher_forced_batches(data.split("valid"), model.config, max_tokens=200, limit=8)
    expected = least_important(sites, head_importance(model, batches, sites, per_example=True), 0.25)
    assert report["removed"] == [[name, head] for name, head in sorted(expected)]


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


@pytest.mark.parametrize("command", ["prune", "analyze", "plot"])
def test_these_commands_import_no_other_command(command):
    path = SRC / "commands" / f"{command}.py"
    assert [n for n in _imports(path) if n.startswith("multibranch.commands")] == []


def test_prune_command_only_parses_and_calls_the_library():
    """The orchestration (loading, importance, scoring, timing, the report) is the pruning package's."""
    path = SRC / "commands" / "prune.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert not [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    ours = {n for n in _imports(path) if n.startswith("multibranch")}
    assert ours == {"multibranch.arguments", "multibranch.pruning.report", "multibranch.pruning.run",
                    "multibranch.pruning.selection"}
