"""The package's floor order, checked statically: every import (module- or function-level) of every module
under src/multibranch is parsed with `ast`.

Each room (a subpackage, or a top-level module) has a floor (FLOORS, bottom first). A module may import its
own room and rooms on lower floors, never a higher one; inside a room the modules import each other without
a cycle. An import inside a function is kept for what a plain install may lack or what costs seconds to
import (LAZY_ALLOWED); everything else is imported at module level, where the order is visible. Commands
(and the CLI) are exempt from that last rule: the CLI imports every command to build its parser, and a
command imports its library code when it runs, so `multibranch --help` stays fast.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "multibranch"

# bottom first; docs/architecture.md shows the same order with what each floor holds
FLOORS = [
    "__init__",  # the version
    "errors", "atomic", "json_file", "config", "device", "schedules", "hooks", "cpu_kernels",
    "checkpoint", "data", "evaluate", "modules", "models", "experiment", "figures",
    "inference", "train", "tasks", "convert", "analysis", "pruning", "serve", "layers",
    "arguments", "commands", "api", "cli", "__main__",
]
# optional extras and slow imports, imported where they are used
LAZY_ALLOWED = ("transformers", "ctranslate2", "fastapi", "uvicorn", "starlette", "prometheus_client",
                "matplotlib", "tensorboard", "torch.utils.tensorboard", "tokenizers", "scipy",
                "torch.utils.cpp_extension",  # imports setuptools (0.1 s), needed only to build/load cpu_kernels
                "fcntl")  # POSIX only: cpu_kernels builds without its lock where it is missing
LAZY_EXEMPT_ROOMS = ("commands", "cli")
# torch (a second to import) is lazy where text-encoding worker processes import the module without needing it
LAZY_ALLOWED_IN = {"multibranch.checkpoint.tokenizer_state": ("torch",)}


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def room(module: str) -> str:
    """The room of a module: `multibranch.tasks.translation.task` -> "tasks", `multibranch` -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def floor(module: str) -> int:
    name = room(module)
    if name not in FLOORS:
        raise AssertionError(f"{module}: room {name!r} has no floor; add it to FLOORS (and docs/architecture.md)")
    return FLOORS.index(name)


class Import:
    def __init__(self, line: int, names: list[str], in_function: bool):
        self.line, self.names, self.in_function = line, names, in_function


def imports(tree: ast.AST, module: str, is_package: bool) -> list[Import]:
    """Every import statement in `tree` (at any depth): its line, the absolute names it reaches (`from x
    import y` gives [x, x.y]: y may be a submodule) and whether it sits inside a function."""
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(inner) for inner in ast.walk(node) if inner is not node)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the importing module's package
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target, *(f"{target}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.append(Import(node.lineno, names, id(node) in in_function))
    return found


def inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def parse_tree(src: Path) -> dict[str, list[Import]]:
    """module name -> its imports, for every module of the package under `src`."""
    modules = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        module = module_name(path, src)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules[module] = imports(tree, module, path.name == "__init__.py")
    return modules


def target_module(names: list[str], known: set[str]) -> str | None:
    """The most specific module of ours an import reaches (`from a.b import c`: a.b.c if it is a module)."""
    ours = [n for n in names if inside(n, PACKAGE)]
    for name in sorted(ours, key=len, reverse=True):
        if name in known:
            return name
    if not ours:
        return None
    return ours[1] if ours[0] == PACKAGE and len(ours) > 1 else ours[0]  # `from multibranch import models`


def violations(src: Path = SRC) -> list[str]:
    """One line per broken rule: an import that climbs, a cycle inside a room, a needless lazy import."""
    modules = parse_tree(src)
    known = set(modules)
    lines = []
    edges: dict[str, set[str]] = defaultdict(set)
    for module, found in modules.items():
        floor(module)  # a new room must be given its floor
        for imp in found:
            target = target_module(imp.names, known)
            if target is not None:
                if floor(target) > floor(module):
                    lines.append(f"{module} (line {imp.line}) imports {target}: {room(module)} (floor "
                                 f"{floor(module)}) must not import {room(target)} (floor {floor(target)})")
                elif room(target) == room(module) and target != module:
                    edges[module].add(target)
            if imp.in_function and room(module) not in LAZY_EXEMPT_ROOMS and not any(
                    inside(name, allowed) for name in imp.names[:1]
                    for allowed in LAZY_ALLOWED + LAZY_ALLOWED_IN.get(module, ())):
                lines.append(f"{module} (line {imp.line}) imports {imp.names[0]} inside a function: "
                             "import it at module level (only optional or slow dependencies are imported lazily)")
    lines += [f"import cycle inside {room(c[0])}/: {' -> '.join(c)}" for c in cycles(edges)]
    return lines


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules (Tarjan), as a closed path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group) + [sorted(group)[0]])

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_package_layering():
    problems = violations()
    assert not problems, "layering violations:\n" + "\n".join(problems)


