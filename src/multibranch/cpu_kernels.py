"""multibranch's CPU kernels (`csrc/`), compiled with PyTorch's `cpp_extension` on first use.

A beam-search step composed of PyTorch operations pays per-operation overhead on many small tensors, and a
training update's dropout several passes over large ones. These kernels do such parts in one call each, on the CPU
(fp32; dropout in every floating type):

- `csrc/decoder_attention.cpp`: a decoder step's self-attention over each hypothesis' own history and its
  cross-attention over a memory shared by a sentence's hypotheses (`modules/fused_attention.py`);
- `csrc/beam_step.cpp`: a beam step's log-softmax normaliser per row and its best (score + token
  log-probability) candidates per sentence (`inference/beam.py`, `inference/candidates.py`);
- `csrc/layer_norm.cpp`: a post-norm residual sublayer's LayerNorm(x + y) in one pass (`models/layers/common.py`);
- `csrc/dropout.cpp`: dropout's forward or backward in one pass, its mask recomputed from a seed
  (`modules/dropout.py`);
- `csrc/bindings.cpp`: the Python module.

The extension is built (a C++ compiler and ninja; the `ninja` package is a dependency) into PyTorch's
extension cache (`TORCH_EXTENSIONS_DIR`) the first time it is needed, once per machine and source version
(`BUILD_TIME`; a note on stderr says so while it runs, and how long it took). Where it cannot be built,
`kernels()` returns None after one warning and the callers compose PyTorch operations instead;
`MULTIBRANCH_CPU_KERNELS=0` turns the kernels off.

The build's directory is named by a hash of what the library depends on: the sources' contents, the flags, this
CPU's instruction sets, the PyTorch version and the Python ABI, and nothing else. So every environment that agrees
on these (two virtualenvs, one reached through a symlink) loads the same build: a finished build is marked
complete and then imported directly, without asking PyTorch (whose build line holds the sources' and PyTorch's
install paths, and so rebuilds for another environment). The sources are compiled from a copy in the build
directory, so the build line does not hold this package's path.

The build runs in a child process started in a process group of its own (`start_new_session`), which ninja
joins; ninja puts each compiler in a group of its own. When the command stops (Ctrl-C, SIGTERM, an error) it
ends the build's group with SIGTERM, on which ninja ends each compiler's group before exiting (a SIGKILL, which
`subprocess.run` sends, would orphan them); when the command is killed outright (SIGKILL), the child sees its
parent gone and does the same (`WATCH_PARENT`). The compiler's output goes to `BUILD_LOG` in the build directory.

A build holds an OS file lock (`fcntl.flock`, released by the kernel when its process ends, however it ends), so a
build killed midway never leaves a lock behind: the next process takes the lock, clears PyTorch's own `lock` file
left by the killed build, and builds. A process that finds another one building says so on stderr and waits for it
at most `MULTIBRANCH_CPU_KERNELS_WAIT` seconds (default 900), then goes on without the kernels (one warning).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

SOURCES = [Path(__file__).with_name("csrc") / name
           for name in ("bindings.cpp", "decoder_attention.cpp", "beam_step.cpp", "layer_norm.cpp", "dropout.cpp")]
# -ffast-math: vectorised expf (glibc's libmvec); compile flags only, so the library does not set
# flush-to-zero for the whole process (tests/core/test_cpu_kernels.py checks)
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd"]


def _capability_flags() -> list[str]:
    """ATen's vector width for `at::vec::Vectorized` (csrc/beam_step.cpp), as PyTorch picked it for this CPU."""
    capability = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2", "DEFAULT", ...
    if capability in ("AVX512", "AVX2"):
        return [f"-DCPU_CAPABILITY={capability}", f"-DCPU_CAPABILITY_{capability}"]
    return ["-DCPU_CAPABILITY=DEFAULT"]
