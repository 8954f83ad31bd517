"""Server limits and batching settings (validated once, before the model is loaded)."""

from __future__ import annotations

from dataclasses import dataclass

from multibranch.config import bounded, check_fields


@dataclass(frozen=True)
class ServeLimits:
    """Per-request limits, queue bound, batching and timeouts of the server.

    max_items: texts per request; max_chars: characters per text; max_total_chars: per request;
    max_body_bytes: bytes of a request body (larger ones get 413 before they are read whole or parsed).
    max_queue: requests waiting for the worker (beyond it: 503 + Retry-After).
    batch_tokens: source tokens (x beam) the worker gathers before translating; max_wait_ms: how long
    it waits for more requests after the first one arrives. timeout_s: request timeout (504).
    max_beam: the largest beam a request may ask for.
    """

    max_items: int = bounded(64, ge=1)
    max_chars: int = bounded(1000, ge=1)
    max_total_chars: int = bounded(20000, ge=1)
    max_body_bytes: int = bounded(1 << 20, ge=1024)
    max_queue: int = bounded(256, ge=1)
    batch_tokens: int = bounded(4096, ge=1)
    max_wait_ms: float = bounded(5.0, ge=0)
    timeout_s: float = bounded(30.0, gt=0)
    max_beam: int = bounded(16, ge=1)
    retry_after_s: int = bounded(1, ge=1)

    def validate(self) -> None:
        check_fields(self)
