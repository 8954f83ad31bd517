"""The date each preset's definition last changed, so that the benchmark pages mark rows measured before it.

A benchmark row that names a preset (`mat-tiny`, `sst2-minilm`, ...) is read as that preset's number. When the
preset's definition changes later (its width, a rate, a batch size), the row still holds what was measured then;
`bench/report.py` marks it, by comparing the date its results file records with the date here.

    python bench/preset_changes.py            # list the presets whose definition differs from the record
    python bench/preset_changes.py --update   # record today's date for each of them (and for new presets; drop
                                              # the ones that no longer exist)

A preset's definition is its YAML file with its `base` chain merged, its description left out. The package's defaults
(the config fields a preset does not set) are not part of it: a change to a default marks no row. tests/bench/test_preset_changes.py fails while the record and the
presets disagree, so a change to a preset is recorded on the day it is made. Dates have a day's resolution: a row
recorded on the day of a change counts as measured after it; a definition that returns to an earlier one counts
as a change (rows of the earlier days are marked, though they measured the same definition).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RECORD = Path(__file__).resolve().parent / "preset_changes.json"


def preset_fingerprint(name: str) -> str:
    """A short hash of preset `name`'s merged definition, description left out."""
    from multibranch.experiment import load_preset_dict

    definition = load_preset_dict(name)
    definition.pop("description", None)
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:16]


def load_record(path: Path = RECORD) -> dict[str, dict[str, str]]:
    """{preset: {"fingerprint", "changed"}} as recorded."""
    return json.loads(path.read_text(encoding="utf-8"))["presets"]


def changed_after(preset: str, measured: str | None, record: dict[str, dict[str, str]] | None = None) -> str | None:
    """The date `preset`'s definition changed when that is after `measured` (an ISO date); None when the row is
    current, when it names no preset, or when its results file records no date."""
    entry = (load_record() if record is None else record).get(preset)
    if entry is None or not measured:
        return None
    return entry["changed"] if measured < entry["changed"] else None


def differences(record: dict[str, dict[str, str]]) -> dict[str, str | None]:
    """{preset: its fingerprint} for every preset whose definition is not the recorded one (new ones included),
    and {name: None} for every recorded preset that no longer exists."""
    from multibranch.experiment import list_presets

    current = {name: preset_fingerprint(name) for name in list_presets()}
    changed: dict[str, str | None] = {name: fingerprint for name, fingerprint in current.items()
                                      if record.get(name, {}).get("fingerprint") != fingerprint}
    return {**changed, **{name: None for name in record if name not in current}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true",
                        help="record today's date for every changed or new preset, and drop the deleted ones")
    parser.add_argument("--record", type=Path, default=RECORD, help="the record to check or update")
    args = parser.parse_args(argv)
    record = load_record(args.record)
    changed = differences(record)
    if not changed:
        print("every preset is as recorded")
        return 0
    if not args.update:
        print("changed since the record: " + ", ".join(sorted(changed)) + " (record them with --update)")
        return 1
    today = datetime.date.today().isoformat()
    for name, fingerprint in changed.items():
        if fingerprint is None:
            del record[name]  # the preset is gone: no row can be read as its own
        else:
            record[name] = {"fingerprint": fingerprint, "changed": today}
    from multibranch.atomic import atomic_write_text

    atomic_write_text(args.record, json.dumps({"presets": dict(sorted(record.items()))}, indent=1) + "\n")
    print(f"recorded {today} for " + ", ".join(sorted(changed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
