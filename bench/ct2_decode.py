"""Beam-search speed and BLEU: our Translator (fp32) vs CTranslate2 float32 and int8, same weights.

The checkpoint (standard or MAT) is exported with `multibranch convert ct2` twice (float32, int8);
each engine then decodes the same sentences in its own process (fresh memory and thread pools):
beam 5, length penalty 1.0, max length 1.2*src+10, sentences sorted longest-first in batches of 32,
the same number of intra-op threads. CT2 gets our SentencePiece pieces and the `translate_batch`
options of `multibranch.convert.ct2.translate_options` (our search's semantics); its maximum length
is per batch (that of the longest sentence), ours per sentence, which only matters for sentences that
reach the limit. Each engine decodes once to warm up, then `--rounds` times; the fastest round is
reported, with sacreBLEU of its output. Measurement only: no goal is asserted.

    python bench/ct2_decode.py --ckpt runs/bench/quality/transformer-tiny/best.pt [--sentences 1000]
    python bench/ct2_decode.py --ckpt CKPT --src test.src --ref test.tgt --sentences 20   # smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "src"))

from bench.common import environment, multi30k_data, run_isolated, save_results, work_dir  # noqa: E402

ENGINES = ("multibranch-fp32", "ct2-float32", "ct2-int8")


# ---- workers (one engine per process) -----------------------------------------------------------


def _decode_settings(args: argparse.Namespace):
    from multibranch.inference.config import DecodeConfig

    return DecodeConfig(beam=args.beam, length_penalty=1.0, max_len_a=1.2, max_len_b=10,
                        batch_size=args.batch, batch_tokens=10**9)


def _ours(args: argparse.Namespace):
    import torch

    from multibranch.checkpoint.model import load_model
    from multibranch.inference.translator import Translator

    torch.set_num_threads(args.threads)
    loaded = load_model(args.ckpt)
    translator = Translator(loaded.model, loaded.tokenizer, _decode_settings(args))
    return translator.translate


def _ct2(args: argparse.Namespace):
    import ctranslate2
    import sentencepiece as spm

    from multibranch.convert.ct2 import SETTINGS_FILE, max_decoding_length, translate_options

    directory = Path(args.model_dir)
    files = json.loads((directory / SETTINGS_FILE).read_text(encoding="utf-8"))["tokenizer"]
    sp_src = spm.SentencePieceProcessor(model_file=str(directory / files["src"]))
    sp_tgt = spm.SentencePieceProcessor(model_file=str(directory / files["tgt"]))
    translator = ctranslate2.Translator(str(directory), device="cpu", inter_threads=1, intra_threads=args.threads)
    decode = _decode_settings(args)
    options = translate_options(decode)

    def translate(batch_lines: list[str]) -> list[str]:
        pieces = sp_src.encode(batch_lines, out_type=str)
        order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i]))  # longest first, as ours
        out = [""] * len(pieces)
        for start in range(0, len(order), args.batch):
            chunk = order[start : start + args.batch]
            results = translator.translate_batch(
                [pieces[i] for i in chunk], max_decoding_length=max_decoding_length(decode, len(pieces[chunk[0]])),
                **options,
            )
            for i, result in zip(chunk, results):
                tokens = result.hypotheses[0]
                out[i] = sp_tgt.decode(tokens[:-1] if tokens and tokens[-1] == "</s>" else tokens)
        return out

    return translate


def worker(args: argparse.Namespace) -> None:
    lines = json.loads(Path(args.lines).read_text(encoding="utf-8"))
    translate = _ours(args) if args.worker == "multibranch-fp32" else _ct2(args)
    translate(lines)  # warm-up
    best_seconds, best_hyps = float("inf"), []
    for _ in range(args.rounds):
        start = time.perf_counter()
        hyps = translate(lines)
        seconds = time.perf_counter() - start
        if seconds < best_seconds:
            best_seconds, best_hyps = seconds, hyps
    print(json.dumps({"seconds": best_seconds, "hyps": best_hyps}))


# ---- driver -------------------------------------------------------------------------------------


def _sentences(args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    if args.src:
        src = Path(args.src).read_text(encoding="utf-8").splitlines()[: args.sentences]
        ref = Path(args.ref).read_text(encoding="utf-8").splitlines()[: args.sentences]
        return src, ref, args.src
    from multibranch.data.dataset import PreparedData

    valid = PreparedData.load(multi30k_data()).split("valid")
    return valid.raw_src_lines()[: args.sentences], valid.raw_tgt_lines()[: args.sentences], "multi30k valid"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="standard or MAT checkpoint")
    parser.add_argument("--src", help="source lines (default: Multi30k valid, prepared by bench/common.py)")
    parser.add_argument("--ref", help="reference lines for --src")
    parser.add_argument("--name", default="ct2_decode", help="results file bench/results/<name>.json")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--lines", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if bool(args.src) != bool(args.ref):
        parser.error("--src and --ref go together")

    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.convert.ct2 import export_ct2
    from multibranch.evaluate.metrics import score_corpus

    sources, references, corpus = _sentences(args)
    scratch = work_dir() / "ct2_decode"
    scratch.mkdir(parents=True, exist_ok=True)
    lines_file = scratch / "lines.json"
    lines_file.write_text(json.dumps(sources), encoding="utf-8")
    payload = load_checkpoint(args.ckpt)
    common = [str(Path(__file__).resolve()), "--ckpt", args.ckpt, "--lines", str(lines_file), "--beam", str(args.beam),
              "--batch", str(args.batch), "--rounds", str(args.rounds), "--threads", str(args.threads)]
    rows = []
    for engine in args.engines:
        cmd = [*common, "--worker", engine]
        if engine.startswith("ct2-"):
            directory = scratch / engine
            export_ct2(payload, directory, quantization=engine.removeprefix("ct2-"), force=True, source=args.ckpt)
            cmd += ["--model-dir", str(directory)]
        result = run_isolated(cmd)
        bleu = score_corpus(result["hyps"], [references], metrics=("bleu",))["bleu"]["score"]
        rows.append({"engine": engine, "seconds": result["seconds"],
                     "sentences_per_s": len(sources) / result["seconds"], "bleu": bleu})
        print(f"{engine}: {rows[-1]['sentences_per_s']:.1f} sentences/s, BLEU {bleu:.2f}", flush=True)

    base = rows[0]
    print(f"\n| engine | sentences/s | BLEU | vs {base['engine']} |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['engine']} | {row['sentences_per_s']:.1f} | {row['bleu']:.2f} | "
              f"{row['sentences_per_s'] / base['sentences_per_s']:.2f}x |")
    import ctranslate2

    path = save_results(args.name, {"environment": {**environment(), "ctranslate2": ctranslate2.__version__},
                                    "checkpoint": args.ckpt, "corpus": corpus, "sentences": len(sources),
                                    "beam": args.beam, "batch": args.batch, "threads": args.threads, "rows": rows})
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
