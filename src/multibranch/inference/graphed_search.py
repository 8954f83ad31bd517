"""Running a fixed-shape decoding (`static_decoding.StaticDecoding`: the beam search of `static_beam`, the sampler
of `sampling`), on CUDA as one graph replayed per step.

`FixedShapes` keeps one engine per shape bucket — (sentences rounded up to a power of two, source length rounded
up to a multiple of `SOURCE_BUCKET`, and what else the engine is built from: options, samples per sentence) — and
reuses its buffers for every batch that fits: the batch is copied in, step 0 runs eagerly (it computes the
cross-attention keys/values into the same buffers), and every later step replays the bucket's CUDA graph, captured
on its first batch: one launch a step instead of a few hundred, and the host reads one boolean a step (whether
every row is done). The first step of the first batch also allocates the caches and warms the kernels up on the
stream the graph is captured on. A user's random generator (sampling) is registered with the graph, so every
replay draws new numbers from it. Where capture fails (an operation a graph cannot hold), the bucket runs eagerly
after one warning: capturing runs nothing, so no state has moved. Without graphs (the CPU, tests) the same buckets
run every step eagerly. `FixedShapeSearcher` is the beam search's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from multibranch.inference.beam import Decodable, Hypothesis
from multibranch.inference.static_beam import StaticBeamSearch
from multibranch.inference.static_decoding import StaticDecoding

if TYPE_CHECKING:
    from multibranch.experiment.decoding import DecodeConfig

log = logging.getLogger(__name__)
SOURCE_BUCKET = 16  # source lengths round up to a multiple of this
MAX_BUCKETS = 8  # engines (with their buffers and graphs) kept per runner, least recently used dropped
_warned: set[tuple[str, str]] = set()


def _warn_once(kind: str, reason: str) -> None:
    if (kind, reason) not in _warned:
        _warned.add((kind, reason))
        log.warning("%s on CUDA runs without CUDA graphs (%s)", kind, reason)


def bucket_shape(sentences: int, src_len: int, cfg: object) -> tuple[int, int]:
    """The buffers' (rows, source length) for a batch: a power of two, a multiple of SOURCE_BUCKET (at most a
    learned-positions model's max_positions, and never below the batch's own length)."""
    length = -(-src_len // SOURCE_BUCKET) * SOURCE_BUCKET
    if getattr(cfg, "positions", None) == "learned":
        length = max(min(length, cfg.max_positions), src_len)  # type: ignore[attr-defined]
    return 1 << max(sentences - 1, 0).bit_length(), length


class _Bucket:
    """One shape's engine, its CUDA graph (None until captured, or when it cannot be), stream and the random
    generator its steps draw from (None: none, or the default one)."""

    def __init__(self, engine: StaticDecoding, graphs: bool, generator: torch.Generator | None = None) -> None:
        self.engine = engine
        self.graphs = graphs
        self.generator = generator
        self.graph: Any = None
        self.stream: Any = torch.cuda.Stream(engine.device) if graphs else None

    def run(self, src: Tensor, prefix: Tensor | None) -> list[list[Hypothesis]]:
        if self.stream is None:
            return self._steps(src, prefix)
        self.stream.wait_stream(torch.cuda.current_stream(self.engine.device))
        with torch.cuda.stream(self.stream):
            found = self._steps(src, prefix)
        torch.cuda.current_stream(self.engine.device).wait_stream(self.stream)
        return found

    def _steps(self, src: Tensor, prefix: Tensor | None) -> list[list[Hypothesis]]:
        engine = self.engine
        engine.load(src, prefix)
        engine.step()  # eager: this batch's cross-attention keys/values (and, first, the caches' allocation)
        for _ in range(1, engine.steps):
            if engine.all_done():
                break
            if self.graphs and self.graph is None:
                self.graph = self._capture()
                self.graphs = self.graph is not None
            if self.graph is not None:
                self.graph.replay()
            else:
                engine.step()
        return engine.results()

    def _capture(self) -> Any:
        """A CUDA graph of one step (recorded, not run), or None (with one warning) where it cannot be captured."""
        graph = torch.cuda.CUDAGraph()
        try:
            if self.generator is not None:  # replays advance it (the default generator is registered anyway)
                graph.register_generator_state(self.generator)
            with torch.cuda.graph(graph, stream=self.stream):
                self.engine.step()
        except Exception as err:  # a capture error leaves the engine where it was: nothing ran
            _warn_once(self.engine.kind, f"{type(err).__name__}: {err}".splitlines()[0][:200])
            return None
        return graph


class FixedShapes:
    """Fixed-shape engines of one model, with their buffers and graphs kept per shape bucket across batches.
    `graphs` (default: on CUDA) replays one CUDA graph per step after a bucket's first; `generator` is the one
    the engines draw from (sampling); `bucketed=False` sizes the buffers to each batch exactly (a runner for one
    batch: no padding rows to compute)."""

    def __init__(self, model: Decodable, graphs: bool | None = None, *, generator: torch.Generator | None = None,
                 bucketed: bool = True) -> None:
        self.model = model
        self.graphs = graphs
        self.generator = generator
        self.bucketed = bucketed
        self.buckets: OrderedDict[tuple, _Bucket] = OrderedDict()

    def _run(self, src: Tensor, prefix: Tensor | None, key: tuple,
             make: Callable[[int, int], StaticDecoding]) -> list[list[Hypothesis]]:
        """src [B, S] through the bucket of its shape and `key` (what else the engine is built from), made by
        `make(rows, src_len)` the first time."""
        if src.shape[0] == 0:
            return []
        rows, src_len = bucket_shape(*src.shape, self.model.config) if self.bucketed else src.shape
        key = (rows, src_len, prefix is not None, *key)
        bucket = self.buckets.pop(key, None)
        if bucket is None:
            graphs = src.is_cuda if self.graphs is None else self.graphs
            bucket = _Bucket(make(rows, src_len), graphs, self.generator)
        self.buckets[key] = bucket  # most recently used last
        while len(self.buckets) > MAX_BUCKETS:
            self.buckets.popitem(last=False)
        return bucket.run(src, prefix)


class FixedShapeSearcher(FixedShapes):
    """The fixed-shape beam search (`static_beam`) of one model."""

    @torch.inference_mode()
    def search(self, src: Tensor, options: DecodeConfig, prefix: Tensor | None = None) -> list[list[Hypothesis]]:
        """Finished hypotheses per sentence of src [B, S], in the order they were found, under `options` (the
        beam, length penalty, limits, min length, n-gram blocking)."""
        options = dataclasses.replace(options)  # a copy: the bucket keeps it
        return self._run(src, prefix, dataclasses.astuple(options), lambda rows, src_len: StaticBeamSearch(
            self.model, rows, src_len, options, prefixed=prefix is not None, device=src.device))


def run_fixed_shape_search(model: Decodable, src: Tensor, options: DecodeConfig, graphs: bool | None = None,
                           prefix: Tensor | None = None) -> list[list[Hypothesis]]:
    """One batch through a fresh FixedShapeSearcher (nothing kept for later batches)."""
    return FixedShapeSearcher(model, graphs).search(src, options, prefix)
