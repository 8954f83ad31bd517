"""The CPU kernels' build (cpu_kernels.py) across processes: a build killed midway leaves nothing that blocks the
next one, a process that finds another one building waits a bounded time and then decodes without the kernels,
environments that differ only in their install paths share one build, and a command stopped during its build
(SIGTERM, SIGKILL) leaves no compiler running.

The fast tests never compile. The lock tests replace the build child's command, in the child process, by one that
copies the library this test session built (the `cpu_kernels_built` fixture); the stop tests run the real build
(PyTorch's `cpp_extension` and ninja) with a fake compiler that sleeps. The `slow` one compiles for real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from multibranch import cpu_kernels

SRC = Path(cpu_kernels.__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 180  # generous for a loaded machine; a hang is what these tests catch
REAL_BUILD_TIMEOUT_S = 900  # a real compile: 1.5 minutes on 2 idle cores, up to 10 on a heavily loaded machine

# A child process: the build child's command replaced by one that copies the built library (argv[1], a directory;
# empty: the real build) after argv[2] seconds, or sooner once the file argv[3] exists, behind the real build
# child's watch of its parent; prints what kernels() gave and how many builds it started.
CHILD = r"""
import json, sys, warnings

from multibranch import cpu_kernels

built, sleep_s, release = sys.argv[1], float(sys.argv[2]), sys.argv[3]
COPY = cpu_kernels.WATCH_PARENT + '''
import shutil
deadline = time.monotonic() + spec["sleep"]
while time.monotonic() < deadline and not (spec["release"] and os.path.exists(spec["release"])):
    time.sleep(0.05)
shutil.copyfile(f"{spec['built']}/{spec['name']}.so", f"{spec['directory']}/{spec['name']}.so")
'''
real_command = cpu_kernels._build_command
compiles = []


def command(spec):
    compiles.append(spec["name"])
    print("compiling", file=sys.stderr, flush=True)
    if not built:
        return real_command(spec)
    return [sys.executable, "-c", COPY, json.dumps({**spec, "built": built, "sleep": sleep_s, "release": release})]


cpu_kernels._build_command = command

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = cpu_kernels.kernels()
print(json.dumps({"loaded": module is not None, "compiles": len(compiles),
                  "warnings": [str(w.message) for w in caught]}))
"""


def _env(extensions: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (cpu_kernels.ENV_SWITCH, "MULTIBRANCH_CPU_KERNELS_WAIT")}
    env["TORCH_EXTENSIONS_DIR"] = str(extensions)
    env.update(extra)
    return env


def _start(env: dict[str, str], built: Path | None, sleep_s: float = 0.0, group: bool = False,
           release: Path | None = None) -> subprocess.Popen:
    """The child; `group`: in a process group of its own (with the compilers it starts), as a command run by
    `timeout` or from a terminal; `release`: a file whose creation ends the fake build's wait early."""
    return subprocess.Popen([sys.executable, "-c", CHILD, str(built or ""), str(sleep_s), str(release or "")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=group)


def _finish(process: subprocess.Popen, timeout_s: float = CHILD_TIMEOUT_S) -> tuple[dict, str]:
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"kernels() hung for {timeout_s} s; stderr:\n{err}")
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def _wait_for_line(process: subprocess.Popen, text: str) -> None:
    """Read the child's stderr until a line holds `text` (a bounded wait)."""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if text in line:
            return
        if not line and process.poll() is not None:
            pytest.fail(f"the child exited ({process.returncode}) before printing {text!r}")
    pytest.fail(f"no {text!r} from the child in {CHILD_TIMEOUT_S} s")


