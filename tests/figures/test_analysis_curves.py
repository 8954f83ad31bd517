"""`multibranch plot RUN`: series from a hand-written metrics.jsonl, smoothing, schedule curves, PNGs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from multibranch.cli import main
from multibranch.experiment import resolve_config
from multibranch.figures.curves import moving_average, read_metrics, schedule_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KAPPA = "encoder.layers.0.branched.weights.kappa"


def write_run(run: Path, records: list[dict], overrides: list[str]) -> Path:
    run.mkdir()
    config = resolve_config("transformer-tiny", overrides=overrides)
    (run / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def hand_records() -> list[dict]:
    records = []
    for step in (1, 2, 3, 4, 5):
        records.append({"type": "train", "step": step, "loss": 10.0 - step, "ppl": 2.0 ** (10 - step), "lr": 1e-4 * step,
                        "tokens_per_s": 100.0 * step,
                        "modules": {f"{KAPPA}.0": step / 10, f"{KAPPA}.1": 1 - step / 10, "encoder.layers.0.w3": 0.25}})
        if step % 2 == 0:
            records.append({"type": "valid", "step": step, "loss": 9.5 - step, "ppl": 3.0, "bleu": 4.0 * step})
    return records


def test_moving_average_by_hand():
    assert moving_average([1.0, 2.0, 6.0, 3.0, 9.0], 3) == pytest.approx([1.0, 1.5, 3.0, 11 / 3, 6.0])
    assert moving_average([4.0, 2.0], 1) == [4.0, 2.0]
    with pytest.raises(ValueError):
        moving_average([1.0], 0)


def test_v_schedule_hits_p_at_zero_zero_at_warmup_and_p_at_total():
    config = resolve_config("drophead-tiny", overrides=["train.max_steps=100", "train.lr.warmup=20"])
    curves = schedule_curves(config, points=11)
    assert list(curves) == ["model.drophead.rate"]
    curve = dict(zip(curves["model.drophead.rate"]["step"], curves["model.drophead.rate"]["value"], strict=True))
    assert curve[0] == pytest.approx(0.2) and curve[20] == 0.0 and curve[100] == pytest.approx(0.2)
    assert curve[10] == pytest.approx(0.1) and curve[60] == pytest.approx(0.1)  # linear on both sides of the V


def test_plot_run_writes_expected_series_and_pngs(tmp_path):
    run = write_run(tmp_path / "run", hand_records(), ["model.drophead.rate={schedule: v, rate: 0.2}",
                                                       "train.max_steps=40", "train.lr.warmup=10"])
    assert main(["plot", str(run), "--window", "2"]) == 0
    out = run / "plots"
    report = json.loads((out / "curves.json").read_text())
    assert report["train"]["loss"] == {"step": [1, 2, 3, 4, 5], "value": [9.0, 8.0, 7.0, 6.0, 5.0]}
    assert report["train"]["tokens_per_s"]["value"] == [100.0, 200.0, 300.0, 400.0, 500.0]
    assert report["valid"]["bleu"] == {"step": [2, 4], "value": [8.0, 16.0]}
    assert "bleu" not in report["train"]
    kappa0 = report["modules"][f"{KAPPA}.0"]
    assert kappa0["value"] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert kappa0["smoothed"] == pytest.approx([0.1, 0.15, 0.25, 0.35, 0.45])
    assert set(report["modules"]) == {f"{KAPPA}.0", f"{KAPPA}.1", "encoder.layers.0.w3"}
    rate = report["schedules"]["model.drophead.rate"]
    assert rate["value"][0] == pytest.approx(0.2) and rate["value"][-1] == pytest.approx(0.2) and rate["step"][-1] == 40
    for name in ("curves.png", "modules.png", "schedules.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
        assert f"({name})" in (out / "index.md").read_text()
    assert main(["plot", str(run)]) == 2  # the folder is not empty now
    assert main(["plot", str(run), "--force"]) == 0


def test_plot_refuses_bad_runs(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "missing")]) == 2
    run = write_run(tmp_path / "run", hand_records(), [])
    (run / "metrics.jsonl").write_text('{"type": "train", "step": 1}\nnot json\n{"type": "train", "step": 2}\n')
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl:2" in err and not (run / "plots").exists()


def test_a_line_cut_by_a_kill_is_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"type": "train", "step": 1, "loss": 2.0}\n{"type": "tra')
    assert read_metrics(path) == [{"type": "train", "step": 1, "loss": 2.0}]
