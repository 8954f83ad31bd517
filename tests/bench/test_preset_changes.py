"""bench/preset_changes.json records the day each preset's definition last changed, which the benchmark pages
compare with the day a row was measured. The record must follow the presets: a preset changed without recording
the day would leave the rows measured before it unmarked."""

from __future__ import annotations

from bench import preset_changes
from multibranch.experiment import list_presets


def test_the_record_holds_every_preset_as_it_is_defined():
    record = preset_changes.load_record()
    assert sorted(record) == list_presets()
    changed = preset_changes.differences(record)
    assert not changed, (f"presets changed without a record: {', '.join(sorted(changed))}; run "
                         "`python bench/preset_changes.py --update` to record today's date")


def test_a_changed_definition_is_found_and_its_description_is_not_part_of_it(monkeypatch):
    record = preset_changes.load_record()
    tampered = {**record, "mat-tiny": {**record["mat-tiny"], "fingerprint": "0" * 16}}
    assert sorted(preset_changes.differences(tampered)) == ["mat-tiny"]
    assert "demo" in preset_changes.differences({k: v for k, v in record.items() if k != "demo"})

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
