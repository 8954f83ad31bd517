"""The README's two fresh-machine commands exist and CI runs the test command verbatim."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bash_blocks(text: str) -> list[str]:
    blocks, inside, current = [], False, []
    for line in text.splitlines():
        if line.startswith("```bash"):
            inside, current = True, []
        elif line.startswith("```") and inside:
            inside = False
            blocks.append("\n".join(current))
        elif inside:
            current.append(line)
    return blocks


def test_readme_starts_with_the_demo_and_test_commands():
    blocks = _bash_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    demo, tests = blocks[0].strip(), blocks[1].strip()
    assert demo.startswith("pip install torch==2.13.0") and demo.endswith("multibranch demo")
    assert tests.startswith("pip install torch==2.13.0") and "pytest" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    tests = _bash_blocks((ROOT / "README.md").read_text(encoding="utf-8"))[1].strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert tests in ci_lines


def test_cli_lists_every_command():
    from multibranch.cli import build_parser

    help_text = build_parser().format_help()
    for name in ("demo", "prepare", "train", "translate", "evaluate", "average", "convert", "info"):
        assert name in help_text