ENV_SWITCH = "MULTIBRANCH_CPU_KERNELS"
WAIT_ENV = "MULTIBRANCH_CPU_KERNELS_WAIT"
DEFAULT_WAIT_S = 900.0
LOCK_FILE = "multibranch.lock"  # the build lock (flock); holds its owner's "pid@host" for the waiting message
COMPLETE_FILE = "multibranch.complete"  # written once the library is built: later processes import it directly
SOURCE_COPY = "src"  # the sources, copied into the build directory (the build line then holds no install path)
BUILD_LOG = "multibranch.build.log"  # the build child's output (the compiler's messages when it fails)
FAILED_MARK = "multibranch: the build failed:"  # in BUILD_LOG, the line before the build's error message
# measured on 2-core AMD EPYC machines: 80-110 s idle, about 4.5 minutes busy with other work, 10.5 at a load of 12;
# ninja compiles the sources side by side, so more cores take about as long as the slowest source
BUILD_TIME = "1.5-5 minutes, longer on a busy machine"
STOP_GRACE_S = 10.0  # after SIGTERM, how long the build's group has to end before SIGKILL

# The build child's first lines: when the command that started it is gone (killed outright, with no chance to end
# the build itself), end the build's process group; ninja passes the SIGTERM on to each compiler's group.
WATCH_PARENT = r'''
import json, os, signal, sys, threading, time
spec = json.loads(sys.argv[1])
def _watch_parent():
    while os.getppid() == spec["parent"]:
        time.sleep(0.2)
    os.killpg(os.getpgrp(), signal.SIGTERM)
threading.Thread(target=_watch_parent, daemon=True).start()
'''
BUILD_SCRIPT = WATCH_PARENT + r'''
from torch.utils import cpp_extension
try:
    cpp_extension.load(name=spec["name"], sources=spec["sources"], extra_cflags=spec["cflags"],
                       extra_ldflags=spec["ldflags"], build_directory=spec["directory"], verbose=False)
except Exception as error:
    sys.exit("\n" + FAILED_MARK + "\n" + str(error))
'''.replace("FAILED_MARK", repr(FAILED_MARK))


