"""Padding overhead and batch shapes of fixed-shape length buckets against today's token batches.

For one epoch's batches (seed 1, epoch 0) of `token_batches` (each batch padded to its own longest
source / target + 1) and of `bucketed_token_batches` with at most 4, 8 and 16 buckets (each batch padded
to its bucket's (rows, L, L), filler rows included) whose lengths `length_buckets` chose by least padding
(its default) or at quantiles (fairseq's way), at max_tokens 4096 and 16384, it reports:
  - padding overhead: (padded - real) / real tokens, source and target tensors together, as the tensors
    hold them (real = every example's source + EOS and target + EOS; padded = B*S + B*T per batch);
  - distinct (B, S, T) shapes in the epoch (what a CUDA-graph trainer must capture), and batches.
A "floor" row pads each example alone to its size rounded up to 8, source and target alike: what any
number of buckets with L = S = T (multiples of 8) still pays. No model runs: this is arithmetic on the
lengths only (seconds on a CPU).

Data: (a) Multi30k En-De train as prepared by bench.common.multi30k_data() (8k joint SentencePiece);
(b) SYNTHETIC WMT-shaped lengths (not WMT data): 1M pairs, source length log-normal with median 25
subwords and sigma 0.6 (so p99 ~ 100), rounded, clipped to [1, 256]; target = source times a
log-normal ratio with median 1.1 and sigma 0.15, rounded, clipped to [1, 256]; numpy seed 0.

    MULTIBRANCH_BENCH_DIR=runs/bench PYTHONPATH=src:. python bench/bucket_padding.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import environment, multi30k_data, save_results  # noqa: E402
from multibranch.data.batching import (  # noqa: E402
    batch_shapes,
    bucketed_token_batches,
    length_buckets,
    token_batches,
)

BUDGETS = (4096, 16384)
BUCKETS = (4, 8, 16)
METHODS = ("padding", "quantile")
SEED, EPOCH = 1, 0


def multi30k_lengths() -> tuple[np.ndarray, np.ndarray]:
    from multibranch.tasks.translation.dataset import PreparedData

    train = PreparedData.load(multi30k_data()).split("train")
    return np.asarray(train.src_lengths), np.asarray(train.tgt_lengths)


def synthetic_lengths(n: int = 1_000_000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    src = np.clip(np.rint(rng.lognormal(np.log(25), 0.6, n)), 1, 256).astype(np.int64)
    tgt = np.clip(np.rint(src * rng.lognormal(np.log(1.1), 0.15, n)), 1, 256).astype(np.int64)
    return src, tgt


def measure(batches, src, tgt, buckets) -> dict:
    """Padding overhead, shapes and filler rows of one epoch's batches."""
    shapes = batch_shapes(batches, src, tgt, buckets)
    padded = sum(count * b * (s + t) for (b, s, t), count in shapes.items())
    real = int(src.sum() + tgt.sum()) + 2 * len(src)
    rows = sum(count * b for (b, _, _), count in shapes.items())
    return {"batches": len(batches), "shapes": len(shapes), "padding_overhead": round(padded / real - 1, 4),
            "filler_rows": round(1 - len(src) / rows, 4), "real_tokens": real, "padded_tokens": padded}


def main() -> None:
    rows = []
    for data, (src, tgt) in (("multi30k-train", multi30k_lengths()), ("synthetic-wmt-1M", synthetic_lengths())):
        for max_tokens in BUDGETS:
            batches = token_batches(src, tgt, max_tokens, seed=SEED, epoch=EPOCH)
            rows.append({"data": data, "pairs": len(src), "max_tokens": max_tokens, "batching": "token_batches",
                         "buckets": None, **measure(batches, src, tgt, None)})
            for method in METHODS:
                for count in BUCKETS:
                    buckets = length_buckets(src, tgt, max_tokens, count, method=method)
                    batches = bucketed_token_batches(src, tgt, buckets, seed=SEED, epoch=EPOCH)
                    rows.append({"data": data, "pairs": len(src), "max_tokens": max_tokens,
                                 "batching": f"bucketed ({method})", "buckets": count, "lengths": list(buckets.lengths),
                                 "rows": list(buckets.rows), **measure(batches, src, tgt, buckets)})
        floor = 2 * int((-(-(np.maximum(src, tgt) + 1) // 8) * 8).sum())
        real = int(src.sum() + tgt.sum()) + 2 * len(src)
        rows.append({"data": data, "pairs": len(src), "max_tokens": None, "batching": "floor (own size, up to 8)",
                     "buckets": None, "padding_overhead": round(floor / real - 1, 4)})
    path = save_results("bucket_padding", {"environment": environment(amp="none"), "rows": rows})
    print("| data | max_tokens | batching | buckets: at most (lengths) | batches | shapes | padding overhead | "
          "filler rows |")
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for r in rows:
        kind = f"{r['buckets']} ({', '.join(map(str, r['lengths']))})" if r["buckets"] else "-"
        filler = f"{100 * r['filler_rows']:.1f}%" if "filler_rows" in r else "-"
        print(f"| {r['data']} | {r['max_tokens'] or '-'} | {r['batching']} | {kind} | {r.get('batches', '-')} | "
              f"{r.get('shapes', '-')} | {100 * r['padding_overhead']:.1f}% | {filler} |")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
