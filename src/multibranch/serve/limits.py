"""Server limits and batching settings (validated once, before the model is loaded)."""

from __future__ import annotations

from dataclasses import dataclass

from multibranch.config import ConfigError


@dataclass(frozen=True)
class ServeLimits:
    """Per-request limits, queue bound, batching and timeouts of the server.

    max_items: texts per request; max_chars: characters per text; max_total_chars: per request.
    max_queue: requests waiting for the worker (beyond it: 503 + Retry-After).
    batch_tokens: source tokens (x beam) the worker gathers before translating; max_wait_ms: how long
    it waits for more requests after the first one arrives. timeout_s: request timeout (504).
    max_beam: the largest beam a request may ask for.
    """

    max_items: int = 64
    max_chars: int = 1000
    max_total_chars: int = 20000
    max_queue: int = 256
    batch_tokens: int = 4096
    max_wait_ms: float = 5.0
    timeout_s: float = 30.0
    max_beam: int = 16
    retry_after_s: int = 1

    def validate(self) -> None:
        for name in ("max_items", "max_chars", "max_total_chars", "max_queue", "batch_tokens", "max_beam",
                     "retry_after_s"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        if self.max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms={self.max_wait_ms} must be >= 0")
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s={self.timeout_s} must be > 0")
