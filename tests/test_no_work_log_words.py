"""The docs, the README, the package, the bench scripts and the tests describe the toolkit for its users, not the work
that made it: no work-item references ("issue 21", "issue #8", "#25", "work item", "this PR") and no
work-log narration ("stop 3", "this stop", "round three", "session"). bench/results/*.json are exempt: they
are records the benchmarks wrote, not prose."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [ROOT / "docs", ROOT / "README.md", ROOT / "src", ROOT / "bench", ROOT / "tests"]
EXEMPT = [ROOT / "bench" / "results", Path(__file__).resolve()]  # (this file lists the words)
TESTS = ROOT / "tests"  # where "session" is pytest's fixture scope and "#0" a test's label: work-item words only
SUFFIXES = {".md", ".py", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ".cpp", ".h", ".hpp", ".c",
            ".html", ".js", ".css", ".pyi"}

PATTERNS = [
    re.compile(r"\bissues?\s+#?\d+", re.I),                        # issue 21, issue #8, issues 10 and 22
    re.compile(r"(?<![\w&\"'/#])#\d{1,2}(?![\w-])"),             # #25 (not "#1 String", &#39;, colours)
    re.compile(r"\bwork[- ]items?\b", re.I),
    re.compile(r"\bthis PR\b"),
    re.compile(r"\bstops?\s+\d+\b", re.I),                          # stop 3
    re.compile(r"\b(this|that|next|previous|earlier|later|same|paper-scale)\s+stop\b", re.I),
    re.compile(r"\b(at the (start|end) of|during|in) the stop\b", re.I),
    re.compile(r"\bround\s+(one|two|three|four|five|six|seven|eight|nine|ten)\b", re.I),
    re.compile(r"\bsessions?\b", re.I),
]


def scanned_files() -> list[Path]:
    files = []
    for root in SCANNED:
        candidates = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in candidates:
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts \
                    and not any(path.is_relative_to(exempt) for exempt in EXEMPT):
                files.append(path)
    return files


WORK_ITEM_PATTERNS = [PATTERNS[0], *PATTERNS[2:8]]  # all but "#25" and "session"


def work_log_words(text: str, patterns: list[re.Pattern] = PATTERNS) -> list[tuple[int, str]]:
    """(line number, matched words) for every work-item or work-log phrase in a text."""
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        hits += [(number, match.group(0)) for pattern in patterns for match in pattern.finditer(line)]
    return hits


def test_the_patterns_catch_work_log_words_and_spare_ordinary_ones():
    caught = ["Goals of issue 22 item 6", "issue #8 puts it", "the fixes (#25)", "a work item", "as in this PR",
              "at stop 3", "after this stop's kernels", "at the end of the stop", "round three", "this session"]
    spared = ['--text-column "#1 String"', "&#39;", "color: #333", "stop tokens", "the stop signal", "round 2",
              "issues a warning", "SIGTERM stops it", "in this process"]
    assert all(work_log_words(text) for text in caught), [t for t in caught if not work_log_words(t)]
    assert not any(work_log_words(text) for text in spared), [t for t in spared if work_log_words(t)]


def test_no_work_log_words_in_docs_readme_src_bench_and_tests():
    found = [f"{path.relative_to(ROOT)}:{number}: {words!r}" for path in scanned_files()
             for number, words in work_log_words(path.read_text(errors="replace"),
                                                 WORK_ITEM_PATTERNS if path.is_relative_to(TESTS) else PATTERNS)]
    assert not found, "work-item or work-log words (describe the toolkit instead):\n" + "\n".join(found)


NAME_PATTERN = re.compile(r"(^|_)(round|stop|issue|session|iteration)_?\d+($|[_.])", re.I)


def test_file_names_tell_what_they_hold_not_when_they_were_written():
    assert NAME_PATTERN.search("test_bad_input_round3.py") and NAME_PATTERN.search("issue_12_checks.py")
    assert not NAME_PATTERN.search("test_refused_before_disk.py") and not NAME_PATTERN.search("rounding_2.py")
    found = [str(path.relative_to(ROOT)) for path in scanned_files() if NAME_PATTERN.search(path.name)]
    assert not found, "file names that record the work rather than the content:\n" + "\n".join(found)
