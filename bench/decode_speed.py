"""Beam-search speed: multibranch Translator vs Hugging Face `generate`, same trained weights.

The checkpoint (a trained standard multibranch model, e.g. from the Multi30k recipe) is copied into
an HF MarianMTModel, so both decode the same function. Both get the same SentencePiece ids, sorted
longest-first, batches of 32 sentences, beam 5, length penalty 1.0, max length 1.2*src+10; HF uses
early_stopping=True (stop when `beam` hypotheses are finished, the rule our search follows too).
Rounds alternate between the systems; the best round of each is reported with BLEU of its output.

Several checkpoints (`NAME=PATH`) decode side by side with our Translator, e.g. every preset against
the standard model; the HF peer is built from the first one (it must be a standard model), or
skipped with --no-hf.

CPU only, all systems in this one process (good for presets side by side at equal work, `--fixed-length`).
Against CTranslate2, or on a GPU (bf16/fp16 against CTranslate2 and HF `generate`, each engine in its own
process), use bench/ct2_decode.py (`--device cuda`).

    python bench/decode_speed.py --ckpt runs/bench/quality/transformer-tiny/best.pt [--sentences 300]
    python bench/decode_speed.py --no-hf --name decode_presets \
        --ckpt transformer-tiny=runs/bench/quality_presets/transformer-tiny/best.pt \
               muse-simple-tiny=runs/bench/quality_presets/muse-simple-tiny/best.pt ...
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import decoding_model, environment, multi30k_data, save_results  # noqa: E402


def _named(spec: str) -> tuple[str, str]:
    """`NAME=PATH` -> (NAME, PATH); a bare PATH is named "multibranch"."""
    name, sep, path = spec.partition("=")
    return (name, path) if sep else ("multibranch", spec)


def hf_translate(hf, tokenizer, lines: list[str], *, beam: int, batch: int, cfg) -> list[str]:
    device = next(hf.parameters()).device
    ids = [ids + [cfg.eos_id] for ids in tokenizer.encode_src(lines)]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    out: list[str] = [""] * len(ids)
    for start in range(0, len(order), batch):
        chunk = order[start : start + batch]
        width = max(len(ids[i]) for i in chunk)
        src = torch.full((len(chunk), width), cfg.pad_id, dtype=torch.long)
        for row, i in enumerate(chunk):
            src[row, : len(ids[i])] = torch.tensor(ids[i])
        src = src.to(device)
        generated = hf.generate(
            input_ids=src, attention_mask=src.ne(cfg.pad_id), num_beams=beam, length_penalty=1.0,
            early_stopping=True, max_new_tokens=int(1.2 * width + 10), decoder_start_token_id=cfg.bos_id,
            eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id, do_sample=False,
        )
        texts = tokenizer.decode_tgt([[t for t in seq.tolist() if t not in (cfg.pad_id, cfg.bos_id, cfg.eos_id)]
                                      for seq in generated])
        for row, i in enumerate(chunk):
            out[i] = texts[row]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", nargs="+", required=True, help="PATH or NAME=PATH, one or more")
    parser.add_argument("--no-hf", action="store_true", help="do not decode with the HF peer")
    parser.add_argument("--name", default="decode_speed", help="results file bench/results/<name>.json")
    parser.add_argument("--split", choices=["valid", "test"], default="valid",
                        help="Multi30k split to decode (test: the 2016 Flickr test set)")
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch", type=int, nargs="+", default=[32], help="sentences per batch; several: each")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", nargs="+", default=["fp32"],
                        choices=["fp32", "int8", "bf16", "fp32-unpacked", "fp32-composed"],
                        help="our models' decoding precision on the CPU (inference/precision.py; several: each; the "
                             "HF peer stays fp32); fp32-unpacked: the model's own weights through F.linear, as before "
                             "the oneDNN prepacking; fp32-composed: the packed copy with its modules composed of "
                             "PyTorch operations (no fused attention or add + LayerNorm kernels)")
    parser.add_argument("--fixed-length", action="store_true",
                        help="every hypothesis decodes to the length limit (min_len beyond it): each model "
                             "runs the same steps, so speed compares architectures, not output lengths "
                             "(the BLEU column is then meaningless; untrained checkpoints are fine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from dataclasses import replace

    from multibranch.convert.hf_marian_export import marian_model
    from multibranch.evaluate.metrics import score_corpus
    from multibranch.loading.checkpoint import load_model
    from multibranch.tasks.translation.dataset import PreparedData
    from multibranch.tasks.translation.translator import Translator

    device = torch.device("cpu")
    split = PreparedData.load(multi30k_data()).split(args.split)
    sources = split.raw_src_lines()[: args.sentences]
    references = split.raw_tgt_lines()[: args.sentences]
    checkpoints = dict(_named(spec) for spec in args.ckpt)
    systems, parameters = {}, {}  # "name precision batch" -> translate function
    for name, path in checkpoints.items():
        loaded = load_model(path, device)
        for precision in args.precision:
            model = decoding_model(loaded.model, precision)
            for batch in args.batch:
                decode = replace(loaded.config.decode, beam=args.beam, length_penalty=1.0, max_len_a=1.2,
                                 max_len_b=10, batch_size=batch, batch_tokens=10**9,
                                 min_len=10**6 if args.fixed_length else 1)
                key = f"{name} {precision} {batch}"
                systems[key] = Translator(model, loaded.tokenizer, decode, device).translate
                parameters[key] = sum(p.numel() for p in loaded.model.parameters())
            if not args.no_hf and not any(k.startswith(f"hf-generate {precision} ") for k in systems):
                hf = marian_model(loaded.model.config, loaded.model.state_dict(), beam=args.beam)
                for batch in args.batch:
                    key = f"hf-generate {precision} {batch}"
                    systems[key] = partial(hf_translate, hf, loaded.tokenizer, beam=args.beam, batch=batch,
                                           cfg=loaded.model.config)
                    parameters[key] = sum(p.numel() for p in hf.parameters())
    best: dict[str, dict] = {}
    print(f"loaded {len(systems)} systems", flush=True)
    with torch.inference_mode():
        for key, fn in systems.items():  # warm-up: kernels, allocator, autotuning
            start = time.perf_counter()
            fn(sources[:32])
            print(f"warm-up {key}: {time.perf_counter() - start:.1f} s", flush=True)
        for _ in range(args.rounds):
            for key, fn in systems.items():
                start = time.perf_counter()
                hyps = fn(sources)
                seconds = time.perf_counter() - start
                if key not in best or seconds < best[key]["seconds"]:
                    bleu = score_corpus(hyps, [references], metrics=("bleu",))["bleu"]["score"]
                    words = sum(len(h.split()) for h in hyps)
                    system, precision, batch = key.split(" ")
                    best[key] = {"system": system, "precision": precision, "batch": int(batch),
                                 "parameters": parameters[key], "seconds": seconds,
                                 "sentences_per_s": len(sources) / seconds, "words_per_s": words / seconds,
                                 "bleu": bleu}
                print(f"{key}: {len(sources) / seconds:.1f} sentences/s", flush=True)
    print("\n| system | precision | batch | parameters | sentences/s | output words/s | BLEU | vs HF (same precision, batch) |")
    print("|---|---|---|---|---|---|---|---|")
    for row in best.values():
        peer = best.get(f"hf-generate {row['precision']} {row['batch']}") or next(iter(best.values()))
        row["vs_peer"] = row["sentences_per_s"] / peer["sentences_per_s"]
        print(f"| {row['system']} | {row['precision']} | {row['batch']} | {row['parameters'] / 1e6:.2f}M | "
              f"{row['sentences_per_s']:.1f} | {row['words_per_s']:.0f} | {row['bleu']:.2f} | {row['vs_peer']:.2f}x |")
    path = save_results(args.name, {"environment": environment(amp="none"), "checkpoints": checkpoints,
                                    "device": "cpu", "split": args.split,
                                    "sentences": len(sources), "beam": args.beam, "batches": args.batch,
                                    "precisions": args.precision, "fixed_length": args.fixed_length,
                                    "rows": list(best.values())})
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
