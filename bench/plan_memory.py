"""Memory of one epoch's batch plan (`data/batching.sharded_token_batches`) for a synthetic sharded corpus:
the peak while planning and what the plan keeps, measured with tracemalloc (which sees numpy's buffers).
The shards' lengths are computed when indexed, as `ShardedSplit.shard_lengths` does; `--eager` holds every
shard's lengths first (the earlier behaviour) and counts them.

    python bench/plan_memory.py --pairs 8000000 [--shards 16] [--eager]
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from multibranch.data.batching import sharded_token_batches  # noqa: E402


class _Shards:
    """(src_lengths, tgt_lengths) of shard k, computed from its offsets when indexed."""

    def __init__(self, offsets: list[np.ndarray]):
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.diff(self.offsets[k])
        return lengths, lengths.copy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=8_000_000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--eager", action="store_true", help="hold every shard's lengths before planning")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    offsets = [np.concatenate([[0], np.cumsum(rng.integers(5, 60, args.pairs // args.shards))])
               for _ in range(args.shards)]  # [n+1] per shard, as prepare writes them
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    lazy = _Shards(offsets)
    shards = [lazy[k] for k in range(len(lazy))] if args.eager else lazy
    plan = sharded_token_batches(shards, args.max_tokens, seed=1, epoch=1)
    del shards
    kept, peak = tracemalloc.get_traced_memory()
    print(f"{args.pairs} pairs in {args.shards} shards ({'eager' if args.eager else 'lazy'} lengths): "
          f"peak while planning {(peak - base) / 2**20:.0f} MB, kept {(kept - base) / 2**20:.0f} MB "
          f"({len(plan)} batches of {plan[0].dtype})")


if __name__ == "__main__":
    main()
