"""The package's floor order, checked statically: every import (module- or function-level) of every module
under src/multibranch is parsed with `ast`.

Each room (a subpackage, or a top-level module) has a floor, bottom first, read from the one floor table
of docs/architecture.md (between `<!-- floors -->` and `<!-- /floors -->`; FLOORS below). A module may import
its own room and rooms on lower floors, never a higher one nor another room of its own floor; inside a room
the modules import each other without a cycle. Every package and top-level module of src/multibranch is in
the table, or in NO_FLOOR (directories that hold no Python). An import inside a function is kept for what a plain install may lack or what costs seconds to
import (LAZY_ALLOWED); everything else is imported at module level, where the order is visible. Commands
(and the CLI) are exempt from that last rule: the CLI imports every command to build its parser, and a
command imports its library code when it runs, so `multibranch --help` stays fast.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "multibranch"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
FLOORS_BEGIN, FLOORS_END = "<!-- floors -->", "<!-- /floors -->"
FLOORS_HEADER = ["floor", "room", "what it holds"]
# directories of src/multibranch that are no room: they hold no Python, so nothing imports them
NO_FLOOR = {"configs": "the presets' YAML (package data)", "csrc": "the C++ sources that cpu_kernels.py builds"}


class Room(NamedTuple):
    floor: int
    name: str  # as `room()` names it: "checkpoint", "cli", "__init__"
    kind: str  # "package" (`name/`), "module" (`name.py`) or "__init__" (the package's own __init__.py)


def floor_table(text: str) -> list[Room]:
    """The rooms of the floor table between FLOORS_BEGIN and FLOORS_END, bottom first. Each row is
    `| floor | `room` | what it holds |`, the room written `name/`, `name.py` or `__init__`; floors start at 0
    and climb by one, rooms that share a floor repeat its number. Raises ValueError naming what is wrong."""
    if text.count(FLOORS_BEGIN) != 1 or text.count(FLOORS_END) != 1:
        raise ValueError(f"the floor table must sit between one {FLOORS_BEGIN} and one {FLOORS_END}")
    begin, end = text.index(FLOORS_BEGIN) + len(FLOORS_BEGIN), text.index(FLOORS_END)
    if end < begin:
        raise ValueError(f"{FLOORS_END} comes before {FLOORS_BEGIN}")
    lines = [line.strip() for line in text[begin:end].splitlines() if line.strip()]

    def cells(line: str) -> list[str]:
        if not (line.startswith("|") and line.endswith("|")):
            raise ValueError(f"not a table row: {line!r}")
        return [cell.strip() for cell in line[1:-1].split("|")]

    if len(lines) < 2 or cells(lines[0]) != FLOORS_HEADER or any(set(c) - set(":-") or not c
                                                                   for c in cells(lines[1])):
        raise ValueError(f"the floor table must start with the header | {' | '.join(FLOORS_HEADER)} | "
                         "and its |---| line")
    rooms: list[Room] = []
    for line in lines[2:]:
        row = cells(line)
        if len(row) < 3 or not row[2]:
            raise ValueError(f"a floor row is | floor | `room` | what it holds |: {line!r}")
        number, spelled = row[0], row[1]
        match = re.fullmatch(r"`(?:(__init__)|([A-Za-z_][A-Za-z0-9_]*)(/|\.py))`", spelled)
        if not number.isdigit() or match is None:
            raise ValueError(f"a floor row is | 12 | `name/`, `name.py` or `__init__` | ... |: {line!r}")
        floor_number = int(number)
        if not rooms and floor_number != 0:
            raise ValueError(f"the first floor is 0, not {floor_number}: {line!r}")
        if rooms and floor_number not in (rooms[-1].floor, rooms[-1].floor + 1):
            raise ValueError(f"floor {floor_number} after floor {rooms[-1].floor}: floors climb by one (rooms "
                             f"sharing a floor repeat its number), bottom first: {line!r}")
        if match.group(1):
            name, kind = "__init__", "__init__"
        else:
            name, kind = match.group(2), "package" if match.group(3) == "/" else "module"
        if any(r.name == name for r in rooms):
            raise ValueError(f"room {name!r} is in the floor table twice")
        rooms.append(Room(floor_number, name, kind))
    if not rooms:
        raise ValueError("the floor table has no room")
    return rooms


# room -> its floor, bottom first, from docs/architecture.md: the one place a floor is written down
FLOORS = {r.name: r.floor for r in floor_table(ARCHITECTURE.read_text(encoding="utf-8"))}
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


def floor(module: str, floors: dict[str, int] | None = None) -> int:
    name = room(module)
    floors = FLOORS if floors is None else floors
    if name not in floors:
        raise AssertionError(f"{module}: room {name!r} has no floor; add its row to the floor table of "
                             "docs/architecture.md")
    return floors[name]


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


def violations(src: Path = SRC, floors: dict[str, int] | None = None) -> list[str]:
    """One line per broken rule: an import that climbs (or crosses to another room of its floor), a cycle
    inside a room, a needless lazy import. `floors`: room -> floor, FLOORS unless given."""
    modules = parse_tree(src)
    known = set(modules)
    lines = []
    edges: dict[str, set[str]] = defaultdict(set)
    for module, found in modules.items():
        here = floor(module, floors)  # a new room must be given its floor
        for imp in found:
            target = target_module(imp.names, known)
            if target is not None:
                there = floor(target, floors)
                if there > here or (there == here and room(target) != room(module)):
                    lines.append(f"{module} (line {imp.line}) imports {target}: {room(module)} (floor "
                                 f"{here}) must not import {room(target)} (floor {there})")
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


def rooms_on_disk(src: Path = SRC) -> dict[str, str]:
    """Every entry of the package directory that could be a room -> its kind: "__init__", "module" (a
    top-level .py file), "package" (a directory holding Python) or "directory" (one holding none)."""
    found = {}
    for entry in sorted((src / PACKAGE).iterdir()):
        if entry.name == "__pycache__" or entry.name.startswith("."):
            continue
        if entry.is_dir():
            found[entry.name] = "package" if any(entry.rglob("*.py")) else "directory"
        elif entry.suffix == ".py":
            found[entry.stem] = "__init__" if entry.stem == "__init__" else "module"
    return found


def table_mismatches(rooms: list[Room], src: Path = SRC, no_floor: dict[str, str] = NO_FLOOR) -> list[str]:
    """One line per disagreement between the floor table and src/multibranch: a room in neither the table
    nor `no_floor`, a row naming no room or spelling it as the other kind, a stale or Python-holding
    exemption."""
    on_disk = rooms_on_disk(src)
    table = {r.name: r for r in rooms}
    lines = []
    for name, kind in on_disk.items():
        if name not in table and name not in no_floor:
            spelled = f"{name}/" if kind in ("package", "directory") else f"{name}.py"
            lines.append(f"{PACKAGE}/{spelled} is in neither the floor table of docs/architecture.md nor "
                         "NO_FLOOR: give it a row (its floor) there")
    for name, r in table.items():
        if name not in on_disk:
            lines.append(f"the floor table names {name!r} (floor {r.floor}), which src/{PACKAGE} lacks")
        elif on_disk[name] != r.kind:
            lines.append(f"the floor table writes {name!r} as a {r.kind}, but src/{PACKAGE} holds a {on_disk[name]}")
    for name in no_floor:
        if name in table:
            lines.append(f"{name!r} is both in the floor table and in NO_FLOOR")
        elif on_disk.get(name) != "directory":
            lines.append(f"NO_FLOOR names {name!r}, which is not a directory without Python in src/{PACKAGE}")
    return lines


def test_floor_table_and_package_agree():
    rooms = floor_table(ARCHITECTURE.read_text(encoding="utf-8"))
    problems = table_mismatches(rooms)
    assert not problems, "floor table vs src/multibranch:\n" + "\n".join(problems)


def test_floor_table_keeps_the_known_order():
    """Spot checks that the table is read bottom first with its numbers (the messages below rely on them)."""
    assert list(FLOORS)[:2] == ["__init__", "errors"] and list(FLOORS)[-3:] == ["api", "cli", "__main__"]
    assert FLOORS["modules"] == 12 and FLOORS["train"] == 17 and FLOORS["__main__"] == 28
    assert sorted(FLOORS.values()) == list(FLOORS.values())
    # the Python API and the commands share a floor, so neither imports the other: both sit on the library
    assert FLOORS["api"] == FLOORS["commands"] and FLOORS["loading"] < FLOORS["serve"] < FLOORS["commands"]


TABLE = "| floor | room | what it holds |\n|---|---|---|\n"


def test_floor_table_reads_rooms_and_shared_floors():
    text = (f"before\n\n{FLOORS_BEGIN}\n\n{TABLE}| 0 | `__init__` | the version |\n"
            "| 1 | `errors.py` | errors |\n| 1 | `atomic.py` | atomic |\n| 2 | `data/` | data |\n\n"
            f"{FLOORS_END}\n\n| 9 | `ignored/` | a table outside the markers |\n")
    assert floor_table(text) == [Room(0, "__init__", "__init__"), Room(1, "errors", "module"),
                                 Room(1, "atomic", "module"), Room(2, "data", "package")]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (TABLE + "| 0 | `a.py` | a |\n| 2 | `b/` | b |\n", "floor 2 after floor 0"),
        (TABLE + "| 1 | `a.py` | a |\n", "the first floor is 0, not 1"),
        (TABLE + "| 0 | `a.py` | a |\n| 1 | `b/` | b |\n| 0 | `c/` | c |\n", "floor 0 after floor 1"),
        (TABLE + "| 0 | `a.py` | a |\n| 1 | `a/` | a again |\n", "room 'a' is in the floor table twice"),
        (TABLE + "| 0 | a.py | no code span |\n", "`name/`, `name.py` or `__init__`"),
        (TABLE + "| 0 | `a` | neither / nor .py |\n", "`name/`, `name.py` or `__init__`"),
        (TABLE + "| x | `a.py` | a |\n", "`name/`, `name.py` or `__init__`"),
        (TABLE + "| 0 | `a.py` |  |\n", "what it holds"),
        ("| floor | room |\n|---|---|\n| 0 | `a.py` |\n", "must start with the header"),
        (TABLE, "has no room"),
    ],
)
def test_floor_table_refuses_a_malformed_table(body, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        floor_table(f"{FLOORS_BEGIN}\n{body}{FLOORS_END}\n")


@pytest.mark.parametrize("text", ["no markers\n", f"{FLOORS_BEGIN}\n{TABLE}",
                                  f"{FLOORS_END}\n{TABLE}{FLOORS_BEGIN}\n",
                                  f"{FLOORS_BEGIN}\n{TABLE}{FLOORS_END}\n{FLOORS_BEGIN}\n{FLOORS_END}\n"])
def test_floor_table_needs_its_markers_once(text):
    with pytest.raises(ValueError, match="floor"):
        floor_table(text)


def test_table_check_names_an_unlisted_room(tmp_path):
    src = write(tmp_path, {"__init__.py": "", "cli.py": "", "data/__init__.py": "", "newthing/foo.py": "",
                           "extra.py": "", "configs/demo.yaml": "", "notes/readme.txt": ""})
    rooms = [Room(0, "__init__", "__init__"), Room(1, "data", "package"), Room(2, "cli", "module")]
    assert table_mismatches(rooms, src, {"configs": "yaml"}) == [
        f"{PACKAGE}/extra.py is in neither the floor table of docs/architecture.md nor NO_FLOOR: give it a row "
        "(its floor) there",
        f"{PACKAGE}/newthing/ is in neither the floor table of docs/architecture.md nor NO_FLOOR: give it a row "
        "(its floor) there",
        f"{PACKAGE}/notes/ is in neither the floor table of docs/architecture.md nor NO_FLOOR: give it a row "
        "(its floor) there",
    ]


def test_table_check_names_stale_rows_and_exemptions(tmp_path):
    src = write(tmp_path, {"__init__.py": "", "cli.py": "", "data/__init__.py": "", "csrc/k.py": ""})
    rooms = [Room(0, "__init__", "__init__"), Room(1, "data", "module"), Room(2, "cli", "module"),
             Room(3, "gone", "package")]
    assert table_mismatches(rooms, src, {"csrc": "C++", "configs": "yaml"}) == [
        "the floor table writes 'data' as a module, but src/multibranch holds a package",
        "the floor table names 'gone' (floor 3), which src/multibranch lacks",
        "NO_FLOOR names 'csrc', which is not a directory without Python in src/multibranch",
        "NO_FLOOR names 'configs', which is not a directory without Python in src/multibranch",
    ]


def test_rooms_sharing_a_floor_import_none_of_each_other(tmp_path):
    src = write(tmp_path, {"errors.py": "", "atomic.py": "from multibranch import errors\n",
                           "data/foo.py": "from multibranch.atomic import write\nfrom multibranch import errors\n"})
    floors = {"__init__": 0, "errors": 1, "atomic": 1, "data": 2}
    assert violations(src, floors) == ["multibranch.atomic (line 1) imports multibranch.errors: atomic (floor 1) "
                                       "must not import errors (floor 1)"]


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
         "multibranch.convert.foo (line 1) imports multibranch.commands.train: convert (floor 20) must not "
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
        "tasks/translation/heldout.py": "from multibranch.loading.checkpoint import load_model\n",
    })
    assert task_crossings(src) == []
