"""Atomic writes: all-or-nothing, ordinary file modes, stale temporaries found and removed."""

from __future__ import annotations

import os
import stat

import pytest

from multibranch.atomic import atomic_write, atomic_write_text, remove_stale_temporaries, stale_temporaries


def test_success_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n"
    assert stale_temporaries(tmp_path) == []


def test_failure_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(target, "w", encoding="utf-8") as handle:
            handle.write("half")
            raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]


def test_new_files_get_the_umask_mode_and_old_files_keep_theirs(tmp_path):
    old_mask = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.bin"
        atomic_write_text(fresh, "x")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644  # not mkstemp's 0o600
        kept = tmp_path / "kept.bin"
        kept.write_text("y")
        kept.chmod(0o640)
        atomic_write_text(kept, "z")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    finally:
        os.umask(old_mask)


def test_stale_temporaries_are_found_and_removed_but_nothing_else(tmp_path):
    (tmp_path / ".last.pt.abc123.tmp").write_bytes(b"partial")
    (tmp_path / "last.pt").write_bytes(b"complete")
    (tmp_path / "notes.tmp").write_bytes(b"a user's file, not ours (no leading dot)")
    assert [p.name for p in stale_temporaries(tmp_path)] == [".last.pt.abc123.tmp"]
    removed = remove_stale_temporaries(tmp_path)
    assert [p.name for p in removed] == [".last.pt.abc123.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "notes.tmp"]


def test_read_modes_are_refused(tmp_path):
    with pytest.raises(ValueError):
        with atomic_write(tmp_path / "x", "r"):
            pass


def test_atomic_directory_replaces_only_when_complete(tmp_path):
    from multibranch.atomic import atomic_directory

    out = tmp_path / "data"
    with atomic_directory(out) as tmp:
        (tmp / "a.txt").write_text("first")
    assert (out / "a.txt").read_text() == "first"
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~_umask()  # mkdir's mode, not mkdtemp's 0o700

    with pytest.raises(RuntimeError):
        with atomic_directory(out) as tmp:
            (tmp / "a.txt").write_text("half-built")
            raise RuntimeError("failed while building")
    assert (out / "a.txt").read_text() == "first"  # the old directory is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no temporary left

    with atomic_directory(out) as tmp:
        (tmp / "b.txt").write_text("second")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]  # replaced whole, not merged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
