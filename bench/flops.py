"""FLOPs of one training update per preset, on the same Multi30k batches as bench/train_speed.py.

Counted with `torch.utils.flop_counter.FlopCounterMode` around a full update (forward, loss,
backward, optimizer) in fp32: matmuls, batched matmuls, convolutions and attention are counted,
elementwise work is not. The ratio to transformer-tiny is the step time a preset "should" have if
it ran at the standard model's FLOP rate; bench/train_speed.py --presets measures the real one.

    python bench/flops.py --presets transformer-tiny mat-tiny weighted-tiny mute-tiny ... [--batches 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from bench.common import environment, save_results, trainer_and_batches  # noqa: E402


def update_flops(preset: str, batches: int) -> dict:
    """Mean FLOPs per update over the first `batches` batches of epoch 1 (the preset's own batch size)."""
    from multibranch.experiment import resolve_config

    cfg = resolve_config(preset, None, ["train.amp=none", "train.max_steps=100000", "train.valid_bleu=false"])
    with trainer_and_batches(cfg, batches) as (trainer, collated):
        counter = FlopCounterMode(display=False)
        with counter:
            for batch in collated:
                trainer._update([batch])
        parameters = sum(p.numel() for p in trainer.model.parameters())
    return {"system": preset, "parameters": parameters, "gflops_per_update": counter.get_total_flops() / batches / 1e9,
            "tokens": sum(b.n_tgt_tokens for b in collated) / batches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", required=True, help="the first one is the reference")
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = [update_flops(preset, args.batches) for preset in args.presets]
    print("| preset | parameters | GFLOP/update | vs first |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['system']} | {row['parameters'] / 1e6:.2f}M | {row['gflops_per_update']:.1f} | "
              f"{row['gflops_per_update'] / rows[0]['gflops_per_update']:.2f}x |")
    print(f"written {save_results('presets_flops', {'environment': environment(amp='none'), 'rows': rows})}")


if __name__ == "__main__":
    main()
