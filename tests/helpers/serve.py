"""Driving the serve app in process: its lifespan run by hand, an httpx client, and a stub engine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan running (worker started; on exit: accepted requests finished)."""
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            yield client


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


class BlockingEngine:
    """Echoes upper-cased texts; every call waits for `release` and records its batch."""

    default_beam = 4

    def __init__(self, block: bool = True):
        self.calls: list[list[str]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        if not block:
            self.release.set()

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(t.split()) + 1 for t in texts]

    def translate(self, texts: list[str], beam: int, nbest: int) -> list[list[tuple[str, float]]]:
        self.calls.append(list(texts))
        self.started.set()
        assert self.release.wait(30)
        return [[(f"{t.upper()}#{k}", -float(k)) for k in range(nbest)] for t in texts]

    def info(self) -> dict[str, Any]:
        return {"engine": "stub"}


async def wait_until(predicate: Any) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


READY_TIMEOUT_S = 180.0  # a server starting on a loaded CI machine (imports, model load) must not miss this
STOP_TIMEOUT_S = 30.0


class ServerProcess:
    """A server command in its own process, its stderr read line by line by a thread (`lines`, None at its end).
    `stop()` ends it whatever state it is in: SIGTERM, a bounded wait, then SIGKILL."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None):
        import os
        import queue
        import subprocess

        # Ctrl-C restored to its default in the server: a test run started in the background (`cmd &` without
        # job control) ignores SIGINT, and its children would inherit that
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                        env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
                                        preexec_fn=_default_sigint)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, text: str, timeout_s: float = READY_TIMEOUT_S) -> list[str]:
        """stderr lines up to the first one containing `text`; fails when the process ends first (at once, with
        what it printed) or when `timeout_s` passes."""
        import queue
        import time

        deadline = time.monotonic() + timeout_s
        seen: list[str] = []
        while not seen or text not in seen[-1]:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {text!r} from the server in {timeout_s:.0f} s: {''.join(seen)}") from None
            if line is None:
                code = self.process.wait(STOP_TIMEOUT_S)
                raise AssertionError(f"the server exited ({code}) before {text!r}: {''.join(seen)}")
            seen.append(line)
            self.seen.append(line)
        return seen

    def wait_healthy(self, port: int, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Polls GET /health until it answers 200; fails early when the process exits."""
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited ({self.process.returncode}) before /health answered")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                raise AssertionError(f"/health did not answer 200 within {timeout_s:.0f} s")
            time.sleep(0.2)

    def rest(self, timeout_s: float = READY_TIMEOUT_S) -> tuple[int, str]:
        """Its exit status (waiting at most `timeout_s`) and its remaining stderr."""
        code = self.process.wait(timeout_s)
        rest = []
        while (line := self.lines.get(timeout=timeout_s)) is not None:  # up to the end of the pipe
            rest.append(line)
        return code, "".join(rest)

    def stop(self) -> None:
        import subprocess

        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self.reader.join(STOP_TIMEOUT_S)  # the pipe ends with the process (or with a child that kept it open)


def _default_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
