"""Training updates with multibranch's CPU dropout against PyTorch's, paired update by update in one process.

    python bench/dropout_speed.py [--presets transformer-tiny muse-tiny mute-bias-seq-tiny] [--updates 20]
                                  [--warmup 3] [--threads 2] [--max-tokens 2048] [--name dropout_speed_none]

Per preset one trainer (fp32) runs every timed batch once per variant, the variants in turn, so each pair of
updates is measured seconds apart on the same batch (a busy or noisy machine slows both alike):
  kernel     multibranch's dropout with the C++ kernel (csrc/dropout.cpp), the default where it is built
  composed   the same numbers from PyTorch operations (modules/dropout.py without the kernels)
  torch      `torch.nn.functional.dropout`, what a PyTorch user writes (one Bernoulli draw per element, a stored mask)
Reported per variant: mean ms per update, the median over the pairs of torch's update time over its own, and in
how many of the pairs it was the faster. Writes bench/results/NAME.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench.common import environment, save_results, trainer_and_batches  # noqa: E402

VARIANTS = ("kernel", "composed", "torch")


class _TorchDropout:
    """Stands in for modules/dropout.py's autograd function: PyTorch's own dropout."""

    @staticmethod
    def apply(x, p):
        import torch.nn.functional as F

        return F.dropout(x, p, True)


def measure(preset: str, updates: int, warmup: int, threads: int, max_tokens: int) -> list[dict]:
    import torch

    from multibranch import cpu_kernels
    from multibranch.experiment import resolve_config
    from multibranch.modules import dropout as module

    torch.set_num_threads(threads)
    if cpu_kernels.kernels() is None:
        sys.exit("the CPU kernels are not built here: nothing to compare")
    built, ours = cpu_kernels.kernels, module._Dropout
    setups = {"kernel": (ours, built), "composed": (ours, lambda: None), "torch": (_TorchDropout, built)}
    cfg = resolve_config(preset, None, ["train.amp=none", "train.valid_bleu=false", f"train.max_tokens={max_tokens}"])
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with trainer_and_batches(cfg, warmup + updates, device="cpu") as (trainer, batches):
        try:
            for i, batch in enumerate(batches):
                for name in VARIANTS:
                    module._Dropout, cpu_kernels.kernels = setups[name]
                    start = time.perf_counter()
                    trainer._update([batch])
                    if i >= warmup:
                        seconds[name].append(time.perf_counter() - start)
        finally:
            module._Dropout, cpu_kernels.kernels = ours, built
    return summarise(preset, seconds)


def summarise(preset: str, seconds: dict[str, list[float]]) -> list[dict]:
    """One row per variant: mean ms per update, the median over pairs of torch's update time over its own (a spike
    on a busy machine moves a mean, not a median), and the pairs it won."""
    rows = []
    for name in VARIANTS:
        pairs = list(zip(seconds[name], seconds["torch"]))
        rows.append({"preset": preset, "variant": name, "ms_per_update": 1000 * statistics.mean(seconds[name]),
                     "speed_vs_torch": statistics.median(theirs / mine for mine, theirs in pairs),
                     "faster_than_torch": sum(mine < theirs for mine, theirs in pairs), "pairs": len(pairs),
                     "seconds": seconds[name]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["transformer-tiny", "muse-tiny", "mute-bias-seq-tiny"])
    parser.add_argument("--updates", type=int, default=20, help="timed updates per variant")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--name", default="dropout_speed_none")
    args = parser.parse_args()
    rows = []
    for preset in args.presets:
        rows += measure(preset, args.updates, args.warmup, args.threads, args.max_tokens)
        for row in rows[-len(VARIANTS):]:
            print(f"{preset:20s} {row['variant']:9s} {row['ms_per_update']:7.0f} ms/update  "
                  f"{row['speed_vs_torch']:.2f}x torch  faster in {row['faster_than_torch']} of {row['pairs']}",
                  flush=True)
    path = save_results(args.name, {"environment": environment(amp="none"), "threads": args.threads,
                                    "max_tokens": args.max_tokens, "rows": rows})
    print(f"written {path}")


if __name__ == "__main__":
    main()
