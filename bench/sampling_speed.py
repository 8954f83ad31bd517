"""Sampling speed vs beam search on the same model: sentences/s of `--sampling` (one sample per line,
top-k, as back-translation uses it) against beam 5, with our Translator, the same lines and batching.
Rounds alternate between the two; the best round of each is reported (a back-translation corpus is
decoded once per sample, so sentences/s is the figure that matters; target tokens/s shows whether the
two produce outputs of similar length, which only a trained model does).

    python bench/sampling_speed.py --ckpt runs/bench/quality/transformer-tiny/best.pt --input test.en
    python bench/sampling_speed.py --ckpt tiny.pt --input lines.txt --sentences 200 --rounds 2   # a quick check
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import environment, save_results  # noqa: E402
from multibranch.loading.checkpoint import load_model  # noqa: E402
from multibranch.tasks.translation.translator import Translator  # noqa: E402


def timed(translator: Translator, lines: list[str]) -> tuple[float, int]:
    """(seconds, output tokens incl. EOS) to translate `lines` once."""
    tokens = translator.stats.tgt_tokens
    start = time.perf_counter()
    translator.translate(lines)
    return time.perf_counter() - start, translator.stats.tgt_tokens - tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--input", required=True, help="source lines (e.g. Multi30k test.en)")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="sampling_speed", help="results file name (bench/results/NAME.json)")
    parser.add_argument("--no-save", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lines = [line for line in Path(args.input).read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = lines[: args.sentences]
    loaded = load_model(args.ckpt, "cpu", task="translation")
    base = dataclasses.replace(loaded.config.decode, nbest=1)
    systems = {
        "beam5": Translator(loaded.model, loaded.tokenizer, dataclasses.replace(base, beam=5)),
        f"sampling_top{args.top_k}": Translator(loaded.model, loaded.tokenizer, dataclasses.replace(
            base, sampling=True, top_k=args.top_k, seed=1)),
    }
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.rounds):
        for name, translator in systems.items():  # alternating rounds
            seconds, tokens = timed(translator, lines)
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, tokens)
    rows = {name: {"seconds": s, "sentences_per_s": len(lines) / s, "target_tokens_per_s": t / s}
            for name, (s, t) in best.items()}
    names = list(rows)
    ratio = rows[names[1]]["sentences_per_s"] / rows[names[0]]["sentences_per_s"]
    for name, row in rows.items():
        print(f"{name:>16}: {row['sentences_per_s']:8.1f} sentences/s, {row['target_tokens_per_s']:8.1f} target "
              f"tokens/s ({row['seconds']:.2f}s for {len(lines)})")
    print(f"sampling / beam 5: {ratio:.2f}x")
    if not args.no_save:
        save_results(args.name, {"ckpt": args.ckpt, "sentences": len(lines), "threads": args.threads,
                                 "rounds": args.rounds, "results": rows, "sampling_over_beam5": ratio,
                                 "environment": environment(amp="fp32")})


if __name__ == "__main__":
    main()
