"""A reader that stops early (`multibranch ... | head`) ends the command quietly: no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _run_into_closed_pipe(*args: str) -> tuple[int, bytes]:
    """Start `multibranch ARGS` with stdout a pipe whose reading end is closed before anything is
    written (the strictest `| head`): every write to stdout fails with EPIPE."""
    proc = subprocess.Popen([sys.executable, "-m", "multibranch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(timeout=120), err


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("command", ["info", "evaluate"])
def test_closed_pipe_is_a_quiet_exit(command, tmp_path):
    if command == "info":
        args = ["info", "--preset", "transformer-tiny"]
    else:
        hyp = _write(tmp_path / "hyp", ["a b c d", "e f g"])
        args = ["evaluate", "--hyp", hyp, "--ref", hyp]
    code, err = _run_into_closed_pipe(*args)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err and b"Exception ignored" not in err, err
    assert code == 1


def test_output_read_to_the_end_is_unaffected(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "multibranch", "info", "--list"], capture_output=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and b"transformer-tiny" in proc.stdout