def _build_name() -> str:
    """The extension's name: the sources, the flags and this CPU's instruction sets (-march=native) in a
    hash, so a changed source, or a cache shared by machines of different CPUs, never loads a stale build."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    digest.update(" ".join(CFLAGS + _capability_flags()).encode())
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        flags = next((line for line in cpuinfo.read_text(errors="replace").splitlines()
                      if line.startswith("flags")), "")
        digest.update(flags.encode())
    # what the library is compiled against, which TORCH_EXTENSIONS_DIR does not separate (it drops PyTorch's
    # per-Python subfolder); install paths are left out on purpose, so environments share the build
    digest.update(f"torch {torch.__version__} {torch.version.git_version}".encode())
    digest.update(f"python {sys.implementation.cache_tag} {sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    return f"multibranch_cpu_kernels_{digest.hexdigest()[:12]}"


def enabled() -> bool:
    """Whether the kernels may be used at all (the environment switch; default on)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def _wait_limit() -> float:
    try:
        return max(0.0, float(os.environ.get(WAIT_ENV, DEFAULT_WAIT_S)))
    except ValueError:
        return DEFAULT_WAIT_S


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[int | None]:
    """The build directory's lock, waited for at most `_wait_limit()` seconds (TimeoutError after); yields its
    file descriptor (None where there is no flock), which a build child inherits so that the lock outlives a killed
    command until its build has stopped too. An flock is released by the kernel when the last process holding
    it exits, even by SIGKILL: a lock held is always a build under way."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: build unguarded, as PyTorch alone would
        yield None
        return
    path = directory / LOCK_FILE
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            limit = _wait_limit()
            handle.seek(0)
            owner = handle.read().strip() or "another process"
            print(f"waiting for {owner} to finish building multibranch's CPU kernels in {directory} "
                  f"(at most {limit:.0f} s)", file=sys.stderr, flush=True)
            deadline = time.monotonic() + limit
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"{owner} was still building them in {directory} after {limit:.0f} s "
                                           f"({WAIT_ENV} sets the wait)") from None
                    time.sleep(0.2)
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}@{socket.gethostname()}")
            handle.flush()
            yield handle.fileno()
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)


def _copy_sources(directory: Path) -> list[str]:
    """The sources copied into the build directory (rewritten only when changed, so ninja sees them unchanged)."""
    target = directory / SOURCE_COPY
    target.mkdir(exist_ok=True)
    copies = []
    for source in SOURCES:
        copy = target / source.name
        if not copy.is_file() or copy.read_bytes() != source.read_bytes():
            shutil.copyfile(source, copy)
        copies.append(str(copy))
    return copies


def _import_built(name: str, directory: Path) -> ModuleType:
    library = directory / f"{name}.so"
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_command(spec: dict[str, object]) -> list[str]:
    """The build child's command line: `BUILD_SCRIPT` (PyTorch's `cpp_extension.load`) on `spec`."""
    return [sys.executable, "-c", BUILD_SCRIPT, json.dumps(spec)]


def _stop_group(child: subprocess.Popen) -> None:
    """End the build child's process group: SIGTERM (ninja ends its compilers), SIGKILL after `STOP_GRACE_S`."""
    if not hasattr(os, "killpg"):  # no process groups: the child alone
        child.terminate()
        child.wait()
        return
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)
        try:
            child.wait(STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _run_build(spec: dict[str, object], directory: Path, lock: int | None) -> None:
    """Run the build child in a process group of its own and wait for it; whatever stops the wait (Ctrl-C, SIGTERM as
    the CLI's Terminated, any error) ends the build's process group first. RuntimeError (the child's message) when
    the build fails."""
    log = directory / BUILD_LOG
    with open(log, "wb") as output:
        child = subprocess.Popen(_build_command(spec), stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                                 start_new_session=True, pass_fds=() if lock is None else (lock,))
        try:
            status = child.wait()
        except BaseException:
            _stop_group(child)
            raise
    if status != 0:
        output = log.read_text(errors="replace")
        message = output.rpartition(FAILED_MARK)[2].strip() or f"the build exited with status {status}"
        first, _, rest = message.partition("\n")
        raise RuntimeError(f"{first} (the build's output: {log})\n{rest}")


def _build(name: str, directory: Path, lock: int | None = None) -> ModuleType:
    """Compile the library into `directory` (the caller holds the build lock, `lock` its descriptor), mark it
    complete and import it."""
    # PyTorch's own lock file, without an owner: under our lock, one found here was left by a killed build and
    # would make PyTorch wait for ever
    with contextlib.suppress(FileNotFoundError):
        (directory / "lock").unlink()
    print(f"building multibranch's CPU kernels in {directory}: a one-time build for this machine and source "
          f"version, {BUILD_TIME}; later runs load it at once", file=sys.stderr, flush=True)
    start = time.monotonic()
    spec = {"name": name, "sources": _copy_sources(directory), "cflags": CFLAGS + _capability_flags(),
            "ldflags": ["-lm"], "directory": str(directory), "parent": os.getpid()}
    _run_build(spec, directory, lock)
    print(f"built multibranch's CPU kernels in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    marker = directory / f".{COMPLETE_FILE}.{os.getpid()}"
    marker.write_text(f"{name}.so\n")
    os.replace(marker, directory / COMPLETE_FILE)
    return _import_built(name, directory)


@functools.cache
def kernels() -> ModuleType | None:
    """The compiled extension, built on the first call (then imported from the extension cache); None when
    switched off, when it cannot be built, or when another process's build outlasts the wait (one warning)."""
    if not enabled():
        return None
    try:
        from torch.utils.cpp_extension import _get_build_directory

        name = _build_name()
        directory = Path(_get_build_directory(name, verbose=False))
        if (directory / COMPLETE_FILE).is_file():
            return _import_built(name, directory)
        with _build_lock(directory) as lock:
            if (directory / COMPLETE_FILE).is_file():  # built by the process this one waited for
                return _import_built(name, directory)
            return _build(name, directory, lock)
    except Exception as error:  # noqa: BLE001 - any build failure means "decode without the kernels"
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        warnings.warn(f"multibranch's CPU kernels could not be built ({first_line}); PyTorch operations stand in "
                      f"for them (set {ENV_SWITCH}=0 to skip the attempt)", stacklevel=2)
        return None


def usable(*tensors: Tensor) -> bool:
    """Whether these tensors can go through the kernels: fp32 CPU tensors, and the kernels built."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and kernels() is not None