def _end(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(30)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


@pytest.fixture
def built(cpu_kernels_built) -> Path:  # noqa: ARG001
    """The directory of this session's build of the kernels (its library is `<build name>.so`)."""
    from torch.utils.cpp_extension import _get_build_directory

    name = cpu_kernels._build_name()
    directory = Path(_get_build_directory(name, verbose=False))
    assert (directory / f"{name}.so").is_file()
    return directory


@pytest.fixture
def extensions(tmp_path) -> Path:
    path = tmp_path / "torch_extensions"
    path.mkdir()
    return path


def _build_directory(extensions: Path) -> Path:
    return extensions / cpu_kernels._build_name()


def test_a_lock_file_left_by_a_killed_build_does_not_block_the_next(built, extensions):
    """PyTorch's `lock` file has no owner: one left by a killed build made every later start wait for ever."""
    directory = _build_directory(extensions)
    directory.mkdir()
    (directory / "lock").touch()
    result, err = _finish(_start(_env(extensions), built))
    assert result == {"loaded": True, "compiles": 1, "warnings": []}
    assert "building multibranch's CPU kernels" in err


def test_a_build_killed_midway_by_sigkill_leaves_nothing_that_blocks(built, extensions):
    env = _env(extensions)
    killed = _start(env, built, sleep_s=600)
    try:
        _wait_for_line(killed, "compiling")
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
    finally:
        _end(killed)
    result, err = _finish(_start(env, built))
    assert result == {"loaded": True, "compiles": 1, "warnings": []}
    assert "building multibranch's CPU kernels" in err


def test_a_process_that_finds_a_build_under_way_waits_a_bounded_time_then_decodes_without(built, extensions):
    env = _env(extensions)
    building = _start(env, built, sleep_s=600)
    try:
        _wait_for_line(building, "compiling")
        result, err = _finish(_start({**env, "MULTIBRANCH_CPU_KERNELS_WAIT": "1"}, built))
    finally:
        _end(building)
    assert not result["loaded"] and result["compiles"] == 0
    assert len(result["warnings"]) == 1 and "still building" in result["warnings"][0]
    assert "waiting for pid" in err and "(at most 1 s)" in err


def test_a_process_that_waited_loads_the_build_it_waited_for(built, extensions, tmp_path):
    env, release = _env(extensions), tmp_path / "release"
    building = _start(env, built, sleep_s=CHILD_TIMEOUT_S, release=release)
    waiter = None
    try:
        _wait_for_line(building, "compiling")
        waiter = _start(env, built)
        _wait_for_line(waiter, "waiting for pid")  # the build ends only once the waiter waits for it
        release.touch()
        result, _ = _finish(waiter)
        first, _ = _finish(building)
    finally:
        _end(building)
        if waiter is not None:
            _end(waiter)
    assert first == {"loaded": True, "compiles": 1, "warnings": []}
    assert result == {"loaded": True, "compiles": 0, "warnings": []}


def _other_environment(tmp_path: Path) -> dict[str, str]:
    """This package and PyTorch reached through symlinks: the same versions and sources at other paths, as from
    a second virtualenv."""
    package = tmp_path / "other-env" / "src"
    site = tmp_path / "other-env" / "site-packages"
    package.parent.mkdir()
    package.symlink_to(SRC, target_is_directory=True)
    site.symlink_to(Path(sysconfig.get_paths()["purelib"]).resolve(), target_is_directory=True)
    return {"PYTHONPATH": os.pathsep.join([str(package), str(site)])}


def test_environments_at_other_paths_share_one_build(built, extensions, tmp_path):
    env = _env(extensions)
    first, _ = _finish(_start(env, built))
    assert first == {"loaded": True, "compiles": 1, "warnings": []}
    other = {**env, **_other_environment(tmp_path)}
    probe = subprocess.run([sys.executable, "-c", "import multibranch, torch; print(multibranch.__file__, torch.__file__)"],
                           env=other, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=True)
    assert str(tmp_path) in probe.stdout.split()[0] and str(tmp_path) in probe.stdout.split()[1]
    for _ in range(2):  # and back: neither environment rebuilds the other's build
        second, err = _finish(_start(other, built))
        assert second == {"loaded": True, "compiles": 0, "warnings": []}
        assert "building" not in err
        again, err = _finish(_start(env, built))
        assert again == {"loaded": True, "compiles": 0, "warnings": []}
        assert "building" not in err


# ---- a command stopped during its build -----------------------------------------------------------------------

# A compiler that answers PyTorch's version check, then records its pid and sleeps: a compile that never ends
FAKE_COMPILER = """#!/bin/sh
case " $* " in *" -dumpfullversion "*) echo 13.3.0; exit 0 ;; esac
echo $$ > "$FAKE_COMPILER_PIDS/$$"
exec sleep 300
"""
# A command as the CLI runs one: SIGTERM raises Terminated, which ends it with status 143
COMMAND = r"""
import sys
from multibranch import cpu_kernels
from multibranch.interrupts import Terminated, sigterm_as_interrupt
try:
    with sigterm_as_interrupt():
        cpu_kernels.kernels()
except Terminated:
    sys.exit(143)
"""


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, dead but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.is_file() or stat.read_text().rpartition(")")[2].split()[0] != "Z"


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_command_stopped_during_its_build_leaves_no_compiler_running(extensions, tmp_path, stop):
    """SIGTERM: the command ends the build's process group and exits 143; SIGKILL, which it cannot handle: the
    build child sees it gone and ends the group itself. Either way ninja ends every compiler it started."""
    compiler, pids = tmp_path / "bin" / "fake-g++", tmp_path / "compilers"
    compiler.parent.mkdir()
    pids.mkdir()
    compiler.write_text(FAKE_COMPILER)
    compiler.chmod(0o755)
    sources = len(cpu_kernels.SOURCES)
    env = _env(extensions, CXX=str(compiler), FAKE_COMPILER_PIDS=str(pids), MAX_JOBS=str(sources))
    command = subprocess.Popen([sys.executable, "-c", COMMAND], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    compilers: list[int] = []
    try:
        _wait_for_line(command, "a one-time build")
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while len(compilers) < sources and time.monotonic() < deadline:  # every source compiling at once
            time.sleep(0.1)
            compilers = [int(p.read_text()) for p in pids.iterdir() if p.read_text().strip()]
        assert len(compilers) == sources and all(map(_running, compilers)), (compilers, command.poll())
        command.send_signal(stop)
        assert command.wait(30) == (143 if stop == signal.SIGTERM else -signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(map(_running, compilers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_running, compilers)), [p for p in compilers if _running(p)]
    finally:
        _end(command)
        for pid in filter(_running, compilers):  # a failure leaves nothing behind
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_real_build_killed_by_sigterm_then_rebuilt_and_shared(extensions, tmp_path):
    """For real (a full compile, minutes): a build killed by SIGTERM, a build that completes, and the
    build loaded without compiling from another environment."""
    env = _env(extensions)
    killed = _start(env, None, group=True)
    try:
        _wait_for_line(killed, "building multibranch's CPU kernels")
        time.sleep(3)  # compiling
        os.killpg(killed.pid, signal.SIGTERM)  # as `timeout -s TERM` or a terminal's Ctrl-C: the whole group
        killed.wait(30)
    finally:
        _end(killed)
    result, err = _finish(_start(env, None), REAL_BUILD_TIMEOUT_S)
    assert result == {"loaded": True, "compiles": 1, "warnings": []}, err
    other = {**env, **_other_environment(tmp_path)}
    result, err = _finish(_start(other, None))
    assert result == {"loaded": True, "compiles": 0, "warnings": []}, err
    assert "building" not in err
