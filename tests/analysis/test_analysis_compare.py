"""`multibranch analyze compare`: overlays of head and diversity reports (numbers taken, not recomputed)."""

from __future__ import annotations

import json
from pathlib import Path

from multibranch.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _heads_report(folder: Path, scores: list[float], dominant: dict[str, float] | None) -> Path:
    folder.mkdir(parents=True)
    points = [{"fraction": 0.5 * i, "masked_heads": 2 * i, "score": s, "masked": []} for i, s in enumerate(scores)]
    table = None if dominant is None else {"baseline": scores[0], "modules": [], "mean_dominant_delta": dominant}
    (folder / "heads.json").write_text(json.dumps({"metric": "bleu", "pruning_curve": {"points": points},
                                                   "dominant_heads": table}))
    return folder


def _diversity_report(folder: Path, value: float) -> Path:
    folder.mkdir(parents=True)
    layers = [{"layer": i, "att_pos": value, "att_sub": value + i, "ffn_sub": 0.5} for i in range(2)]
    (folder / "diversity.json").write_text(json.dumps({"layers": layers, "mean": {"att_pos": value,
                                                                                   "att_sub": value + 0.5,
                                                                                   "ffn_sub": 0.5}}))
    return folder


def test_compare_pruning_curves_and_dominant_heads(tmp_path):
    a = _heads_report(tmp_path / "std", [30.0, 25.0, 5.0], {"encoder_self": -1.5, "cross": -4.0})
    b = _heads_report(tmp_path / "dh", [29.0, 28.0, 20.0], {"encoder_self": -0.5, "cross": -1.0})
    out = tmp_path / "cmp"
    assert main(["analyze", "compare", "--report", str(a), "--report", str(b), "--label", "standard",
                 "--label", "drophead", "--out", str(out)]) == 0
    report = json.loads((out / "compare.json").read_text())
    assert report["kind"] == "heads" and [m["label"] for m in report["models"]] == ["standard", "drophead"]
    assert [p["change"] for p in report["models"][0]["curve"]] == [0.0, -5.0, -25.0]
    assert [p["change"] for p in report["models"][1]["curve"]] == [0.0, -1.0, -9.0]
    assert report["models"][1]["mean_dominant_delta"] == {"encoder_self": -0.5, "cross": -1.0}
    for png in ("pruning_curves.png", "dominant_heads.png"):
        assert (out / png).read_bytes().startswith(PNG_MAGIC)
    index = (out / "index.md").read_text()
    assert "| 100% | 5.00 (-25.00) | 20.00 (-9.00) |" in index
    assert "| drophead | 29.00 | -0.50 | -1.00 |" in index


def test_compare_diversity(tmp_path):
    reports = [_diversity_report(tmp_path / name, v) for name, v in (("mute", 0.4), ("mute-bias", 0.6))]
    out = tmp_path / "cmp"
    assert main(["analyze", "compare", *[x for r in reports for x in ("--report", str(r))], "--out", str(out)]) == 0
    report = json.loads((out / "compare.json").read_text())
    assert report["kind"] == "diversity" and [m["label"] for m in report["models"]] == ["mute", "mute-bias"]
    assert (out / "diversity.png").read_bytes().startswith(PNG_MAGIC)
    assert "| mute-bias | 0.600 | 1.100 | 0.500 |" in (out / "index.md").read_text()


def test_compare_refuses_mixed_or_missing_reports(tmp_path, capsys):
    heads = _heads_report(tmp_path / "h", [1.0, 0.5], None)
    div = _diversity_report(tmp_path / "d", 0.5)
    (tmp_path / "empty").mkdir()
    cases = [[heads, div], [heads], [heads, tmp_path / "empty"], [heads, tmp_path / "missing"]]
    for reports in cases:
        argv = ["analyze", "compare", *[x for r in reports for x in ("--report", str(r))], "--out", str(tmp_path / "o")]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("multibranch analyze: error:") and "Traceback" not in err
    assert main(["analyze", "compare", "--report", str(heads), "--report", str(heads), "--label", "x",
                 "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()


def test_compare_never_writes_into_a_report_it_compares(tmp_path, capsys):
    a = _heads_report(tmp_path / "std", [30.0, 25.0], {"encoder_self": -1.5})
    b = _heads_report(tmp_path / "dh", [29.0, 28.0], {"encoder_self": -0.5})
    (a / "index.md").write_text("# the standard model's heads\n")
    before = {path: path.read_bytes() for path in a.rglob("*")}
    for out in (a, a / "compare"):
        assert main(["analyze", "compare", "--report", str(a), "--report", str(b), "--out", str(out), "--force"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"--out {out}: is or lies in the compared report {a}, whose files the comparison would "
                            "replace; choose another --out"), err
    assert {path: path.read_bytes() for path in a.rglob("*")} == before
    assert main(["analyze", "compare", "--report", str(a), "--report", str(b), "--out", str(tmp_path)]) == 2
    assert main(["analyze", "compare", "--report", str(a), "--report", str(b), "--out", str(tmp_path),
                 "--force"]) == 0  # the folder holding both reports: their files are not replaced
    assert {path: path.read_bytes() for path in a.rglob("*")} == before
