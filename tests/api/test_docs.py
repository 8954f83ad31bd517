"""Every ```python block of docs/python-api.md runs, in order in one namespace, with CKPT, DATA, OUT,
CLASSIFIER and RAW set to the session's tiny model, its data, a new run directory, a tiny classifier and the
tiny data's raw text."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def test_the_page_has_examples():
    blocks = python_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 8
    assert all("CKPT =" not in block for block in blocks)  # the test's paths are the ones used


def test_every_example_runs(api_run, tiny_data, api_classifier, tmp_path, capsys):
    namespace = {"__name__": "python_api_doc", "CKPT": str(api_run.last_checkpoint), "DATA": str(tiny_data),
                 "OUT": str(tmp_path / "run"), "CLASSIFIER": str(api_classifier),
                 "RAW": str(tiny_data.parent / "raw")}
    for number, block in enumerate(python_blocks(DOC.read_text(encoding="utf-8")), start=1):
        code = compile(block, f"{DOC.name} (python block {number})", "exec")
        exec(code, namespace)  # noqa: S102 - the documentation's own examples
    assert namespace["more"].step == 3
    assert namespace["meta"]["splits"]["train"]
    assert "is a classification model, not a translation model" in capsys.readouterr().out