def test_every_room_has_a_floor():
    for module in parse_tree(SRC):
        floor(module)  # raises naming the room


def write(tmp_path: Path, files: dict[str, str]) -> Path:
    for path, source in files.items():
        file = tmp_path / PACKAGE / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(source)
    return tmp_path


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        ("modules/foo.py", "import torch\ndef f():\n    import multibranch.train.trainer\n",
         "multibranch.modules.foo (line 3) imports multibranch.train.trainer: modules (floor 12) must not "
         "import train (floor 17)"),
        ("checkpoint/foo.py", "from ..tasks import loading\n",
         "multibranch.checkpoint.foo (line 1) imports multibranch.tasks: checkpoint (floor 9) must not "
         "import tasks (floor 18)"),
        ("data/foo.py", "from multibranch import models\n",
         "multibranch.data.foo (line 1) imports multibranch.models: data (floor 10) must not import models"),
        ("convert/foo.py", "from multibranch.commands.train import run\n",
         "multibranch.convert.foo (line 1) imports multibranch.commands.train: convert (floor 19) must not "
         "import commands"),
        ("tasks/foo.py", "def f():\n    import difflib\n",
         "multibranch.tasks.foo (line 2) imports difflib inside a function"),
    ],
)
def test_checker_names_the_offending_module_and_import(tmp_path, path, source, expected):
    found = violations(write(tmp_path, {path: source}))
    assert any(expected in line for line in found), found


def test_checker_finds_a_cycle_inside_a_room(tmp_path):
    src = write(tmp_path, {"data/a.py": "from multibranch.data import b\n",
                           "data/b.py": "from multibranch.data.c import x\n",
                           "data/c.py": "import multibranch.data.a\n"})
    assert violations(src) == ["import cycle inside data/: multibranch.data.a -> multibranch.data.b -> "
                               "multibranch.data.c -> multibranch.data.a"]


def test_checker_accepts_allowed_imports(tmp_path):
    src = write(tmp_path, {
        "cli.py": "from multibranch.commands import train\n",
        "modules/foo.py": "from multibranch.hooks import ParamGroupSpec\n",
        "commands/foo.py": "def run():\n    from multibranch.tasks import train\n",
        "train/foo.py": "from multibranch.checkpoint.format import load_checkpoint\n",
        "convert/hf.py": "def f():\n    from transformers import AutoModel\n",
        "data/a.py": "from multibranch.data import b\n",
        "data/b.py": "import numpy\n",
    })
    assert violations(src) == []


def test_unknown_room_is_named(tmp_path):
    src = write(tmp_path, {"newthing/foo.py": "import os\n"})
    with pytest.raises(AssertionError, match="room 'newthing' has no floor"):
        violations(src)


# ---- tasks: one home per feature ----------------------------------------------------------------------------

