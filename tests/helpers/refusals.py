"""A refused `multibranch` command and its one error line, read from a real process or from this one.

A refusal is exit code 2 and exactly one line on stderr: no log line before it, no traceback, no warning.
`refusal(args, capfd, caplog, process=True)` checks that of a real `python -m multibranch` process (one
start costs the ~3 s import of torch). `process=False` runs `main()` in this process, where
`logging.basicConfig` is a no-op under pytest and log records go to caplog rather than stderr, so the
same contract is checked piece by piece: exit code 2, one line and no traceback on stderr (file
descriptor 2 included, through capfd), no log record at INFO or above (the lines a real process would
print before it) and no warning a plain `python` would show. Test modules keep at least one process case
of each kind of refusal.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

from multibranch.cli import main

# what the command gets in either place: the PyTorch decoding path (no CPU-kernel build on first use);
# a real process also gets one intra-op thread (in this one: the `one_thread` fixture)
COMMAND_ENV = {"MULTIBRANCH_CPU_KERNELS": "0"}
PROCESS_ENV = {**COMMAND_ENV, "OMP_NUM_THREADS": "1"}

# the categories an interpreter started without -W hides (outside __main__)
HIDDEN_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    """`python -m multibranch ARGS` in a real process, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "multibranch", *map(str, args)], env={**os.environ, **PROCESS_ENV},
                          capture_output=True, text=True, timeout=300)


def refused(done: subprocess.CompletedProcess) -> str:
    """The one error line of a refused command run by `cli`."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def main_here(args: list[Any], caplog: Any) -> tuple[int, list[str], list[str]]:
    """`main(ARGS)` in this process with the command environment: (exit code, the log records at INFO or above,
    the warnings a plain `python` would show). The caller reads stdout and stderr from its capture fixture."""
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as caught, \
            mock.patch.dict(os.environ, COMMAND_ENV):
        warnings.simplefilter("default")  # changing the filters also forgets which warnings were shown before
        for category in HIDDEN_WARNINGS:
            warnings.filterwarnings("ignore", category=category)
        caplog.clear()
        code = main([str(arg) for arg in args])
    logged = [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.INFO]
    shown = [f"{w.category.__name__}: {w.message}" for w in caught if not issubclass(w.category, HIDDEN_WARNINGS)]
    return code, logged, shown


def refusal(args: list[Any], capfd: Any, caplog: Any, *, process: bool = False) -> str:
    """The one error line of ARGS refused (exit code 2), in a real process or (the default) in this one."""
    if process:
        return refused(cli(*args))
    capfd.readouterr()
    code, logged, shown = main_here(args, caplog)
    out, err = capfd.readouterr()
    assert code == 2, out + err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert logged == [], logged
    assert shown == [], shown
    return lines[0]
