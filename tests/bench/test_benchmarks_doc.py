"""docs/benchmarks.md holds every table between `<!-- table: NAME -->` and `<!-- /table -->`; each must be exactly
what `python bench/report.py --doc-table NAME` prints from bench/results/*.json now, so a number on the page cannot
drift from its results file (regenerate with `python bench/report.py --update-doc docs/benchmarks.md`). Under each
table a generated footnote names its results files with their command, date and machine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report

ROOT = Path(report.__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"


def test_every_doc_table_has_markers_and_every_marker_a_table():
    text = DOC.read_text()
    in_doc = report.doc_markers(text)
    assert sorted(in_doc) == sorted(report.DOC_TABLES)
    assert text.count("<!-- table:") == text.count("<!-- /table -->") == len(report.DOC_TABLES)


@pytest.mark.parametrize("name", sorted(report.DOC_TABLES))
def test_doc_table_is_what_report_prints(name):
    in_doc = report.doc_markers(DOC.read_text())[name]
    assert in_doc == report.doc_table(name), (
        f"docs/benchmarks.md's table {name!r} differs from its results files: "
        "run `python bench/report.py --update-doc docs/benchmarks.md`")


def test_doc_tables_name_only_results_files_that_exist():
    text = DOC.read_text()
    for name in re.findall(r"bench/results/([\w.-]+)\.json", text):
        assert (ROOT / "bench" / "results" / f"{name}.json").is_file(), name


def test_the_command_line_prints_the_same_tables():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--doc-tables"], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    assert report.doc_markers(out) == {name: report.doc_table(name) for name in report.DOC_TABLES}


def test_update_doc_rewrites_a_stale_table(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("before\n\n<!-- table: serve-load -->\n| stale | 1.00x |\n<!-- /table -->\n\nafter\n")
    report.update_doc(doc)
    text = doc.read_text()
    assert report.doc_markers(text) == {"serve-load": report.doc_table("serve-load")}
    assert text.startswith("before\n\n") and text.endswith("\n\nafter\n") and "stale" not in text


@pytest.mark.parametrize("name", sorted(report.DOC_TABLES))
def test_every_table_ends_with_a_footnote_of_dated_sources(name):
    lines = report.doc_table(name).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Source"))
    assert all(not line.startswith("|") for line in lines[start:]), "the footnote comes after the tables"
    entries = [line for line in lines[start:] if line.startswith("- `bench/results/")]
    assert entries
    for entry in entries:
        results = re.match(r"- `bench/results/([\w.-]+)\.json`: `[^`]+`; (\d{4}-\d{2}-\d{2}), ", entry)
        assert results, entry
        assert results[2] == report.load(results[1])["environment"]["date"]
    assert "commit" not in "\n".join(lines[start:])


def test_portable_shows_machine_paths_as_a_checkout_has_them():
    assert report.portable("x.py --ckpt /work/runs/m30k/t/best.pt --src /home/u/runs/d/test.txt --threads 2") == (
        "x.py --ckpt runs/m30k/t/best.pt --src runs/d/test.txt --threads 2")
    assert report.portable("x.py --dir /tmp/pscale --out /var/tmp/o") == "x.py --dir $TMPDIR/pscale --out $TMPDIR/o"
    unchanged = "x.py --ckpt runs/bench/a.pt --set train.x=1 --src .gpu/data/test.src.txt --url http://h/tmp/"
    assert report.portable(unchanged) == unchanged


def test_a_row_measured_before_its_preset_changed_is_marked_and_named_under_the_table():
    changed = report.changed_after("mat-tiny", "2000-01-01")
    assert changed is not None  # every preset was defined after that day
    marks: list[str] = []
    assert report.system_cell("mat-tiny", "2000-01-01", marks) == "mat-tiny †"
    assert report.system_cell("mat-tiny", changed, marks) == "mat-tiny"  # measured on the day of the change
    assert report.system_cell("mat-tiny", None, marks) == "mat-tiny"  # a file without a date: no claim either way
    assert report.system_cell("hf-marian", "2000-01-01", marks) == "hf-marian"  # not a preset
    assert report.notes(marks + marks) == ["", "† measured before the preset's definition changed "
                                           f"(bench/preset_changes.json): mat-tiny (measured 2000-01-01, changed "
                                           f"{changed}); such a row holds the numbers of the definition it measured."]
    assert report.notes([]) == []
