"""The test suite's own layout, checked statically: test modules sit in folders that mirror the packages
(plus cli/, integration/, core/ for the top-level modules and bench/ for the bench scripts), no test module
or conftest.py imports a test module or a conftest.py (shared fixtures live in conftest.py files, shared
plain helpers in tests/helpers/), and no test folder is a package (pytest runs in importlib mode; an
__init__.py in tests/bench/ would make its modules `bench.*` and hide the real bench package)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "multibranch"

ROOT_MODULES = {"test_layering.py", "test_test_layout.py", "test_architecture_examples.py",
                "test_no_work_log_words.py", "test_docs_citations.py",
                "test_docs_site.py", "test_docs_manual.py"}  # about the whole tree, so at the root
EXTRA_FOLDERS = {"cli", "integration", "core", "bench"}  # folders that mirror no package
HELPERS = "helpers"  # the one support package: plain helpers, no tests, no fixtures


def _python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _test_modules(root: Path) -> list[Path]:
    return [p for p in _python_files(root) if p.name.startswith("test_") or p.name.endswith("_test.py")]


def misplaced_modules(root: Path, src: Path) -> list[str]:
    """Test modules at the root (outside the allowed list), in tests/helpers/, or in a folder that mirrors
    no package of src/multibranch and is none of the extra folders."""
    problems = []
    for path in _test_modules(root):
        rel = path.relative_to(root)
        folder = rel.parent
        if folder == Path("."):
            if rel.name not in ROOT_MODULES:
                problems.append(f"{rel}: a test module at the root of tests/ (put it in the folder of its package)")
        elif folder.parts[0] == HELPERS:
            problems.append(f"{rel}: a test module in tests/{HELPERS}/ (helpers only)")
        elif folder.parts[0] not in EXTRA_FOLDERS and not (src / folder).is_dir():
            problems.append(f"{rel}: tests/{folder.as_posix()}/ mirrors no package of src/multibranch")
    return problems


def packaged_folders(root: Path) -> list[str]:
    """__init__.py files anywhere under tests/ but tests/helpers/."""
    return [str(p.relative_to(root)) for p in root.rglob("__init__.py")
            if p.relative_to(root).parts[0] != HELPERS]


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every import, module- or function-level; `from M import a` gives M.a
    (a leading dot for a relative import)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            names += [(node.lineno, module + ("" if module.endswith(".") else ".") + alias.name)
                      for alias in node.names]
    return names


def forbidden_imports(root: Path) -> list[str]:
    """Imports of a test module or a conftest.py by any name (`test_x`, `tests.test_x`, `conftest`,
    `tests.conftest`, a relative import), or of anything under tests/ but tests/helpers/."""
    local = {p.stem for p in _python_files(root) if p.relative_to(root).parts[0] != HELPERS}
    problems = []
    for path in _python_files(root):
        for line, name in _imported(ast.parse(path.read_text(encoding="utf-8"))):
            parts = name.split(".")
            if (name.startswith(".") or parts[0] in local
                    or (parts[0] == "tests" and (len(parts) < 3 or parts[1] != HELPERS))):
                problems.append(f"{path.relative_to(root)}:{line}: imports {name}")
    return sorted(problems)


def test_every_test_module_sits_in_the_folder_of_its_package():
    assert misplaced_modules(TESTS, SRC) == []


def test_no_test_folder_is_a_package():
    assert packaged_folders(TESTS) == []


def test_no_test_module_imports_another_test_module_or_a_conftest():
    assert forbidden_imports(TESTS) == []


def test_the_checks_catch_the_flat_layout(tmp_path):
    """The old layout: modules at the root, a test module importing another by its bare name and through
    tests., fixtures and helpers imported from conftest, a helper file beside the tests."""
    root = tmp_path / "tests"
    (root / "serve").mkdir(parents=True)
    (root / "nowhere").mkdir()
    (root / "bench").mkdir()
    (root / "bench" / "__init__.py").write_text("")
    (root / "conftest.py").write_text("def tiny_model_dict():\n    return {}\n")
    (root / "hf_bert_helpers.py").write_text("")
    (root / "test_translator.py").write_text("def _corpus():\n    pass\n")
    (root / "nowhere" / "test_x.py").write_text("")
    (root / "serve" / "test_serve.py").write_text(
        "from test_translator import _corpus\nfrom tests.conftest import tiny_model_dict\n"
        "from hf_bert_helpers import bert_dir\nfrom tests.helpers.serve import run\n")
    (root / "serve" / "test_page.py").write_text(
        "def test_a():\n    from tests.test_translator import _corpus\n    from conftest import x\n"
        "    from . import test_serve\n    import tests.serve.test_serve\n")
    assert misplaced_modules(root, SRC) == [
        "nowhere/test_x.py: tests/nowhere/ mirrors no package of src/multibranch",
        "test_translator.py: a test module at the root of tests/ (put it in the folder of its package)"]
    assert packaged_folders(root) == ["bench/__init__.py"]
    assert forbidden_imports(root) == [
        "serve/test_page.py:2: imports tests.test_translator._corpus",
        "serve/test_page.py:3: imports conftest.x",
        "serve/test_page.py:4: imports .test_serve",
        "serve/test_page.py:5: imports tests.serve.test_serve",
        "serve/test_serve.py:1: imports test_translator._corpus",
        "serve/test_serve.py:2: imports tests.conftest.tiny_model_dict",
        "serve/test_serve.py:3: imports hf_bert_helpers.bert_dir",
    ]
