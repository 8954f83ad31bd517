"""A reader that stops early (`multibranch ... | head`) ends the command quietly: no traceback.

Each case is a real `python -m multibranch` process (the point is its pipe); the three are started together
when the module starts (each is mostly the import of torch, and the imports overlap), and each test waits
for its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "multibranch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _start_into_closed_pipe(*args: str) -> subprocess.Popen:
    """Start `multibranch ARGS` with stdout a pipe whose reading end is closed before anything is
    written (the strictest `| head`): every write to stdout fails with EPIPE."""
    proc = _start(*args)
    proc.stdout.close()
    return proc


def _finish_into_closed_pipe(proc: subprocess.Popen) -> tuple[int, bytes]:
    err = proc.stderr.read()
    return proc.wait(timeout=120), err


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> dict[str, subprocess.Popen]:
    """The module's processes, started together: `info` and `evaluate` into a closed pipe, `info --list`
    read to the end."""
    hyp = _write(tmp_path_factory.mktemp("pipes") / "hyp", ["a b c d", "e f g"])
    procs = {"info": _start_into_closed_pipe("info", "--preset", "transformer-tiny"),
             "evaluate": _start_into_closed_pipe("evaluate", "--hyp", hyp, "--ref", hyp),
             "read to the end": _start("info", "--list")}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:  # a test failed before waiting for it
            proc.kill()
        proc.communicate()


@pytest.mark.parametrize("command", ["info", "evaluate"])
def test_closed_pipe_is_a_quiet_exit(command, started):
    code, err = _finish_into_closed_pipe(started[command])
    assert b"Traceback" not in err and b"BrokenPipeError" not in err and b"Exception ignored" not in err, err
    assert code == 1


def test_output_read_to_the_end_is_unaffected(started):
    stdout, _ = started["read to the end"].communicate(timeout=120)
    assert started["read to the end"].returncode == 0 and b"transformer-tiny" in stdout
