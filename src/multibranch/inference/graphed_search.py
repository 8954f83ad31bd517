"""Running a fixed-shape search (`static_beam.StaticBeamSearch`), on CUDA as one graph replayed per step.

Step 0 runs eagerly: it computes the cross-attention keys/values, allocates every cache buffer and warms up
the kernels. The next step is then captured as a CUDA graph (recorded, not run) and replayed for it and every
later step: one launch a step instead of a few hundred, and the host reads one boolean a step (whether every
sentence is done). Everything the step touches keeps its address for the whole search, which is what makes
the replay correct (`StaticDecoderState` writes in place). Where capture fails (an operation a graph cannot
hold), the search goes on eagerly from the same step after one warning: capturing runs nothing, so no state
has moved.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from multibranch.inference.beam import Decodable, Hypothesis
from multibranch.inference.static_beam import StaticBeamSearch

log = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        log.warning("beam search on CUDA runs without CUDA graphs (%s)", reason)


def _captured_step(search: StaticBeamSearch, stream: Any) -> Any:
    """A CUDA graph of `search.step()` on `stream` (not yet run), or None (with one warning) when it cannot
    be captured."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            search.step()
    except Exception as err:  # a capture error leaves the search where it was: nothing ran
        _warn_once(f"{type(err).__name__}: {err}".splitlines()[0][:200])
        return None
    return graph


@torch.inference_mode()
def run_fixed_shape_search(model: Decodable, src: torch.Tensor, beam: int, graphs: bool | None = None,
                           **options: Any) -> list[list[Hypothesis]]:
    """The fixed-shape search of src [B, S]: finished hypotheses per sentence, in the order they were found.
    `graphs` (default: on CUDA) replays one CUDA graph per step after the first."""
    search = StaticBeamSearch(model, src, beam, **options)
    if search.B == 0 or search.steps == 0:
        return [[] for _ in range(search.B)]
    graphs = src.is_cuda if graphs is None else graphs
    if not graphs:
        return _run(search, None)
    stream = torch.cuda.Stream()  # step 0 warms up on the stream the graph is captured on
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        results = _run(search, stream)
    torch.cuda.current_stream().wait_stream(stream)
    return results


def _run(search: StaticBeamSearch, stream: Any) -> list[list[Hypothesis]]:
    """Every step of `search` (a graph replay from step 1 when `stream` is a CUDA stream), then its results."""
    search.start()
    search.step()  # eager: caches allocated, kernels warmed up
    graph = None
    if stream is not None and search.steps > 1 and not search.all_done():
        graph = _captured_step(search, stream)
    for _ in range(1, search.steps):
        if search.all_done():
            break
        if graph is not None:
            graph.replay()
        else:
            search.step()
    return search.results()
