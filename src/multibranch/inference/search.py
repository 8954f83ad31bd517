"""The search a DecodeConfig asks for, on the engine that suits the device.

On the CPU: `beam.beam_search` (its batch shrinks as sentences finish; greedy for beam 1; the C++ kernels where
they are built). On CUDA: the fixed-shape search (`static_beam`), one CUDA graph replayed per step
(`graphed_search`). Both give the same hypotheses and scores (the tests compare them); `fixed_shapes` picks one
explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from multibranch.inference.beam import Decodable, Hypothesis, beam_search, best_first
from multibranch.inference.graphed_search import FixedShapeSearcher

if TYPE_CHECKING:
    from multibranch.experiment.decoding import DecodeConfig


def search(model: Decodable, src: Tensor, cfg: DecodeConfig, nbest: int | None = None,
           prefix: Tensor | None = None, fixed_shapes: bool | None = None,
           searcher: FixedShapeSearcher | None = None) -> list[list[Hypothesis]]:
    """Decode src [B, S] with a DecodeConfig (greedy when beam == 1); `nbest` overrides cfg.nbest;
    `prefix` [B, P] (pad_id-padded) forces each sentence's first output tokens. `fixed_shapes` (default: on
    CUDA) runs the fixed-shape search, through `searcher` when given (a caller decoding many batches keeps one:
    its buffers and CUDA graphs are reused batch after batch). Per sentence, its best hypotheses first."""
    nbest = cfg.nbest if nbest is None else nbest
    if fixed_shapes if fixed_shapes is not None else src.is_cuda:
        searcher = searcher if searcher is not None else FixedShapeSearcher(model)
        return best_first(searcher.search(src, cfg, prefix), nbest)
    return beam_search(model, src, cfg, nbest=nbest, prefix=prefix)
