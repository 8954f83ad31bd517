"""Beam-search speed and BLEU, side by side on the same weights and sentences: our Translator (fp32, int8,
bf16) against CTranslate2 float32, int8 and bfloat16 (where its build offers it on this CPU).

The checkpoint (standard or MAT) is exported with `multibranch convert ct2` once per CTranslate2 engine.
`multibranch-fp32-unpacked` decodes with the model's own fp32 weights through `F.linear` (PyTorch's
default GEMM), i.e. without the oneDNN prepacking `--precision fp32` does on the CPU: the packing's own
ratio, in the same run.
Every engine runs in its own long-lived process (own memory and thread pools), loads its model and
decodes the sentences once to warm up; then the driver runs `--rounds` rounds, and in each round
every engine decodes all sentences once, one engine at a time, in an order that rotates from round to
round. So the engines take turns on a shared, loaded machine, and the speed ratio to
multibranch-fp32 is computed within each round (the median over rounds is reported), which cancels
most of the load that changes between rounds. Per engine: the fastest round's sentences/s, the
median per-round ratio, CPU seconds of the fastest round (process time: less sensitive to other
processes than wall time), and sacreBLEU of its output.

Settings: beam 5, length penalty 1.0, max length 1.2*src+10, sentences sorted longest-first in
batches of `--batch`, the same number of intra-op threads (`--threads`) for every engine. CT2 gets our
SentencePiece pieces and the `translate_batch` options of `multibranch.convert.ct2.translate_options`
(our search's semantics); its maximum length is per batch (that of the longest sentence), ours per
sentence, which only matters for sentences that reach the limit. Measurement only: no goal is asserted.

    python bench/ct2_decode.py --ckpt CKPT --src test.src --ref test.tgt --sentences 1000 --rounds 5 --threads 2
    python bench/ct2_decode.py --ckpt CKPT --src test.src --ref test.tgt --sentences 20 --rounds 1   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "src"))

from bench.common import decoding_model, environment, multi30k_data, save_results, work_dir  # noqa: E402

ENGINES = ("multibranch-fp32", "multibranch-int8", "multibranch-bf16", "multibranch-fp32-unpacked", "ct2-float32",
           "ct2-int8", "ct2-bfloat16")
BASE = "multibranch-fp32"  # speed ratios are relative to this engine when it runs


# ---- workers (one engine per process) -----------------------------------------------------------


def _decode_settings(args: argparse.Namespace):
    from multibranch.experiment.decoding import DecodeConfig

    return DecodeConfig(beam=args.beam, length_penalty=1.0, max_len_a=1.2, max_len_b=10,
                        batch_size=args.batch, batch_tokens=10**9)


def _ours(args: argparse.Namespace, precision: str):
    import torch

    from multibranch.inference.allocator import keep_freed_memory
    from multibranch.tasks.loading import load_model
    from multibranch.tasks.translation.translator import Translator

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as `multibranch translate` does
    loaded = load_model(args.ckpt)
    translator = Translator(decoding_model(loaded.model, precision), loaded.tokenizer, _decode_settings(args))
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
    """Load one engine, warm it up, then decode all lines once per "go" line on stdin, printing one JSON
    line per round: wall seconds, CPU seconds of this process, translations."""
    lines = json.loads(Path(args.lines).read_text(encoding="utf-8"))
    engine = args.worker
    translate = _ours(args, engine.removeprefix("multibranch-")) if engine.startswith("multibranch-") else _ct2(args)
    translate(lines)  # warm-up
    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        start, cpu = time.perf_counter(), time.process_time()
        hyps = translate(lines)
        print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                          "hyps": hyps}), flush=True)


def _available_engines() -> list[str]:
    import ctranslate2

    from multibranch.modules.packed_linear import bf16_supported

    ct2_types = ctranslate2.get_supported_compute_types("cpu")
    return [name for name in ENGINES
            if not (name == "multibranch-bf16" and not bf16_supported())
            and not (name.startswith("ct2-") and name.removeprefix("ct2-") not in ct2_types)]


class Engine:
    """A worker process of one engine, driven round by round over its stdin/stdout."""

    def __init__(self, name: str, cmd: list[str], log: Path):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.name, self.log = name, log
        with open(log, "w", encoding="utf-8") as stderr:  # a file, so a chatty worker cannot block on a pipe
            self.proc = subprocess.Popen([sys.executable, *cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, text=True, env=env, cwd=ROOT)
        self._read()  # {"ready": true} after loading and the warm-up

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} worker failed:\n{self.log.read_text(encoding='utf-8')[-3000:]}")
        return json.loads(line)

    def round(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ---- driver -------------------------------------------------------------------------------------


def _sentences(args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    if args.src:
        src = Path(args.src).read_text(encoding="utf-8").splitlines()[: args.sentences]
        ref = Path(args.ref).read_text(encoding="utf-8").splitlines()[: args.sentences]
        return src, ref, args.src
    from multibranch.tasks.translation.dataset import PreparedData

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
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds after each engine's warm-up")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", nargs="+", choices=ENGINES,
                        help="default: every engine this machine can run (bf16 rows need native bf16)")
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--lines", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if bool(args.src) != bool(args.ref):
        parser.error("--src and --ref go together")
    args.engines = args.engines or _available_engines()

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
              "--batch", str(args.batch), "--threads", str(args.threads)]
    engines = []
    try:
        for name in args.engines:  # loaded one after the other (each warms up alone)
            cmd = [*common, "--worker", name]
            if name.startswith("ct2-"):
                directory = scratch / name
                export_ct2(payload, directory, quantization=name.removeprefix("ct2-"), force=True, source=args.ckpt)
                cmd += ["--model-dir", str(directory)]
            engines.append(Engine(name, cmd, scratch / f"{name}.stderr"))
        runs: dict[str, list[dict]] = {e.name: [] for e in engines}
        for r in range(args.rounds):
            shift = r % len(engines)
            for engine in engines[shift:] + engines[:shift]:  # rotate who goes first
                runs[engine.name].append(engine.round())
                print(f"round {r + 1}: {engine.name} {len(sources) / runs[engine.name][-1]['seconds']:.1f} "
                      f"sentences/s", flush=True)
    finally:
        for engine in engines:
            engine.close()

    base = BASE if BASE in runs else args.engines[0]
    rows = []
    for name, rounds in runs.items():
        best = min(rounds, key=lambda run: run["seconds"])
        ratios = [runs[base][i]["seconds"] / run["seconds"] for i, run in enumerate(rounds)]
        cpu_ratios = [runs[base][i]["cpu_seconds"] / run["cpu_seconds"] for i, run in enumerate(rounds)]
        bleu = score_corpus(best["hyps"], [references], metrics=("bleu",))["bleu"]["score"]
        rows.append({"engine": name, "seconds": best["seconds"], "cpu_seconds": best["cpu_seconds"],
                     "sentences_per_s": len(sources) / best["seconds"], "bleu": bleu,
                     "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "cpu_ratio_median": statistics.median(cpu_ratios),
                     "round_seconds": [run["seconds"] for run in rounds]})
    pairs = []  # our engine against the CTranslate2 one of the same precision, per round
    for ours, theirs in (("multibranch-fp32", "ct2-float32"), ("multibranch-int8", "ct2-int8"),
                         ("multibranch-bf16", "ct2-bfloat16"), ("multibranch-fp32", "multibranch-fp32-unpacked")):
        if ours in runs and theirs in runs:
            speedups = [b["seconds"] / a["seconds"] for a, b in zip(runs[ours], runs[theirs], strict=True)]
            pairs.append({"ours": ours, "peer": theirs, "speed_median": statistics.median(speedups),
                          "speed_min": min(speedups), "speed_max": max(speedups)})
    import ctranslate2

    path = save_results(args.name, {"environment": {**environment(amp="none"), "ctranslate2": ctranslate2.__version__},
                                    "checkpoint": args.ckpt, "corpus": corpus, "sentences": len(sources),
                                    "beam": args.beam, "batch": args.batch, "threads": args.threads,
                                    "rounds": args.rounds, "base": base, "rows": rows,
                                    "pairs": pairs})
    from bench.report import ct2_decode

    print("\n" + "\n".join(ct2_decode(args.name)))
    print(f"written {path}")


if __name__ == "__main__":
    main()
