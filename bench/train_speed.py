"""Training throughput and peak memory, side by side on the same Multi30k batches.

Default: multibranch vs Hugging Face MarianMTModel at equal architecture (d=256, 3+3
layers, 4 heads, FFN 1024, shared 8k SentencePiece vocabulary, dropout 0.1, label smoothing 0.1,
AdamW), plus MAT with N_a=2 at the same d, all on the *same* batches of ~4096 tokens (our
length-bucketed token batches of epoch 1). With --presets: every named preset (its own model and
settings) on the same batches. Each system runs in its own process so peak RSS is its own; rounds
alternate systems and the median round is reported. Reported: target tokens/s over the timed updates
(after warm-up updates), ms per update, peak RSS.

On a GPU (`--device cuda`): the same, timed between CUDA synchronisations, with the model FLOPs of the
timed updates counted (torch.utils.flop_counter, after timing, on the same batches) and the model FLOP
utilisation: those FLOPs per second over the GPU's dense bf16 peak (`--peak-tflops`, default the H100/H200
SXM datasheet's 989.4) and over the rate of a large bf16 matmul measured in the same run. `--size base` is
transformer-base (Vaswani et al.: d=512, 8 heads, FFN 2048, 6+6 layers, dropout 0.1).

    python bench/train_speed.py [--steps 20] [--warmup 3] [--rounds 3] [--amp none|bf16] [--threads 2]
    python bench/train_speed.py --presets transformer-tiny mat-tiny weighted-tiny ... --max-tokens 2048 --amp bf16
    python bench/train_speed.py --device cuda --size base --amp bf16 --max-tokens 4096 16384 --rounds 2
    python bench/train_speed.py --presets transformer-tiny mute-bias-seq-tiny --max-tokens 2048 --system-malloc

`--system-malloc` adds a twin of every system, named `<system>+glibc-malloc`, that trains with glibc's own malloc
settings (`MULTIBRANCH_MALLOC=0`; src/multibranch/malloc.py), in the same rounds; each row also reports the
process's page faults per timed update.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    environment,
    multi30k_data,
    peak_rss_mb,
    run_isolated,
    save_results,
    trainer_and_batches,
)

SIZES = {
    "tiny": ["model.d_model=256", "model.heads=4", "model.ffn_dim=1024", "model.encoder_layers=3",
             "model.decoder_layers=3", "model.dropout=0.1", "train.max_tokens=4096", "train.label_smoothing=0.1"],
    "base": ["model.d_model=512", "model.heads=8", "model.ffn_dim=2048", "model.encoder_layers=6",
             "model.decoder_layers=6", "model.dropout=0.1", "train.max_tokens=4096", "train.label_smoothing=0.1"],
}
DATASHEET_BF16_TFLOPS = 989.4  # H100/H200 SXM, dense bf16 tensor cores
SYSTEMS = {
    "hf-marian": [],
    "multibranch": [],  # train.graphs=auto: CUDA graphs over fixed-shape batches on a GPU, eager on the CPU
    "multibranch-eager": ["train.graphs=off"],  # every batch its own shape, eager (the path before graphs)
    "multibranch-mat2": ["model.encoder.attention_branches=2", "model.decoder.attention_branches=2"],
}
GLIBC_TWIN = "+glibc-malloc"  # a system's twin run with glibc's malloc settings (--system-malloc)


def child(system: str, steps: int, warmup: int, amp: str, threads: int, max_tokens: int | None,
          device: str = "cpu", size: str = "tiny", prewarm: bool = False, profile_updates: int = 0) -> dict:
    import torch

    torch.set_num_threads(threads)
    cuda = device.startswith("cuda")
    from multibranch.experiment import resolve_config

    common = [f"train.amp={amp}", "train.max_steps=100000", "train.valid_bleu=false"]
    if max_tokens:
        common.append(f"train.max_tokens={max_tokens}")
    if system.startswith("preset:"):
        cfg = resolve_config(system.removeprefix("preset:"), None, common)
    else:
        cfg = resolve_config("transformer-tiny", None, SIZES[size] + SYSTEMS[system] + common)
    with trainer_and_batches(cfg, warmup + steps, device=device) as (trainer, batches):
        tokens = sum(b.n_tgt_tokens for b in batches[warmup:])
        if system == "hf-marian":
            step = hf_step_fn(trainer, amp)
        else:
            def step(batch):
                trainer._update([batch])
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        for batch in batches[:warmup]:
            step(batch)
        if prewarm:  # every timed batch's shape seen before the clock starts (twice: graphs warm up, then capture)
            for batch in batches[warmup:] * 2:
                step(batch)
        sync()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        for batch in batches[warmup:]:
            step(batch)
        sync()
        seconds = time.perf_counter() - start
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        busy = device_busy(step, batches[warmup : warmup + profile_updates], cuda) if profile_updates else {}
        params = sum(p.numel() for p in trainer.model.parameters()) if system != "hf-marian" else _hf_params
        row = {"system": system, "tokens_per_s": tokens / seconds, "ms_per_update": 1000 * seconds / steps,
               "tokens": tokens, "updates": steps, "peak_rss_mb": peak_rss_mb(), "parameters": params, "amp": amp,
               "device": device, "size": size, "max_tokens": max_tokens, "page_faults_per_update": faults / steps,
               "malloc": trainer._malloc_note, **busy}
        if cuda:
            from torch.utils.flop_counter import FlopCounterMode

            graphed = getattr(trainer, "graphed", None)
            if graphed is not None:  # replays dispatch no operation to count: count the same updates eagerly
                trainer.graphed = None
            counter = FlopCounterMode(display=False)
            with counter:  # the model FLOPs of the timed updates (matmuls and attention; shapes only, padding too)
                for batch in batches[warmup:]:
                    step(batch)
            padded = sum(b.tgt.numel() for b in batches[warmup:])
            row.update(graphs=graphed is not None and graphed.failed is None,
                       graph_shapes=graphed.shapes if graphed is not None else 0,
                       target_positions=padded, real_token_fraction=tokens / padded)
            row.update(model_tflop=counter.get_total_flops() / 1e12, gpu=torch.cuda.get_device_name(),
                       peak_gpu_memory_mb=torch.cuda.max_memory_allocated() / 2**20)
            row["model_tflops_per_s"] = row["model_tflop"] / seconds
    return row


_hf_params = 0


def device_busy(step, batches: list, cuda: bool) -> dict:
    """Profile `step` over `batches` (already seen: graphs captured): the wall time, the time some GPU kernel
    ran (the union of the kernels' intervals, from torch.profiler) and their ratio, the GPU's busy fraction.
    On the CPU only the wall time (there are no device kernels to count)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for batch in batches:
            step(batch)
        sync()
        wall_ms = 1000 * (time.perf_counter() - start)
    out = {"profiled_updates": len(batches), "profile_wall_ms": wall_ms}
    if cuda:
        spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA)  # kernels and copies, microseconds
        busy_us, end = 0.0, float("-inf")
        for a, b in spans:  # length of the union of the intervals
            if b > end:
                busy_us += b - max(a, end)
                end = b
        out.update(gpu_busy_ms=busy_us / 1000, gpu_busy_fraction=busy_us / 1000 / wall_ms, gpu_kernels=len(spans))
    return out


