"""multibranch's CPU kernels (`csrc/`), compiled with PyTorch's `cpp_extension` on first use.

A beam-search step composed of PyTorch operations pays per-operation overhead on many small tensors. These
kernels do a step's small parts in one call each, fp32 on the CPU:

- `csrc/decoder_attention.cpp`: a decoder step's self-attention over each hypothesis' own history and its
  cross-attention over a memory shared by a sentence's hypotheses (`modules/fused_attention.py`);
- `csrc/beam_step.cpp`: a beam step's log-softmax normaliser per row and its best (score + token
  log-probability) candidates per sentence (`inference/beam.py`, `inference/candidates.py`);
- `csrc/layer_norm.cpp`: a post-norm residual sublayer's LayerNorm(x + y) in one pass (`models/layers/common.py`);
- `csrc/bindings.cpp`: the Python module.

The extension is built (a C++ compiler and ninja; the `ninja` package is a dependency) into PyTorch's
extension cache (`TORCH_EXTENSIONS_DIR`) the first time it is needed (about a minute, once per machine and
source version; a one-line note says so on stderr). Where it cannot be built, `kernels()` returns None after one
warning and decoding composes PyTorch operations as before; `MULTIBRANCH_CPU_KERNELS=0` turns the kernels off.

The build's directory is named by a hash of what the library depends on: the sources' contents, the flags, this
CPU's instruction sets, the PyTorch version and the Python ABI, and nothing else. So every environment that agrees
on these (two virtualenvs, one reached through a symlink) loads the same build: a finished build is marked
complete and then imported directly, without asking PyTorch (whose build line holds the sources' and PyTorch's
install paths, and so rebuilds for another environment). The sources are compiled from a copy in the build
directory, so the build line does not hold this package's path.

A build holds an OS file lock (`fcntl.flock`, released by the kernel when its process ends, however it ends), so a
build killed midway never leaves a lock behind: the next process takes the lock, clears PyTorch's own `lock` file
left by the killed build, and builds. A process that finds another one building says so on stderr and waits for it
at most `MULTIBRANCH_CPU_KERNELS_WAIT` seconds (default 900), then decodes without the kernels (one warning).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import socket
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
           for name in ("bindings.cpp", "decoder_attention.cpp", "beam_step.cpp", "layer_norm.cpp")]
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
def _build_lock(directory: Path) -> Iterator[None]:
    """The build directory's lock, waited for at most `_wait_limit()` seconds (TimeoutError after). An flock is
    released by the kernel when its holder exits, even by SIGKILL: a lock held is always a build under way."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: build unguarded, as PyTorch alone would
        yield
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
            yield
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


def _build(name: str, directory: Path) -> ModuleType:
    """Compile the library into `directory` (the caller holds the build lock) and mark it complete."""
    import torch.utils.cpp_extension as cpp_extension

    # PyTorch's own lock file, without an owner: under our lock, one found here was left by a killed build and
    # would make PyTorch wait for ever
    with contextlib.suppress(FileNotFoundError):
        (directory / "lock").unlink()
    print(f"building multibranch's CPU kernels in {directory} (once per machine, about a minute)",
          file=sys.stderr, flush=True)
    module = cpp_extension.load(name=name, sources=_copy_sources(directory), extra_cflags=CFLAGS + _capability_flags(),
                                extra_ldflags=["-lm"], build_directory=str(directory), verbose=False)
    marker = directory / f".{COMPLETE_FILE}.{os.getpid()}"
    marker.write_text(f"{name}.so\n")
    os.replace(marker, directory / COMPLETE_FILE)
    return module


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
        with _build_lock(directory):
            if (directory / COMPLETE_FILE).is_file():  # built by the process this one waited for
                return _import_built(name, directory)
            return _build(name, directory)
    except Exception as error:  # noqa: BLE001 - any build failure means "decode without the kernels"
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        warnings.warn(f"multibranch's CPU kernels could not be built ({first_line}); decoding composes PyTorch "
                      f"operations instead (set {ENV_SWITCH}=0 to skip the attempt)", stacklevel=2)
        return None


def usable(*tensors: Tensor) -> bool:
    """Whether these tensors can go through the kernels: fp32 CPU tensors, and the kernels built."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and kernels() is not None