TASKS_PACKAGE = f"{PACKAGE}.tasks"
# the shared top of the tasks room: the only modules that may import every task
TASKS_SHARED_TOP = (TASKS_PACKAGE, f"{TASKS_PACKAGE}.registry", f"{TASKS_PACKAGE}.loading")


def task_folders(src: Path) -> set[str]:
    """The task folders under tasks/ (packages: translation, classification, code, ...)."""
    root = src / PACKAGE / "tasks"
    return {p.name for p in root.iterdir() if (p / "__init__.py").is_file()} if root.is_dir() else set()


def task_crossings(src: Path = SRC) -> list[str]:
    """One line per import from a module of tasks/A into tasks/B (A != B), or into any task from a module
    of tasks/ outside a task folder other than the shared top (registry.py, loading.py, __init__.py)."""
    folders = task_folders(src)

    def task(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "tasks" and parts[2] in folders else None

    modules = parse_tree(src)
    known = set(modules)
    lines = []
    for module, found in modules.items():
        if room(module) != "tasks" or module in TASKS_SHARED_TOP:
            continue
        own = task(module)
        for imp in found:
            target = target_module(imp.names, known)
            other = task(target) if target is not None else None
            if other is not None and other != own:
                where = f"tasks/{own}/" if own else "a shared module of tasks/"
                lines.append(f"{module} (line {imp.line}) imports {target}: {where} must not import tasks/{other}/ "
                             "(move what both need to data/ or another lower floor; only tasks/registry.py, "
                             "loading.py and __init__.py may import every task)")
    return lines


def test_no_task_imports_another_task():
    problems = task_crossings()
    assert not problems, "imports across tasks:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        ("tasks/code/prepare.py", "from multibranch.tasks.translation.prepare import build\n",
         "multibranch.tasks.code.prepare (line 1) imports multibranch.tasks.translation.prepare: tasks/code/ must "
         "not import tasks/translation/"),
        ("tasks/translation/files.py", "import os\ndef f():\n    from ..code.corpus import decode\n",
         "multibranch.tasks.translation.files (line 3) imports multibranch.tasks.code.corpus: tasks/translation/ "
         "must not import tasks/code/"),
        ("tasks/code/task.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from multibranch.tasks import translation\n",
         "multibranch.tasks.code.task (line 3) imports multibranch.tasks.translation: tasks/code/ must not"),
        ("tasks/helpers.py", "from multibranch.tasks.code.corpus import decode\n",
         "multibranch.tasks.helpers (line 1) imports multibranch.tasks.code.corpus: a shared module of tasks/ "
         "must not import tasks/code/"),
    ],
)
def test_task_checker_names_the_crossing_import(tmp_path, path, source, expected):
    files = {"tasks/__init__.py": "", "tasks/code/__init__.py": "", "tasks/code/corpus.py": "",
             "tasks/translation/__init__.py": "", "tasks/translation/prepare.py": "", path: source}
    found = task_crossings(write(tmp_path, files))
    assert any(expected in line for line in found), found


def test_task_checker_accepts_the_shared_top_and_imports_inside_a_task(tmp_path):
    src = write(tmp_path, {
        "tasks/__init__.py": "from multibranch.tasks.registry import TASKS\n",
        "tasks/registry.py": "from multibranch.tasks.code.task import CodeTask\n"
                             "from multibranch.tasks.translation.task import TranslationTask\n",
        "tasks/loading.py": "from multibranch.tasks.registry import TASKS\n",
        "tasks/refinement.py": "from multibranch.train.task import Task\n",
        "tasks/code/__init__.py": "",
        "tasks/code/task.py": "from multibranch.tasks.code.metrics import score\n"
                              "from multibranch.tasks.refinement import Refinement\n"
                              "from multibranch.data.shards import binarise\n",
        "tasks/code/metrics.py": "",
        "tasks/translation/__init__.py": "",
        "tasks/translation/task.py": "from .heldout import run\n",
        "tasks/translation/heldout.py": "from multibranch.tasks.loading import load_model\n",
    })
    assert task_crossings(src) == []
