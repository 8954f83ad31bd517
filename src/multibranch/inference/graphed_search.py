"""Running the fixed-shape search (`static_beam.StaticBeamSearch`), on CUDA as one graph replayed per step.

A `FixedShapeSearcher` keeps one search per shape bucket — (sentences rounded up to a power of two, source
length rounded up to a multiple of `SOURCE_BUCKET`, beam and options) — and reuses its buffers for every batch
that fits: the batch is copied in, step 0 runs eagerly (it computes the cross-attention keys/values into the
same buffers), and every later step replays the bucket's CUDA graph, captured on its first batch: one launch a
step instead of a few hundred, and the host reads one boolean a step (whether every sentence is done). The
first step of the first batch also allocates the caches and warms the kernels up on the stream the graph is
captured on. Where capture fails (an operation a graph cannot hold), the bucket runs eagerly after one
warning: capturing runs nothing, so no state has moved. Without graphs (the CPU, tests) the same buckets run
every step eagerly.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from multibranch.inference.beam import Decodable, Hypothesis
from multibranch.inference.static_beam import StaticBeamSearch

if TYPE_CHECKING:
    from multibranch.experiment.decoding import DecodeConfig

log = logging.getLogger(__name__)
SOURCE_BUCKET = 16  # source lengths round up to a multiple of this
MAX_BUCKETS = 8  # searches (with their buffers and graphs) kept per searcher, least recently used dropped
_warned: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        log.warning("beam search on CUDA runs without CUDA graphs (%s)", reason)


def bucket_shape(sentences: int, src_len: int, cfg: object) -> tuple[int, int]:
    """The buffers' (rows, source length) for a batch: a power of two, a multiple of SOURCE_BUCKET (at most a
    learned-positions model's max_positions, and never below the batch's own length)."""
    length = -(-src_len // SOURCE_BUCKET) * SOURCE_BUCKET
    if getattr(cfg, "positions", None) == "learned":
        length = max(min(length, cfg.max_positions), src_len)  # type: ignore[attr-defined]
    return 1 << max(sentences - 1, 0).bit_length(), length


class _Bucket:
    """One shape's search, its CUDA graph (None until captured, or when it cannot be) and stream."""

    def __init__(self, search: StaticBeamSearch, graphs: bool) -> None:
        self.search = search
        self.graphs = graphs
        self.graph: Any = None
        self.stream: Any = torch.cuda.Stream(search.device) if graphs else None

    def run(self, src: Tensor, prefix: Tensor | None) -> list[list[Hypothesis]]:
        if self.stream is None:
            return self._steps(src, prefix)
        self.stream.wait_stream(torch.cuda.current_stream(self.search.device))
        with torch.cuda.stream(self.stream):
            found = self._steps(src, prefix)
        torch.cuda.current_stream(self.search.device).wait_stream(self.stream)
        return found

    def _steps(self, src: Tensor, prefix: Tensor | None) -> list[list[Hypothesis]]:
        search = self.search
        search.load(src, prefix)
        search.step()  # eager: this batch's cross-attention keys/values (and, first, the caches' allocation)
        for _ in range(1, search.steps):
            if search.all_done():
                break
            if self.graphs and self.graph is None:
                self.graph = self._capture()
                self.graphs = self.graph is not None
            if self.graph is not None:
                self.graph.replay()
            else:
                search.step()
        return search.results()

    def _capture(self) -> Any:
        """A CUDA graph of one step (recorded, not run), or None (with one warning) where it cannot be captured."""
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream):
                self.search.step()
        except Exception as err:  # a capture error leaves the search where it was: nothing ran
            _warn_once(f"{type(err).__name__}: {err}".splitlines()[0][:200])
            return None
        return graph


class FixedShapeSearcher:
    """The fixed-shape search of one model, with its buffers and graphs kept per shape bucket across batches.
    `graphs` (default: on CUDA) replays one CUDA graph per step after a bucket's first."""

    def __init__(self, model: Decodable, graphs: bool | None = None) -> None:
        self.model = model
        self.graphs = graphs
        self.buckets: OrderedDict[tuple, _Bucket] = OrderedDict()

    @torch.inference_mode()
    def search(self, src: Tensor, options: DecodeConfig, prefix: Tensor | None = None) -> list[list[Hypothesis]]:
        """Finished hypotheses per sentence of src [B, S], in the order they were found, under `options` (the
        beam, length penalty, limits, min length, n-gram blocking)."""
        if src.shape[0] == 0:
            return []
        rows, src_len = bucket_shape(*src.shape, self.model.config)
        key = (rows, src_len, prefix is not None, dataclasses.astuple(options))  # every option: a copy of them is kept
        bucket = self.buckets.pop(key, None)
        if bucket is None:
            graphs = src.is_cuda if self.graphs is None else self.graphs
            search = StaticBeamSearch(self.model, rows, src_len, dataclasses.replace(options),
                                      prefixed=prefix is not None, device=src.device)
            bucket = _Bucket(search, graphs)
        self.buckets[key] = bucket  # most recently used last
        while len(self.buckets) > MAX_BUCKETS:
            self.buckets.popitem(last=False)
        return bucket.run(src, prefix)


def run_fixed_shape_search(model: Decodable, src: Tensor, options: DecodeConfig, graphs: bool | None = None,
                           prefix: Tensor | None = None) -> list[list[Hypothesis]]:
    """One batch through a fresh FixedShapeSearcher (nothing kept for later batches)."""
    return FixedShapeSearcher(model, graphs).search(src, options, prefix)
