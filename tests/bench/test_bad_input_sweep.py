"""bench/bad_input_sweep.py: every case keeps the README's promises (exit code, one line, nothing lost on
disk). Slow (a few minutes: one process per case); run with `pytest -m slow tests/bench/test_bad_input_sweep.py`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SWEEP = Path(__file__).resolve().parents[2] / "bench" / "bad_input_sweep.py"


@pytest.mark.slow
def test_every_bad_input_case_keeps_its_promises(tmp_path):
    results = tmp_path / "sweep.json"
    done = subprocess.run([sys.executable, str(SWEEP), "--results", str(results)], capture_output=True,
                          text=True, timeout=1200)
    summary = json.loads(results.read_text())
    assert summary["cases"] >= 20
    assert done.returncode == 0 and summary["failed"] == [], done.stdout[-4000:]
