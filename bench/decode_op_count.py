"""ATen operations per beam-search step, ours against Hugging Face `generate` on the same weights: what the host
dispatches for one decoding step, a count that stands in for the kernels a GPU step launches.

On a GPU our beam search was host-bound (docs/benchmarks.md, "On a GPU": 0.10-0.13x CTranslate2); each operation
costs host time there whatever its size. The count is taken with a TorchDispatchMode around whole searches of
one batch whose every hypothesis runs the same number of steps (EOS masked until the length limit, for both
systems), divided by the steps; it is the same on any machine, so it can be compared across commits on the CPU.
Views and other metadata-only operations count too (host time, no kernel). The model is a randomly initialised
`transformer-tiny` (the count does not depend on the weights), or `--ckpt`.

    python bench/decode_op_count.py [--ckpt CKPT] [--batch 32] [--beam 5] [--steps 20] [--top 20]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import decoding_model, environment, save_results  # noqa: E402
from bench.op_count import OpCounter, by_operation  # noqa: E402


def _model(ckpt: str | None):
    from multibranch.experiment import resolve_config
    from multibranch.loading.checkpoint import load_model
    from multibranch.models import build_model

    if ckpt:
        return load_model(ckpt).model
    cfg = resolve_config("transformer-tiny", None, ["model.src_vocab_size=8000", "model.tgt_vocab_size=8000"])
    torch.manual_seed(0)
    return build_model(cfg.model)


def count_ours(model, src: torch.Tensor, beam: int, steps: int, precision: str) -> Counter[str]:
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.inference.beam import beam_search

    decoder = decoding_model(model, precision)
    options = dict(max_len_a=0.0, max_len_b=steps - 1, min_len=steps - 1)  # steps - 1 tokens, then EOS
    beam_search(decoder, src, DecodeConfig(beam=beam, **options))  # warm-up
    counter = OpCounter()
    with counter, torch.inference_mode():
        beam_search(decoder, src, DecodeConfig(beam=beam, **options))
    return counter.counts


def count_hf(model, src: torch.Tensor, beam: int, steps: int) -> Counter[str]:
    cfg = model.config
    from multibranch.convert.hf_marian_export import marian_model

    hf = marian_model(cfg, model.state_dict(), beam=beam)
    options = dict(input_ids=src, attention_mask=src.ne(cfg.pad_id), num_beams=beam, length_penalty=1.0,
                   early_stopping=True, min_new_tokens=steps, max_new_tokens=steps, decoder_start_token_id=cfg.bos_id,
                   eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id, do_sample=False)
    with torch.inference_mode():
        hf.generate(**options)  # warm-up
        counter = OpCounter()
        with counter:
            hf.generate(**options)
    return counter.counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", help="a standard checkpoint (default: a random transformer-tiny, 8k vocabulary)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="decoding steps of every hypothesis (EOS included)")
    parser.add_argument("--precision", default="fp32", help="ours: inference/precision.py (fp32 packs on the CPU)")
    parser.add_argument("--no-hf", action="store_true", help="count ours only")
    parser.add_argument("--top", type=int, default=20, help="operations to list")
    parser.add_argument("--name", default="decode_op_count")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = _model(args.ckpt).eval()
    cfg = model.config
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(4, cfg.src_vocab_size, (args.batch, 20), generator=generator)
    src[:, -1] = cfg.eos_id
    counts = {"multibranch": count_ours(model, src, args.beam, args.steps, args.precision)}
    if not args.no_hf:
        counts["hf-generate"] = count_hf(model, src, args.beam, args.steps)
    per_step = {system: sum(c.values()) / args.steps for system, c in counts.items()}
    print(f"ATen operations per beam step (batch {args.batch}, beam {args.beam}, {args.steps} steps, encoder "
          "included): " + ", ".join(f"{s} {n:.0f}" for s, n in per_step.items()))
    names = sorted(set().union(*counts.values()), key=lambda n: -counts["multibranch"][n])
    print("\n| operation | " + " | ".join(f"{s} / step" for s in counts) + " |\n|---|" + "---|" * len(counts))
    for name in names[: args.top]:
        print(f"| {name} | " + " | ".join(f"{c[name] / args.steps:.1f}" for c in counts.values()) + " |")
    path = save_results(args.name, {"environment": environment(amp="none"), "checkpoint": args.ckpt,
                                    "batch": args.batch, "beam": args.beam, "steps": args.steps,
                                    "precision": args.precision, "per_step": per_step,
                                    "by_operation": by_operation(counts, args.steps)})
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
