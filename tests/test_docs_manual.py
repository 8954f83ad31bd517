"""The README and docs/ are a manual: they say what the toolkit does, not how it came to do it. What changed has
its home in CHANGELOG.md, and measurements live in the generated regions of the docs (docs/benchmarks.md's tables,
each with a footnote naming its command, date and machine; the regions docs/reproduction.md's report writes). So:

- outside CHANGELOG.md and the generated regions, the README and docs/ hold no provenance or history phrasing:
  no commit hashes, no "before/after the fix", no comparisons with older code ("now keeps", "as before", "the
  previous implementation", "today's ..."), no goals met or not, no /tmp or other machine paths;
- every docs page is linked from the README (and in mkdocs.yml's nav: tests/test_docs_site.py);
- src/, tests/, bench/ and docs/ cite no file that is not in the repository: no design notes kept elsewhere, no
  path under src/, tests/, bench/ or docs/ that does not exist (in Python files, their docstrings and comments;
  in Markdown and shell files, everything).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

HISTORY = {
    "a commit hash": re.compile(r"(?<![\w.#/-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])"),
    "a commit named": re.compile(r"\b(?:at|from|of) commit\b", re.I),
    "before/after a fix or a change": re.compile(
        r"\b(?:before|after)\s+(?:(?:the|this|that|these|those|its)\s+)?(?:fix|fixes|change|changes|rewrite|patch)\b"
        r"|\bcode\s+(?:before|after)\b|\b(?:measured|made|written|recorded)\s+before\s+(?:this|that|these|those)\b"
        r"|\b(?:before|after)\b[^.]{0,60}\bexisted\b", re.I),
    "what came before": re.compile(r"\bpredat(?:es?|ing)\b|\bas (?:it did )?before\b|\bsince then\b"
                                   r"|\bhad measured\b|\blast measured\b", re.I),
    "older code": re.compile(r"\b(?:previous|former|earlier|older|old)\b,?\s+(?:[\w`-]+\s+){0,2}"
                             r"(?:code|version|implementation|search|preset|rule|benchmark|behaviou?r|middleware)\b",
                             re.I),
    "'now' or 'today' against older code": re.compile(r"\bnow\b(?!\s*[:=]?\s*[-+\d.`'\"])|\btoday'?s?\b", re.I),
    "work not done yet": re.compile(
        r"\bnot\s+yet\s+(?:been\s+)?(?:measured|run|re-?run|profiled|tested)\b"
        r"|\b(?:measured|run|re-?run|profiled|tested)\b(?:\s+[\w-]+){0,4}\s+yet\b|\bnot\s+been\s+re-?run\b", re.I),
    "goals met or not": re.compile(r"\bgoals?\b|\bnot met\b|\bmet\?", re.I),
    "the page's own revision": re.compile(r"\bthis page was revised\b|\brevised on\b", re.I),
    "a machine path": re.compile(r"(?<![\w.~$-])/(?:tmp|work|home|root|Users|mnt|scratch|var/tmp)/"
                                 r"|\bteam(?:'s)? machines?\b"),
}

# the regions a script writes: docs/benchmarks.md's tables and docs/reproduction.md's report
GENERATED_START = re.compile(r"^<!-- (?:table: [\w-]+|(?P<name>[\w:-]+):start) -->\s*$")


def generated_end(start: re.Match) -> re.Pattern:
    name = start["name"]
    return re.compile(r"^<!-- /table -->\s*$" if name is None else rf"^<!-- {re.escape(name)}:end -->\s*$")


def manual_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of a Markdown page outside its generated regions."""
    kept, end = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        if end is not None:
            if end.match(line):
                end = None
            continue
        start = GENERATED_START.match(line)
        if start:
            end = generated_end(start)
            continue
        kept.append((number, line))
    assert end is None, "a generated region is not closed"
    return kept


