"""bench/preset_changes.json records the day each preset's definition last changed, which the benchmark pages
compare with the day a row was measured. The record must follow the presets: a preset changed without recording
the day would leave the rows measured before it unmarked."""

from __future__ import annotations

import datetime
import json

from bench import preset_changes
from multibranch.experiment import list_presets


def test_the_record_holds_every_preset_as_it_is_defined():
    record = preset_changes.load_record()
    changed = preset_changes.differences(record)
    assert not changed, (f"presets changed, new or deleted without a record: {', '.join(sorted(changed))}; run "
                         "`python bench/preset_changes.py --update` to record today's date")
    assert sorted(record) == list_presets()


def test_a_changed_definition_is_found_and_its_description_is_not_part_of_it(monkeypatch):
    record = preset_changes.load_record()
    tampered = {**record, "mat-tiny": {**record["mat-tiny"], "fingerprint": "0" * 16}}
    assert sorted(preset_changes.differences(tampered)) == ["mat-tiny"]
    assert "demo" in preset_changes.differences({k: v for k, v in record.items() if k != "demo"})
    assert preset_changes.differences({**record, "gone-tiny": {"fingerprint": "x", "changed": "2026-01-01"}}) == {
        "gone-tiny": None}

    from multibranch import experiment

    loaded = experiment.load_preset_dict
    monkeypatch.setattr(experiment, "load_preset_dict",
                        lambda name, *seen: {**loaded(name, *seen), "description": "another text"})
    assert preset_changes.preset_fingerprint("mat-tiny") == record["mat-tiny"]["fingerprint"]
    monkeypatch.setattr(experiment, "load_preset_dict",
                        lambda name, *seen: {**loaded(name, *seen), "train": {"max_steps": 7}})
    assert preset_changes.preset_fingerprint("mat-tiny") != record["mat-tiny"]["fingerprint"]


def test_changed_after_compares_days():
    record = {"p": {"fingerprint": "x", "changed": "2026-11-25"}}
    assert preset_changes.changed_after("p", "2026-11-24", record) == "2026-11-25"
    assert preset_changes.changed_after("p", "2026-11-25", record) is None
    assert preset_changes.changed_after("p", "2026-12-01", record) is None
    assert preset_changes.changed_after("p", None, record) is None
    assert preset_changes.changed_after("not-a-preset", "2026-11-24", record) is None


def test_update_records_today_for_a_changed_preset_drops_a_deleted_one_and_keeps_the_rest(tmp_path, capsys):
    record = preset_changes.load_record()
    tampered = {**record, "mat-tiny": {"fingerprint": "0" * 16, "changed": "2000-01-01"},
                "gone-tiny": {"fingerprint": "x", "changed": "2000-01-01"}}
    path = tmp_path / "record.json"
    path.write_text(json.dumps({"presets": tampered}), encoding="utf-8")
    assert preset_changes.main(["--record", str(path)]) == 1
    assert "gone-tiny, mat-tiny" in capsys.readouterr().out and preset_changes.load_record(path) == tampered
    assert preset_changes.main(["--update", "--record", str(path)]) == 0
    today = datetime.date.today().isoformat()
    assert preset_changes.load_record(path) == {**record, "mat-tiny": {**record["mat-tiny"], "changed": today}}
    assert preset_changes.main(["--record", str(path)]) == 0
