"""bench/analysis_multi30k.py chooses the pruning threshold's step on valid and reports the pruned model on
test: the split a number is reported on is never the split its choice was made on."""

from __future__ import annotations

import json

from bench.analysis_multi30k import parse_args, plan, write_selected_heads


def option(cli: list[str], name: str) -> str | None:
    return cli[cli.index(name) + 1] if name in cli else None


def test_prune_walks_on_valid_and_reports_the_chosen_heads_on_test(tmp_path):
    args = parse_args(["--runs", str(tmp_path / "runs"), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
                       "--max-drop", "4"])
    steps = {name: cli for name, cli, _ in plan(args)}
    select, report = steps["prune-select"], steps["prune-transformer"]
    assert option(select, "--max-drop") == "4.0" and option(select, "--score-split") == "valid"
    assert option(report, "--score-split") == "test" and "--max-drop" not in report and "--fraction" not in report
    assert option(report, "--heads-json") == str(tmp_path / "out" / "prune-select" / "heads.json")
    assert list(steps).index("prune-select") < list(steps).index("prune-transformer")
    for name, cli in steps.items():  # nothing else picks a threshold or fraction on test either
        if "--max-drop" in cli or "--fraction" in cli:
            assert option(cli, "--score-split") != "test", name


def test_the_heads_removed_on_valid_are_the_heads_json_of_the_test_report(tmp_path):
    assert write_selected_heads(tmp_path) is False  # no selection yet: the test-split step is skipped
    (tmp_path / "prune-select").mkdir()
    removed = [["decoder.layers.0.cross_attn", 1], ["encoder.layers.2.self_attn", 3]]
    (tmp_path / "prune-select" / "index.json").write_text(json.dumps({"removed": removed, "selection": {}}))
    assert write_selected_heads(tmp_path) is True
    assert json.loads((tmp_path / "prune-select" / "heads.json").read_text()) == removed