def history_phrases(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, words) of every history or provenance phrase outside the generated regions."""
    return [(number, kind, match.group(0)) for number, line in manual_lines(text)
            for kind, pattern in HISTORY.items() for match in pattern.finditer(line)]


def manual_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_the_patterns_catch_history_and_spare_present_tense_prose():
    caught = [
        "(commit 59861df; CPU x86_64)", "on the code before the fixes (90795b7) and after them (df18172)",
        "The PoV numbers were measured before this rule", "the table was made before that change", "`bench/analysis_multi30k.py` now keeps the two apart",
        "an update is now one graph per batch", "These rows predate the fixed-shape search", "run at commit f5f694c",
        "Goal MUTE step ≤ 1.5×: not met (1.78×)", "| goal | measured | met? |", "in `/tmp/serve-runs`",
        "--ckpt /work/runs/m30k/best.pt", "the previous, host-bound implementation", "as the AMD EPYC this page was "
        "revised on does", "loads and trains as before", "Since then: 26 of 26 runs passed", "has not been re-run",
        "not yet measured on a GPU", "has not been measured on a GPU yet", "when last measured",
        "20× the 269 ms of the earlier 25-update benchmark", "today's batches", "(before the third phase existed)",
        "the former `sst2-tiny` preset", "on the team machines `../shared/data`", "an earlier run had measured 9.4×",
    ]
    spared = [
        "`train.lr.lr: run has 0.001, now 0.002`", "every command checks its inputs before it touches the disk",
        "a before/after report (`--report`)", "the previous output stays whole", "the attention masks the positions "
        "not yet decoded", "requests not answered yet", "its earlier id stays taken", "sha256 of every file",
        "colour #1f77b4 and 1234567 pairs", "a checkpoint save under way finishing first", "The GPU then no longer "
        "waits for Python", "`runs/m30k/data`, `~/.cache/torch_extensions`", "16k tokens were not measured",
        "masking before the output bias", "the model's own translation", "goalkeeper", "metric",
        "its analyses made before the machine is gone",
    ]
    assert [t for t in caught if not history_phrases(t)] == []
    assert [(t, history_phrases(t)) for t in spared if history_phrases(t)] == []


def test_generated_regions_are_left_out():
    text = ("a\n<!-- table: x -->\n(commit abc1234)\n<!-- /table -->\nb\n"
            "<!-- reproduce-report:cpu:start -->\nnot yet measured\n<!-- reproduce-report:cpu:end -->\nc now keeps\n")
    assert [(n, line) for n, line in manual_lines(text)] == [(1, "a"), (5, "b"), (9, "c now keeps")]
    assert history_phrases(text) == [(9, "'now' or 'today' against older code", "now")]


def test_readme_and_docs_describe_the_toolkit_as_it_is():
    found = [f"{page.relative_to(ROOT)}:{number}: {kind}: {words!r}" for page in manual_pages()
             for number, kind, words in history_phrases(page.read_text(encoding="utf-8"))]
    assert not found, ("history or provenance outside CHANGELOG.md and the generated regions (say what the "
                       "toolkit does; history goes to CHANGELOG.md):\n" + "\n".join(found))


def test_a_changelog_holds_the_history():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "keepachangelog.com" in text
    versions = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)[1]
    assert version in versions, f"CHANGELOG.md has no section for the package's version {version}"


def test_the_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(docs/([\w/.-]+\.md)(?:#[^)]*)?\)", readme))
    pages = {page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md")}
    assert sorted(pages - linked) == [], "docs pages the README does not link"


# --- citations of files: every path under src/, tests/, bench/ or docs/ that a source or page names exists ---

SCANNED = ("src", "tests", "bench", "docs", "README.md", "CHANGELOG.md")
SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cpp", ".h", ".html", ".js", ".css"}
DESIGN_NOTES = re.compile(r"SEEDS[-_ ]SPEC", re.I)
# the files whose subject is this rule: they name the notes they keep out, and cite made-up files to test it
ABOUT_CITATIONS = {"tests/test_docs_citations.py", "tests/test_docs_manual.py"}
PATH = re.compile(r"(?<![\w./~$-])((?:src|tests|bench|docs)/[\w./{},*<>-]*[\w*}>])")
PLACEHOLDER = re.compile(r"[<>{}*]|[A-Z]{3,}|(?<![A-Za-z])[A-Z](?![A-Za-z])")  # docs/NAME.md, <name>.json, a*.json


def prose(path: Path) -> str:
    """What a file says to its readers: a Python file's docstrings and comments (its other strings are data,
    often made-up paths in tests), every line of any other text file."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return python_prose(text) if path.suffix == ".py" else text


# docstrings are triple-quoted here, comments start at a "#" (a "#" inside a string is read as one too: harmless)
PYTHON_PROSE = re.compile(r'"""(.*?)"""|#([^\n]*)', re.S)


def python_prose(source: str) -> str:
    """The docstrings and the comments of Python source (parsing every file would cost seconds)."""
    return "\n".join(doc or comment for doc, comment in PYTHON_PROSE.findall(source))


def cited_paths(text: str) -> list[str]:
    """Paths under src/, tests/, bench/ or docs/ that name a file (with a suffix), placeholders and globs left
    out; results files are outputs the scripts write (docs/benchmarks.md's test checks the ones it cites)."""
    found = []
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if PLACEHOLDER.search(path) or path.startswith("bench/results/") or not re.search(r"\.\w+$", path):
            continue
        found.append(path)
    return found


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        top = ROOT / name
        candidates = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        files += [path for path in candidates if path.is_file() and path.suffix in SUFFIXES
                  and not any(part in {"__pycache__", "results"} or part.endswith(".egg-info")
                              for part in path.relative_to(ROOT).parts)]
    return files


def test_citations_name_files_of_the_repository():
    problems = []
    for path in scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel in ABOUT_CITATIONS:
            continue
        text = prose(path)
        if DESIGN_NOTES.search(text):
            problems.append(f"{rel}: cites design notes that are not in the repository (cite docs/papers.md)")
        problems += [f"{rel}: cites {cited}, which is not in the repository" for cited in cited_paths(text)
                     if not (ROOT / cited).exists()]
    assert problems == []


def test_citation_scan_reads_docstrings_and_comments_and_skips_placeholders():
    source = ('"""Module (see tests/core/test_gone.py)."""\nPATH = "tests/fake/data.txt"  # cf. bench/missing.py\n'
              'def f():\n    """As in docs/papers.md."""\n    return "src/x.py"\n')
    assert cited_paths(python_prose(source)) == ["tests/core/test_gone.py", "bench/missing.py", "docs/papers.md"]
    assert cited_paths("bench/results/NAME.json docs/NAME.md bench/<name>.py tests/*/test_x.py src/tgt pairs "
                       "docs/images/reproduction/ bench/results/x.json") == []
