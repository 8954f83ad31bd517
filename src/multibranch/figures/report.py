"""A report folder: JSON (the numbers), PNG plots and an index.md linking them, every file written atomically.

    folder = ReportFolder.create("reports/heads", force=False)   # refuses a non-empty folder
    folder.write_json("heads.json", data)
    folder.write_png("importance.png", figure)
    folder.write_index("Head analysis", sections)
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from multibranch.atomic import atomic_write_bytes, atomic_write_text
from multibranch.data.directories import REPORT, REPORT_DATA, REPORT_INDEX, directory_kind, refuse_other_kind


class ReportFolder:
    """An output directory of one analysis; `files` lists what was written, in order."""

    def __init__(self, path: Path, among_other_files: bool = False, declared: tuple[str, ...] = ()):
        self.path = path
        self.files: list[str] = []
        self.among_other_files = among_other_files  # written into a folder of other files: adds, never replaces
        self.declared = declared  # the names (fnmatch patterns) `check` was given; () = not declared

    @staticmethod
    def check(path: str | Path, force: bool, files: Iterable[str] = ()) -> Path:
        """FileExistsError if `path` is a non-empty directory and not `force`; NotADirectoryError-like
        FileExistsError if it is a file. `files`: the names (or fnmatch patterns) the report writes; in a folder
        of other files, one of them already there is refused now, before the report is computed. Touches
        nothing."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise FileExistsError(f"{path} exists and is not a directory")
        refuse_other_kind(path, REPORT)
        if path.is_dir() and any(path.iterdir()) and not force:
            raise FileExistsError(f"{path} is not empty; pass --force to write the report into it")
        if directory_kind(path) is None and (path / REPORT_INDEX).exists():  # a folder of other files: added to only
            raise FileExistsError(f"{path} holds an {REPORT_INDEX} that no report wrote, which the report's would "
                                  "replace; write the report into another folder")
        if holds_other_files(path):
            taken = sorted(p.name for p in path.iterdir() if any(fnmatch(p.name, pattern) for pattern in files))
            if taken:
                raise FileExistsError(f"{path / taken[0]} exists in a folder of other files, and the report does not "
                                      "replace it; write the report into another folder")
        return path

    @classmethod
    def create(cls, path: str | Path, force: bool = False, files: Iterable[str] = ()) -> ReportFolder:
        """Check (as `check`) and make the folder; with `files`, writing any other name than those and
        index.md is a programming error (ValueError), so that `check` is told every name the report writes."""
        files = tuple(files)
        path = cls.check(path, force, files)
        among_other_files = holds_other_files(path)
        path.mkdir(parents=True, exist_ok=True)
        return cls(path, among_other_files, files)

    def _free(self, name: str) -> None:
        """FileExistsError before a file of a folder of other files would be replaced (a report's own files, or
        the files of a report folder, are rewritten)."""
        if self.declared and not any(fnmatch(name, pattern) for pattern in (*self.declared, REPORT_INDEX)):
            raise ValueError(f"{name}: not among the files this report declared ({', '.join(self.declared)})")
        if self.among_other_files and name not in self.files and (self.path / name).exists():
            for written in self.files:  # the folder as it was: this report's files so far go
                (self.path / written).unlink(missing_ok=True)
            raise FileExistsError(f"{self.path / name} exists in a folder of other files, and the report does not "
                                  "replace it; write the report into another folder")

    def write_json(self, name: str, data: Any) -> Path:
        self._free(name)
        atomic_write_text(self.path / name, json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
        return self._written(name)

    def write_text(self, name: str, text: str) -> Path:
        self._free(name)
        atomic_write_text(self.path / name, text)
        return self._written(name)

    def write_png(self, name: str, figure: Any) -> Path:
        """Save a matplotlib figure as PNG (and close it)."""
        import matplotlib.pyplot as plt

        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        plt.close(figure)
        self._free(name)
        atomic_write_bytes(self.path / name, buffer.getvalue())
        return self._written(name)

    def _written(self, name: str) -> Path:
        if name not in self.files:
            self.files.append(name)
        return self.path / name


def holds_other_files(path: Path) -> bool:
    """Whether `path` is a non-empty folder of other files: neither a report nor one cut short before its
    index.md (which holds a report's numbers)."""
    return path.is_dir() and any(path.iterdir()) and directory_kind(path) is None \
        and not any((path / name).is_file() for name in REPORT_DATA)
