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
