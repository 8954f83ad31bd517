"""`multibranch analyze heads` on a tiny trained model: report structure, plots, refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from multibranch.cli import main
from multibranch.evaluate.metrics import score_corpus
from multibranch.tasks.translation.dataset import PreparedData
from tests.helpers.translation import translator_of

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only cost on a busy machine

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _analyze(ckpt: Path, data: Path, out: Path, *extra: str) -> int:
    return main(["analyze", "heads", "--ckpt", str(ckpt), "--data", str(data), "--out", str(out),
                 "--bleu-max-sentences", "2", "--beam", "1", "--step", "0.5", *extra])


def test_analyze_heads_writes_numbers_plots_and_index(tiny_checkpoint, tiny_data, tmp_path):
    out = tmp_path / "report"
    assert _analyze(tiny_checkpoint, tiny_data, out) == 0
    report = json.loads((out / "heads.json").read_text())

    assert [(m["role"], m["layer"]) for m in report["modules"]] == [
        ("encoder_self", 0), ("encoder_self", 1), ("decoder_self", 0), ("cross", 0), ("decoder_self", 1), ("cross", 1)]
    for module in report["modules"]:
        assert module["heads"] == len(module["importance"]) == len(module["entropy"]) == 4
        assert math.sqrt(sum(v * v for v in module["importance"])) == pytest.approx(1.0, abs=1e-5)
        assert all(0.0 <= e for e in module["entropy"])
    assert report["examples"] == 24 and report["split"] == "valid"

    points = report["pruning_curve"]["points"]
    assert [p["fraction"] for p in points] == [0.0, 0.5, 1.0]
    assert [p["masked_heads"] for p in points] == [0, 12, 24]
    assert all(len(p["masked"]) == p["masked_heads"] for p in points)

    split = PreparedData.load(tiny_data).split("valid")
    translator = translator_of(str(tiny_checkpoint), beam=1)
    hypotheses = translator.translate(split.raw_src_lines()[:2])
    unpruned = score_corpus(hypotheses, [split.raw_tgt_lines()[:2]], metrics=("bleu",))["bleu"]["score"]
    assert points[0]["score"] == unpruned

    dominant = report["dominant_heads"]
    assert dominant["baseline"] == unpruned
    assert len(dominant["modules"]) == 6 and all(len(m["deltas"]) == 4 for m in dominant["modules"])
    for module in dominant["modules"]:
        assert module["dominant_delta"] == min(module["deltas"])
    assert set(dominant["mean_dominant_delta"]) == {"encoder_self", "decoder_self", "cross"}

    for name in ("importance.png", "entropy.png", "pruning_curve.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
    index = (out / "index.md").read_text()
    for name in ("heads.json", "importance.png", "entropy.png", "pruning_curve.png"):
        assert f"({name})" in index
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["heads.json", "importance.png", "entropy.png", "pruning_curve.png", "index.md"])  # no temporaries


def test_per_example_importance_does_not_depend_on_the_batch_size(tiny_checkpoint, tiny_data, tmp_path):
    """--per-example takes |gradient| per sentence, so --max-tokens (how sentences are batched) changes nothing."""
    def importance(max_tokens: str, *mode: str) -> list[list[float]]:
        out = tmp_path / f"report{max_tokens}{''.join(mode)}"
        assert _analyze(tiny_checkpoint, tiny_data, out, "--no-curve", "--no-dominant", "--max-tokens", max_tokens,
                        *mode) == 0
        report = json.loads((out / "heads.json").read_text())
        assert report["per_example"] is bool(mode)
        return [module["importance"] for module in report["modules"]]

    for small, large in zip(importance("200", "--per-example"), importance("4096", "--per-example"), strict=True):
        assert small == pytest.approx(large, rel=1e-4, abs=1e-6)
    # per batch (Michel et al.'s code), gradients of opposite sign cancel within a batch: the batching shows
    flat = [[value for module in importance(size) for value in module] for size in ("200", "4096")]
    assert flat[0] != pytest.approx(flat[1], rel=1e-3)


def test_analyze_refuses_a_non_empty_report_dir_and_bad_input(tiny_checkpoint, tiny_data, tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    assert _analyze(tiny_checkpoint, tiny_data, out, "--no-dominant", "--no-curve") == 2
    err = capsys.readouterr().err
    assert "not empty" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]

    assert _analyze(tiny_checkpoint, tiny_data, out, "--no-dominant", "--no-curve", "--force") == 0
    assert (out / "heads.json").is_file() and not (out / "pruning_curve.png").exists()
    assert json.loads((out / "heads.json").read_text())["pruning_curve"] is None

    assert _analyze(tiny_checkpoint, tiny_data, tmp_path / "r2", "--split", "nope") == 2
    assert "no split 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()
    assert _analyze(tmp_path / "missing.pt", tiny_data, tmp_path / "r3") == 2
    assert "checkpoint not found" in capsys.readouterr().err


def test_report_of_a_pruned_model_with_unequal_head_counts(tmp_path):
    from multibranch.pruning.head_report import write_report

    modules = [{"name": f"decoder.layers.{i}.cross_attn", "role": "cross", "layer": i, "heads": 4 - i,
                "importance": [0.5] * (4 - i), "entropy": [1.0] * (4 - i)} for i in range(3)]
    report = {"checkpoint": "x.pt", "data": "d", "split": "valid", "examples": 1, "target_tokens": 5,
              "normalized": False, "modules": modules, "bleu": None, "pruning_curve": None, "dominant_heads": None}
    folder = write_report(report, tmp_path / "r", force=False)
    assert folder.files == ["heads.json", "importance.png", "entropy.png", "index.md"]
    assert all((tmp_path / "r" / name).read_bytes().startswith(PNG_MAGIC) for name in folder.files if name.endswith("png"))
    assert json.loads((tmp_path / "r" / "heads.json").read_text()) == report
