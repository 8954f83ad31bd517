"""The package's layering, checked statically: every import (module- or function-level) of every
module under src/multibranch is parsed with `ast` and checked against the rules below."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "multibranch"

# (importing package, forbidden packages): "multibranch.modules" may not import "multibranch.train", ...
RULES = [
    ("modules", ("train", "convert", "commands", "inference")),
    ("checkpoint", ("train", "convert", "commands")),
    ("data", ("train", "convert", "models")),
]
COMMANDS_ALLOWED = {"multibranch.cli"}  # the only module outside commands/ that may import it


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, list[str]]]:
    """Every import statement in `tree` (at any depth): its line and the absolute names it reaches,
    `from x import y` giving [x, x.y] (y may be a submodule)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, [alias.name]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the importing module's package
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, [target, *(f"{target}.{alias.name}" for alias in node.names)]))
    return found


def rule_broken(module: str, target: str) -> str | None:
    """Why `module` may not import `target`, or None."""
    for owner, forbidden in RULES:
        if inside(module, f"{PACKAGE}.{owner}"):
            for bad in forbidden:
                if inside(target, f"{PACKAGE}.{bad}"):
                    return f"{owner}/ must not import {bad}/"
    if inside(target, f"{PACKAGE}.commands") and not inside(module, f"{PACKAGE}.commands") \
            and module not in COMMANDS_ALLOWED:
        return "only cli.py may import commands/"
    return None


def inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(src: Path = SRC) -> list[str]:
    """One line per offending import: importing module, line, imported module, broken rule."""
    lines = []
    for path in sorted((src / PACKAGE).rglob("*.py")):
        module = module_name(path, src)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for lineno, names in imports(tree, module, path.name == "__init__.py"):
            for target in names:
                why = rule_broken(module, target)
                if why:
                    lines.append(f"{module} (line {lineno}) imports {target}: {why}")
                    break
    return lines


def test_package_layering():
    problems = violations()
    assert not problems, "layering violations:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        ("modules/foo.py", "def f():\n    from multibranch.train.hooks import X\n",
         "multibranch.modules.foo (line 2) imports multibranch.train.hooks: modules/ must not import train/"),
        ("modules/foo.py", "from ..inference import translator\n",
         "multibranch.modules.foo (line 1) imports multibranch.inference: modules/ must not import inference/"),
        ("checkpoint/foo.py", "import multibranch.convert.payload\n",
         "multibranch.checkpoint.foo (line 1) imports multibranch.convert.payload: "
         "checkpoint/ must not import convert/"),
        ("data/foo.py", "from multibranch import models\n",
         "multibranch.data.foo (line 1) imports multibranch.models: data/ must not import models/"),
        ("convert/foo.py", "from multibranch.commands.train import run\n",
         "multibranch.convert.foo (line 1) imports multibranch.commands.train: only cli.py may import commands/"),
    ],
)
def test_checker_names_the_offending_module_and_import(tmp_path, path, source, expected):
    file = tmp_path / PACKAGE / path
    file.parent.mkdir(parents=True)
    file.write_text(source)
    assert expected in violations(tmp_path)


def test_checker_accepts_allowed_imports(tmp_path):
    for path, source in [("cli.py", "from multibranch.commands import train\n"),
                         ("modules/foo.py", "from multibranch.hooks import ParamGroupSpec\n"),
                         ("commands/foo.py", "from multibranch.commands.train import run\n"),
                         ("train/foo.py", "from multibranch.checkpoint.format import load_checkpoint\n")]:
        file = tmp_path / PACKAGE / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(source)
    assert violations(tmp_path) == []
