"""ATen operations per training update, ours against Hugging Face Marian: a count of what the host dispatches,
countable on any machine, that stands in for the GPU kernels an update launches.

On a GPU a small model's update can be bound by the host launching kernels rather than by the kernels: the
transformer-base run of bench/gpu_check.sh took the same time per update at 2.6x the tokens
(docs/benchmarks.md, "On a GPU"). The count is taken with a TorchDispatchMode around whole updates (forward,
loss, backward, optimizer step) on the same batches, in the same setting as bench/train_speed.py, and split by
operation name so the difference can be traced. Views and other metadata-only operations are counted too
(they cost host time, no kernel).

    python bench/op_count.py --size base --amp bf16 --batches 3 [--top 15]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from bench.common import environment, save_results, trainer_and_batches  # noqa: E402
from bench.train_speed import SIZES, hf_step_fn  # noqa: E402


class OpCounter(TorchDispatchMode):
    """Counts every ATen operation dispatched while active, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def by_operation(counts: dict[str, Counter[str]], units: int) -> dict[str, dict[str, float]]:
    """Per system, each operation's count per unit (update, decoding step), most frequent first."""
    return {system: {name: n / units for name, n in c.most_common()} for system, c in counts.items()}


def count(system: str, size: str, amp: str, batches: int, max_tokens: int) -> tuple[Counter[str], int]:
    """Operations of `batches` updates (after one warm-up update) of `system`, and the target tokens."""
    from multibranch.experiment import resolve_config

    overrides = SIZES[size] + [f"train.amp={amp}", "train.max_steps=100000", "train.valid_bleu=false",
                               f"train.max_tokens={max_tokens}"]
    cfg = resolve_config("transformer-tiny", None, overrides)
    with trainer_and_batches(cfg, batches + 1) as (trainer, collated):
        if system == "hf-marian":
            step = hf_step_fn(trainer, amp)
        else:
            def step(batch):
                trainer._update([batch])
        step(collated[0])
        counter = OpCounter()
        with counter:
            for batch in collated[1:]:
                step(batch)
    return counter.counts, sum(b.n_tgt_tokens for b in collated[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(SIZES), default="base")
    parser.add_argument("--amp", choices=["none", "bf16"], default="bf16")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=1024, help="small batches: the count, not the time")
    parser.add_argument("--top", type=int, default=15, help="operations with the largest difference to print")
    parser.add_argument("--name", default="op_count")
    args = parser.parse_args()
    torch.set_num_threads(2)
    counts = {s: count(s, args.size, args.amp, args.batches, args.max_tokens)[0] for s in ("multibranch", "hf-marian")}
    per_update = {s: sum(c.values()) / args.batches for s, c in counts.items()}
    print(f"ATen operations per update ({args.size}, amp {args.amp}): " +
          ", ".join(f"{s} {n:.0f}" for s, n in per_update.items()))
    names = set(counts["multibranch"]) | set(counts["hf-marian"])
    diff = sorted(names, key=lambda n: -abs(counts["multibranch"][n] - counts["hf-marian"][n]))
    print("\n| operation | multibranch / update | hf-marian / update |\n|---|---|---|")
    for name in diff[: args.top]:
        print(f"| {name} | {counts['multibranch'][name] / args.batches:.0f} | "
              f"{counts['hf-marian'][name] / args.batches:.0f} |")
    path = save_results(args.name, {"environment": environment(amp=args.amp), "size": args.size,
                                    "batches": args.batches, "per_update": per_update,
                                    "by_operation": by_operation(counts, args.batches)})
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
