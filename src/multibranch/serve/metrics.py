"""Prometheus metrics of one server (its own registry, so several apps can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class ServeMetrics:
    """Request latency, in-flight requests, queue depth, batch sizes and translated tokens."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram("multibranch_request_latency_seconds",
                                 "latency of every response but to GET /health, /info, /metrics, by status",
                                 ["status"], registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.in_flight = Gauge("multibranch_requests_in_flight", "/translate and /classify requests being handled",
                               registry=self.registry)
        self.queue_depth = Gauge("multibranch_queue_depth", "requests waiting for the worker", registry=self.registry)
        self.batch_sentences = Histogram("multibranch_batch_sentences", "sentences per engine call",
                                         registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        self.batch_requests = Histogram("multibranch_batch_requests", "requests merged into one engine call",
                                        registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self.source_tokens = Counter("multibranch_source_tokens", "source tokens translated", registry=self.registry)
        self.engine_seconds = Counter("multibranch_engine_seconds", "time spent in engine calls",
                                      registry=self.registry)
        self.rejected = Counter("multibranch_rejected", "requests refused or abandoned", ["reason"],
                                registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
