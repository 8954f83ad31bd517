"""bench/runner_priority.py pauses the runner's process group for the paused rounds, counts the CPU the group
uses, and always lets the runner go on afterwards. A busy-looping process in a session of its own stands in for
the runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import runner_priority

BUSY_LOOP = "import time\nwhile True:\n    sum(range(10000))\n"


@pytest.fixture
def stand_in_runner():
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True)
    time.sleep(0.5)
    yield proc.pid
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_group_uses_no_cpu_while_paused_and_goes_on_afterwards(stand_in_runner):
    workload = [sys.executable, "-c", "import time; time.sleep(1.0)"]  # leaves the CPU to the stand-in
    summary = runner_priority.measure(workload, stand_in_runner, repeats=1, settle_s=0.2)
    paused, going = summary["paused"]["repeats"][0], summary["going"]["repeats"][0]
    assert paused["runner_cpu_s"] < 0.05  # stopped for the whole round
    assert going["runner_cpu_s"] > 0.3  # a busy loop beside a workload that sleeps for a second
    assert paused["wall_s"] >= 1.0 and going["wall_s"] >= 1.0
    assert summary["going_over_paused"] == pytest.approx(going["wall_s"] / paused["wall_s"], rel=0.01)
    assert process_state(stand_in_runner) != "T"  # continued after the measurement


def test_a_failing_workload_stops_the_measurement_and_the_runner_still_goes_on(stand_in_runner):
    with pytest.raises(SystemExit, match="the workload failed"):
        runner_priority.measure([sys.executable, "-c", "raise SystemExit(3)"], stand_in_runner, repeats=1, settle_s=0.2)
    time.sleep(0.2)
    assert process_state(stand_in_runner) != "T"


def test_no_runner_is_a_clear_refusal(tmp_path, capsys):
    with pytest.raises(SystemExit):
        runner_priority.main(["--work", str(tmp_path)])
    assert "no runner is going" in capsys.readouterr().err


def test_the_reproduction_page_states_the_measurement(tmp_path, monkeypatch):
    from bench import reproduce_report

    monkeypatch.setattr(reproduce_report, "PRIORITY_FILE", tmp_path / "runner_priority.json")
    assert reproduce_report.priority_paragraph() == ""  # not measured: nothing claimed
    rounds = [{"wall_s": 20.0, "workload_cpu_s": 30.0, "runner_cpu_s": 8.0},
              {"wall_s": 24.0, "workload_cpu_s": 30.0, "runner_cpu_s": 8.0}]
    (tmp_path / "runner_priority.json").write_text(json.dumps({
        "workload": "python -m pytest tests/modules", "cores": 2, "going_over_paused": 1.1,
        "paused": {"repeats": rounds, "median_wall_s": 20.0, "runner_share_of_cpu": 0.0},
        "going": {"repeats": rounds, "median_wall_s": 22.0, "runner_share_of_cpu": 0.18},
        "environment": {"cpu_model": "AMD EPYC", "date": "2026-11-29"}}))
    text = " ".join(reproduce_report.priority_paragraph().split())
    assert "`python -m pytest tests/modules` took 20.0 s with the runner paused and 22.0 s with it going (1.10×" in text
    assert "the median of 2 rounds each" in text and "18% of the CPU" in text and "2026-11-29" in text
