"""Micro-batching across concurrent requests: a bounded queue and one worker that owns the engine.

Requests are queued whole (their texts stay together), each with its engine call: the engine method
and its settings (`("translate", beam, nbest)`, `("classify",)`). The worker takes the oldest
request, then keeps gathering requests with the same call until the batch holds `batch_tokens`
source tokens x the call's weight (the beam) or `max_wait_ms` has passed since the first one, runs
the texts of all of them in one engine call (in a single worker thread, so the one model copy is
never used concurrently), and resolves each request's future with its own slice of the results.
Requests with another call wait for the next round, at the head of the queue.
A request whose caller has gone (timeout, disconnect) is dropped before the engine call; once every request of
an engine call under way has gone, an engine with `abandon()` is told to stop it before its next batch.
`run_exclusive` runs another engine call (an attention map) on the same worker thread, between
batches, counted against the same queue bound. `drain` stops accepting (ShuttingDown) and waits for
every accepted request without blocking the event loop, so a server can keep refusing new requests
with 503 while it finishes the accepted ones.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from multibranch.serve.engine import Engine
from multibranch.serve.limits import ServeLimits
from multibranch.serve.metrics import ServeMetrics
from multibranch.tasks.translation.translator import Abandoned

T = TypeVar("T")


class QueueFull(Exception):
    """The queue holds `max_queue` requests (answer 503 + Retry-After)."""


class ShuttingDown(Exception):
    """The server no longer accepts requests."""


@dataclass
class Job:
    """One request: its texts, their source tokens, the engine call `key` (method name, settings...) and
    its `weight` (tokens count `weight` times against the batch budget: the beam)."""

    texts: list[str]
    tokens: int
    key: tuple[Any, ...]
    weight: int
    future: asyncio.Future[list[Any]] = field(repr=False)
    alone: bool = False  # decoded in an engine call of its own (a seeded sample: the same samples every time)


class MicroBatcher:
    """The queue and its worker. `start()` inside the running loop, `submit()` per request,
    `close()` to stop accepting and finish every accepted request."""

    def __init__(self, engine: Engine, limits: ServeLimits, metrics: ServeMetrics):
        self.engine, self.limits, self.metrics = engine, limits, metrics
        self._pending: collections.deque[Job] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="multibranch-engine")
        self._closing = False
        self._exclusive: set[asyncio.Future[Any]] = set()  # run_exclusive calls accepted and not finished

    @property
    def depth(self) -> int:
        return len(self._pending) + len(self._exclusive)

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._worker = asyncio.get_running_loop().create_task(self._run(), name="multibranch-batcher")

    async def submit(self, texts: list[str], tokens: int, beam: int, nbest: int) -> list[Any]:
        """Queue one translation request and wait for its n-best lists (see `submit_call`)."""
        return await self.submit_call(texts, tokens, ("translate", beam, nbest), weight=beam)

    async def submit_call(self, texts: list[Any], tokens: int, key: tuple[Any, ...], weight: int = 1,
                          alone: bool = False) -> list[Any]:
        """Queue one request for the engine call `key` (`engine.<key[0]>(texts, *key[1:])`, one result
        per text; `alone`: never merged with other requests) and wait for its results (raises QueueFull,
        ShuttingDown, TimeoutError after limits.timeout_s; a timed-out request is dropped from the queue)."""
        if self._closing or self._wakeup is None:
            raise ShuttingDown
        if self.depth >= self.limits.max_queue:
            raise QueueFull
        job = Job(texts, tokens, key, weight, asyncio.get_running_loop().create_future(), alone)
        self._pending.append(job)
        self.metrics.queue_depth.set(self.depth)
        self._wakeup.set()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), self.limits.timeout_s)
        finally:
            if not job.future.done():  # timeout or the caller was cancelled: nobody waits for it
                job.future.cancel()
                self._discard(job)

    async def run_exclusive(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the engine's worker thread, never concurrently with a batch (raises
        QueueFull, ShuttingDown, TimeoutError after limits.timeout_s: a call still waiting for the
        thread is then dropped, one already started finishes in the background and close() waits
        for it)."""
        if self._closing or self._wakeup is None:
            raise ShuttingDown
        if self.depth >= self.limits.max_queue:
            raise QueueFull
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        self._exclusive.add(future)
        future.add_done_callback(self._finish_exclusive)
        self.metrics.queue_depth.set(self.depth)
        return await asyncio.wait_for(future, self.limits.timeout_s)  # timeout: future.cancel()

    def _finish_exclusive(self, future: asyncio.Future[Any]) -> None:
        self._exclusive.discard(future)
        self.metrics.queue_depth.set(self.depth)

    def _discard(self, job: Job) -> None:
        try:
            self._pending.remove(job)
        except ValueError:
            pass  # already taken by the worker, which skips cancelled jobs
        self.metrics.queue_depth.set(self.depth)

    @property
    def closing(self) -> bool:
        """True once a shutdown has begun (`drain` or `close`): new requests raise ShuttingDown."""
        return self._closing

    def stop_accepting(self) -> None:
        """From now on `submit` and `run_exclusive` raise ShuttingDown; the worker stops once the queue
        is empty."""
        self._closing = True
        if self._wakeup is not None:
            self._wakeup.set()

    async def drain(self) -> None:
        """Stop accepting and wait until every accepted request is answered: the queued ones and the
        batch in progress (the worker then stops) and the `run_exclusive` calls still waited for.
        Never blocks the event loop, so requests arriving meanwhile are refused at once."""
        self.stop_accepting()
        if self._worker is not None:
            await asyncio.shield(self._worker)
        while self._exclusive:
            await asyncio.wait(list(self._exclusive))

    async def close(self) -> None:
        """`drain`, then stop the engine thread (waiting for a call whose caller has timed out)."""
        await self.drain()
        self._executor.shutdown(wait=True)

    # ---- the worker ---------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = await self._gather()
            if batch:
                await self._call(batch)

    async def _gather(self) -> list[Job]:
        """The oldest live request plus later ones with its setting, up to the token budget or the
        maximum wait."""
        assert self._wakeup is not None
        deadline = time.monotonic() + self.limits.max_wait_ms / 1000
        batch: list[Job] = []
        tokens = 0
        while True:
            budget = self.limits.batch_tokens
            for job in list(self._pending):
                if job.future.done():
                    self._pending.remove(job)
                    continue
                if batch and (job.key != batch[0].key or job.alone or batch[0].alone
                              or (tokens + job.tokens) * job.weight > budget):
                    continue
                self._pending.remove(job)
                batch.append(job)
                tokens += job.tokens
                if tokens * job.weight >= budget:
                    break
            self.metrics.queue_depth.set(self.depth)
            remaining = deadline - time.monotonic()
            if (not batch or batch[0].alone or tokens * batch[0].weight >= self.limits.batch_tokens or remaining <= 0
                    or self._closing):
                return batch
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def _call(self, batch: list[Job]) -> None:
        live = [job for job in batch if not job.future.done()]
        if not live:
            return
        texts = [text for job in live for text in job.texts]
        method, *settings = live[0].key
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        running = True
        abandon = getattr(self.engine, "abandon", None)

        def gone(_: asyncio.Future[Any]) -> None:  # every caller of the call under way has given up: stop it
            if running and abandon is not None and all(job.future.cancelled() for job in live):
                abandon()

        for job in live:
            job.future.add_done_callback(gone)
        try:
            results = await loop.run_in_executor(self._executor, getattr(self.engine, method), texts, *settings)
        except Abandoned:  # stopped for nobody: every future is cancelled already
            return
        except Exception as err:  # the engine failed: every request of the batch gets the error (500)
            for job in live:
                if not job.future.done():
                    job.future.set_exception(err)
            return
        finally:
            running = False
        self.metrics.engine_seconds.inc(time.perf_counter() - start)
        self.metrics.batch_sentences.observe(len(texts))
        self.metrics.batch_requests.observe(len(live))
        self.metrics.source_tokens.inc(sum(job.tokens for job in live))
        offset = 0
        for job in live:
            part = results[offset:offset + len(job.texts)]
            offset += len(job.texts)
            if not job.future.done():
                job.future.set_result(part)