def hf_step_fn(trainer, amp: str):
    """What an HF user writes: MarianMTModel forward on the batch, label-smoothed CE on the logits, AdamW."""
    from functools import partial

    import torch
    import transformers

    from bench.common import hf_update
    from multibranch.convert.hf_marian_export import marian_config

    global _hf_params
    cfg = trainer.cfg.model
    del trainer.model, trainer.optimizer  # free our model's memory: this process measures HF only
    torch.manual_seed(1)
    hf = transformers.MarianMTModel(marian_config(transformers, cfg, beam=1)).to(trainer.device).train()
    _hf_params = sum(p.numel() for p in hf.parameters())
    optimizer = torch.optim.AdamW(hf.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-8, foreach=True)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=cfg.pad_id, label_smoothing=0.1, reduction="sum")

    return partial(hf_update, hf, optimizer, loss_fn, pad_id=cfg.pad_id, amp=amp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--amp", default="none", choices=["none", "bf16", "fp16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS))
    parser.add_argument("--presets", nargs="+", help="compare these presets instead of --systems")
    parser.add_argument("--max-tokens", type=int, nargs="+",
                        help="batch size override(s) (default 4096; presets: their own); several: one table each")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--size", choices=list(SIZES), default="tiny", help="model size of --systems")
    parser.add_argument("--peak-tflops", type=float, default=DATASHEET_BF16_TFLOPS,
                        help="the GPU's dense bf16 peak for the MFU column (default: H100/H200 SXM datasheet)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", help="results file name (default train_speed_<amp> / presets_speed_<amp>)")
    parser.add_argument("--prewarm", action="store_true",
                        help="run every timed batch twice before timing: steady state, every batch shape already "
                             "seen (CUDA graphs captured, cuBLAS kernels chosen)")
    parser.add_argument("--profile-updates", type=int, default=0,
                        help="profile this many of the timed batches once more (torch.profiler): GPU busy time / wall")
    parser.add_argument("--system-malloc", action="store_true",
                        help=f"also run every system with glibc's malloc settings (named <system>{GLIBC_TWIN})")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        max_tokens = args.max_tokens[0] if args.max_tokens else None
        print(json.dumps(child(args.child, args.steps, args.warmup, args.amp, args.threads, max_tokens, args.device,
                               args.size, args.prewarm, args.profile_updates)))
        return
    multi30k_data()  # prepare once, outside the timed children
    systems = [f"preset:{p}" for p in args.presets] if args.presets else args.systems
    if args.system_malloc:
        systems = [name for system in systems for name in (system, system + GLIBC_TWIN)]
    cuda = args.device.startswith("cuda")
    matmul_tflops = measured_matmul_tflops() if cuda else None
    tables = []
    for max_tokens in args.max_tokens or [None]:
        rows = _compare(args, systems, max_tokens)
        for row in rows if cuda else []:
            row["mfu"] = row["model_tflops_per_s"] / args.peak_tflops  # model FLOPs over the datasheet's dense peak
        tables.append({"max_tokens": max_tokens, "rows": rows})
        _print_table(rows, max_tokens, args.peak_tflops if cuda else None, matmul_tflops)
    name = args.name or f"{'presets' if args.presets else 'train'}_speed_{args.amp}"
    payload = {"environment": environment(amp=args.amp), "device": args.device, "size": args.size,
               "rows": [row for table in tables for row in table["rows"]]}
    if cuda:
        payload.update(peak_tflops=args.peak_tflops, measured_matmul_tflops=matmul_tflops)
    path = save_results(name, payload)
    print(f"\nwritten {path}")


