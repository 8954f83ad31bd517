"""Citations inside the repository resolve: src/, bench/, docs/ and README.md never cite the team's design notes
(SEEDS-SPEC, not part of the repository) and every `docs/NAME.md` or `docs/NAME.md#anchor` they mention, and every
relative Markdown link of a docs page or the README (`[text](NAME.md#anchor)`, `[text](#anchor)`), names a page that
exists and, with an anchor, a heading of that page (GitHub's slug of the heading text)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SCANNED = ("src", "bench", "docs", "README.md")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}  # build caches, not sources

FORBIDDEN = re.compile(r"SEEDS[-_ ]SPEC", re.IGNORECASE)
CITATION = re.compile(r"(?<![\w/.-])docs/([\w.-]+\.md)(?:#([\w-]+))?")  # docs/NAME.md[#anchor] anywhere
MD_LINK = re.compile(r"\]\(([^)\s]*)\)")  # the target of a Markdown link
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=[\"']([^\"']+)[\"']", re.IGNORECASE)
FENCE = re.compile(r"^\s*(```|~~~)")


def scanned_files(root: Path = ROOT) -> list[Path]:
    """Every text file under the scanned folders (caches and egg-info left out) and the README."""
    files = []
    for name in SCANNED:
        top = root / name
        candidates = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for path in candidates:
            parts = path.relative_to(root).parts
            if not path.is_file() or any(p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts):
                continue
            data = path.read_bytes()
            if b"\0" in data:
                continue  # binary (images, compiled files)
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            files.append(path)
    return files


def slug(text: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, punctuation removed, spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_ markers, not snake_case
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown page: its headings' slugs (repeats get -1, -2, ...) and explicit <a id>s."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_citations(root: Path = ROOT) -> list[str]:
    """'path:line: problem' for every SEEDS-SPEC mention and every citation of a missing page or anchor."""
    docs = root / "docs"
    cache: dict[Path, set[str] | None] = {}

    def page_anchors(page: Path) -> set[str] | None:
        if page not in cache:
            cache[page] = anchors(page.read_text(encoding="utf-8")) if page.is_file() else None
        return cache[page]

    def check(page: Path, anchor: str | None, shown: str) -> str | None:
        found = page_anchors(page)
        if found is None:
            return f"cites {shown}: no such file"
        if anchor and anchor not in found:
            return f"cites {shown}: {page.relative_to(root).as_posix()} has no heading with anchor #{anchor}"
        return None

    problems = []
    for path in scanned_files(root):
        rel = path.relative_to(root).as_posix()
        markdown = path.suffix == ".md"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            where = f"{rel}:{number}"
            if FORBIDDEN.search(line):
                problems.append(f"{where}: mentions SEEDS-SPEC (design notes outside the repository); cite the "
                                "paper or docs/papers.md instead")
            for name, anchor in CITATION.findall(line):
                shown = f"docs/{name}" + (f"#{anchor}" if anchor else "")
                problem = check(docs / name, anchor or None, shown)
                if problem:
                    problems.append(f"{where}: {problem}")
            if not markdown:
                continue
            for target in MD_LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("/"):
                    continue  # a URL or an absolute path
                page_part, _, anchor = target.partition("#")
                if page_part and not page_part.endswith(".md"):
                    continue  # images, source files: not a docs citation
                page = (path.parent / page_part).resolve() if page_part else path
                if page_part and docs.resolve() not in page.parents and page != (root / "README.md").resolve():
                    continue  # a Markdown file outside docs/ (checked by the CITATION rule if cited so)
                problem = check(page, anchor or None, target)
                if problem:
                    problems.append(f"{where}: {problem}")
    return problems


def test_no_design_note_mentions_and_no_broken_docs_citations():
    assert broken_citations() == []


def test_papers_page_has_a_section_per_paper():
    found = anchors((DOCS / "papers.md").read_text(encoding="utf-8"))
    assert {"mat", "weighted-transformer", "mute", "muse", "scheduled-drophead"} <= found
    assert {"mat-drop-branch", "mat-merge-constant", "drophead-rate-schedules"} <= found


def test_slugs_follow_github():
    assert slug("MAT: drop-branch") == "mat-drop-branch"
    assert slug("Weighted Transformer: `ffn_mode` and κ/α") == "weighted-transformer-ffn_mode-and-κα"
    assert slug("Runs in parts, and resuming") == "runs-in-parts-and-resuming"
    assert slug("The [CPU kernels](x.md) of a *search* step") == "the-cpu-kernels-of-a-search-step"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n<a id=\"x\"></a>\n") == {"a", "a-1", "x"}


def test_the_check_catches_what_it_should(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "docs" / "papers.md").write_text("# Papers\n\n## MAT: drop-branch\n\nsee [here](#papers) "
                                                 "and [there](papers.md#nowhere)\n", encoding="utf-8")
    (tmp_path / "src" / "m.py").write_text(
        '"""x (docs/papers.md#mat-drop-branch), y (docs/papers.md#mat-merge),\nz (docs/missing.md), '
        'w (see SEEDS-SPEC §1.2)."""\n', encoding="utf-8")
    (tmp_path / "README.md").write_text("[papers](docs/papers.md) [ok](docs/papers.md#papers)\n", encoding="utf-8")
    assert broken_citations(tmp_path) == [
        "src/m.py:1: cites docs/papers.md#mat-merge: docs/papers.md has no heading with anchor #mat-merge",
        "src/m.py:2: mentions SEEDS-SPEC (design notes outside the repository); cite the paper or "
        "docs/papers.md instead",
        "src/m.py:2: cites docs/missing.md: no such file",
        "docs/papers.md:5: cites papers.md#nowhere: docs/papers.md has no heading with anchor #nowhere",
    ]
