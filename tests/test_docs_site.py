"""The documentation site's config (mkdocs.yml) covers the docs: every docs/*.md page is in its nav (a new
page cannot be forgotten), every nav entry names a page that exists, and CI builds the site with the README's
command. Needs only PyYAML, not mkdocs: `mkdocs build --strict` itself runs in .ci/run."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DOCS_BUILD = 'pip install -e ".[docs]" && mkdocs build --strict'


class _ConfigLoader(yaml.SafeLoader):
    """A safe loader that reads MkDocs' Python tags (`!!python/name:...`, `!!python/object/apply:...`) as
    plain values instead of importing anything."""


def _python_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> object:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node) or suffix  # !!python/name:X carries X in the tag


_ConfigLoader.add_multi_constructor("tag:yaml.org,2002:python/", _python_tag)
_ConfigLoader.add_multi_constructor("!", _python_tag)  # e.g. !ENV


def load_config(path: Path = ROOT / "mkdocs.yml") -> dict:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_ConfigLoader)


def nav_pages(nav: object) -> list[str]:
    """Every page path of a MkDocs nav (strings, `{title: page}` and `{section: [...]}` entries, nested);
    external links (a URL) left out."""
    pages: list[str] = []
    if isinstance(nav, str):
        if "://" not in nav:
            pages.append(nav)
    elif isinstance(nav, list):
        for item in nav:
            pages += nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            pages += nav_pages(value)
    return pages


def test_every_docs_page_is_in_the_nav():
    config = load_config()
    assert config.get("docs_dir", "docs") == "docs"
    in_nav = set(nav_pages(config["nav"]))
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    missing = sorted(pages - in_nav)
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {missing}"


def test_every_nav_entry_is_a_page_once():
    pages = nav_pages(load_config()["nav"])
    assert [page for page in pages if not (DOCS / page).is_file()] == []
    assert len(pages) == len(set(pages)), "a page appears twice in the nav"
    assert pages[0] == "index.md"
    assert "reference.md" in pages


def test_the_reference_page_documents_the_public_surface():
    text = (DOCS / "reference.md").read_text(encoding="utf-8")
    for target in ("multibranch.api.load", "multibranch.api.Model", "multibranch.api.fit", "multibranch.api.prepare",
                   "multibranch.api.presets", "multibranch.experiment.ExperimentConfig", "multibranch.errors.UserError",
                   "multibranch.layers"):
        assert f"::: {target}\n" in text, target


def test_ci_builds_the_docs_with_the_readme_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert any(line.strip().startswith(DOCS_BUILD) for line in readme.splitlines())
    assert DOCS_BUILD in ci_lines
    assert 'pip install -e ".[docs]" && mkdocs serve' in readme
    assert "site/" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()


def test_nav_pages_reads_nested_sections():
    nav = ["index.md", {"Tutorials": [{"A": "a.md"}, "b.md", {"Deeper": [{"C": "sub/c.md"}]}]},
           {"GitHub": "https://github.com/x/y"}]
    assert nav_pages(nav) == ["index.md", "a.md", "b.md", "sub/c.md"]


def test_the_loader_reads_python_tags_without_importing():
    text = "toc:\n  slugify: !!python/object/apply:pymdownx.slugs.slugify\n    kwds:\n      case: lower\n" \
           "emoji: !!python/name:material.extensions.emoji.twemoji\n"
    assert yaml.load(text, Loader=_ConfigLoader) == {
        "toc": {"slugify": {"kwds": {"case": "lower"}}}, "emoji": "name:material.extensions.emoji.twemoji"}