def measured_matmul_tflops(n: int = 8192, repeats: int = 20) -> float:
    """The rate of an n×n×n bf16 matmul on this GPU (random data, after warm-up): the achievable ceiling."""
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def _compare(args: argparse.Namespace, systems: list[str], max_tokens: int | None) -> list[dict]:
    """Each system in its own process per round, rounds alternating; the median round of each."""
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    for _ in range(args.rounds):
        for system in systems:
            cmd = ["bench/train_speed.py", "--child", system.removesuffix(GLIBC_TWIN), "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--amp", args.amp, "--threads", str(args.threads), "--device", args.device, "--size", args.size,
                   *(["--prewarm"] if args.prewarm else []), "--profile-updates", str(args.profile_updates)]
            if max_tokens:
                cmd += ["--max-tokens", str(max_tokens)]
            runs[system].append(run_isolated(cmd, {"MULTIBRANCH_MALLOC": "0"} if system.endswith(GLIBC_TWIN) else None))
            print(json.dumps(runs[system][-1]), flush=True)
    rows = []
    for system, results in runs.items():
        ordered = sorted(results, key=lambda r: r["tokens_per_s"])
        median = dict(ordered[len(ordered) // 2])
        median["tokens_per_s_all"] = [r["tokens_per_s"] for r in results]
        median["system"] = system.removeprefix("preset:")
        rows.append(median)
    return rows


def _print_table(rows: list[dict], max_tokens: int | None, peak_tflops: float | None,
                 matmul_tflops: float | None) -> None:
    base = {r["system"]: r for r in rows}
    hf = base.get("hf-marian") or base.get("transformer-tiny")
    ref_name = "HF" if "hf-marian" in base else "transformer-tiny"
    print(f"\nmax_tokens {max_tokens or 'default'}")
    if peak_tflops:
        print(f"\n| system | params | target tok/s | ms/update | model TFLOP/s | MFU (of {peak_tflops:.0f}) | "
              f"of measured matmul {matmul_tflops:.0f} | peak GPU MB | GPU busy | vs {ref_name} tok/s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            ratio = f"{r['tokens_per_s'] / hf['tokens_per_s']:.2f}x" if hf else "-"
            busy = f"{100 * r['gpu_busy_fraction']:.0f}%" if "gpu_busy_fraction" in r else "-"
            print(f"| {r['system']} | {r['parameters'] / 1e6:.2f}M | {r['tokens_per_s']:.0f} | {r['ms_per_update']:.1f} | "
                  f"{r['model_tflops_per_s']:.1f} | {100 * r['mfu']:.1f}% | "
                  f"{100 * r['model_tflops_per_s'] / matmul_tflops:.1f}% | {r['peak_gpu_memory_mb']:.0f} | {busy} | "
                  f"{ratio} |")
        return
    print(f"\n| system | params | target tok/s | ms/update | page faults/update | peak RSS MB | vs {ref_name} tok/s | "
          f"vs {ref_name} RSS |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['tokens_per_s'] / hf['tokens_per_s']:.2f}x" if hf else "-"
        rss = f"{r['peak_rss_mb'] / hf['peak_rss_mb']:.2f}x" if hf else "-"
        print(f"| {r['system']} | {r['parameters'] / 1e6:.2f}M | {r['tokens_per_s']:.0f} | {r['ms_per_update']:.0f} | "
              f"{r['page_faults_per_update']:.0f} | {r['peak_rss_mb']:.0f} | {ratio} | {rss} |")
    if "multibranch" in base and "multibranch-mat2" in base:
        print(f"\nMAT N_a=2 update time / standard: "
              f"{base['multibranch-mat2']['ms_per_update'] / base['multibranch']['ms_per_update']:.2f}x")


if __name__ == "__main__":
    main()
