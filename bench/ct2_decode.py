"""Beam-search speed and BLEU, side by side on the same weights and sentences: our Translator (fp32, int8,
bf16) against CTranslate2 float32, int8 and bfloat16 (where its build offers it on this CPU); with
`--device cuda`, our bf16 and fp16 against CTranslate2 bfloat16, float16 and int8_float16 and Hugging Face
`generate` (MarianMTModel with our weights, bf16 and fp16).

The checkpoint (standard or MAT) is exported with `multibranch convert ct2` once per CTranslate2 engine.
`multibranch-fp32-unpacked` decodes with the model's own fp32 weights through `F.linear` (PyTorch's
default GEMM), i.e. without the oneDNN prepacking `--precision fp32` does on the CPU: the packing's own
ratio, in the same run. `multibranch-fp32-composed` and `multibranch-int8-composed` decode with the packed copy
without its modules' fused kernels (attention, residual add + LayerNorm; the beam-step kernels stay on): their
own ratio.
Every engine runs in its own long-lived process (own memory and thread pools), loads its model and
decodes the sentences once to warm up; then the driver runs `--rounds` rounds, and in each round
every engine decodes all sentences once, one engine at a time, in an order that rotates from round to
round. So the engines take turns on a shared, loaded machine, and the speed ratio to
multibranch-fp32 is computed within each round (the median over rounds is reported), which cancels
most of the load that changes between rounds. Per engine: the fastest round's sentences/s, the
median per-round ratio, CPU seconds of the fastest round (process time: less sensitive to other
processes than wall time), and sacreBLEU of its output.

Settings: beam 5, length penalty 1.0, max length 1.2*src+10, sentences sorted longest-first in
batches of `--batch` (several sizes: each, every round), the same number of intra-op threads (`--threads`)
for every engine. On CUDA an engine that cannot start (CTranslate2's CUDA build needs CUDA 12's cuBLAS) is
reported and left out; the others run. CT2 gets our
SentencePiece pieces and the `translate_batch` options of `multibranch.convert.ct2.translate_options`
(our search's semantics); its maximum length is per batch (that of the longest sentence), ours per
sentence, which only matters for sentences that reach the limit. Measurement only: no goal is asserted.

    python bench/ct2_decode.py --ckpt CKPT --src test.src --ref test.tgt --sentences 1000 --rounds 5 --threads 2
    python bench/ct2_decode.py --ckpt CKPT --src test.src --ref test.tgt --sentences 20 --rounds 1   # smoke run
    python bench/ct2_decode.py --ckpt CKPT --src test.src --ref test.tgt --device cuda --batch 32 128 --rounds 3
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

CPU_ENGINES = ("multibranch-fp32", "multibranch-int8", "multibranch-bf16", "multibranch-fp32-unpacked",
               "multibranch-fp32-composed", "multibranch-int8-composed", "ct2-float32", "ct2-int8", "ct2-bfloat16")
CUDA_ENGINES = ("multibranch-bf16", "multibranch-fp16", "ct2-bfloat16", "ct2-float16", "ct2-int8_float16",
                "hf-generate-bf16", "hf-generate-fp16")
ENGINES = tuple(dict.fromkeys(CPU_ENGINES + CUDA_ENGINES + ("hf-generate-fp32",)))  # every name --engines takes
BASE = {"cpu": "multibranch-fp32", "cuda": "multibranch-bf16"}  # speed ratios are relative to this engine
PAIRS = (("multibranch-fp32", "ct2-float32"), ("multibranch-int8", "ct2-int8"), ("multibranch-bf16", "ct2-bfloat16"),
         ("multibranch-fp32", "multibranch-fp32-unpacked"), ("multibranch-fp32", "multibranch-fp32-composed"),
         ("multibranch-int8", "multibranch-int8-composed"), ("multibranch-fp16", "ct2-float16"),
         ("multibranch-fp16", "ct2-int8_float16"), ("multibranch-bf16", "hf-generate-bf16"),
         ("multibranch-fp16", "hf-generate-fp16"), ("multibranch-fp32", "hf-generate-fp32"))


# ---- workers (one engine per process) -----------------------------------------------------------


def _decode_settings(args: argparse.Namespace, batch: int):
    from multibranch.experiment.decoding import DecodeConfig

    return DecodeConfig(beam=args.beam, length_penalty=1.0, max_len_a=1.2, max_len_b=10,
                        batch_size=batch, batch_tokens=10**9)


def _ours(args: argparse.Namespace, precision: str):
    """translate(lines, batch) with our Translator in `precision` on --device."""
    import torch

    from multibranch.inference.allocator import freeze_loaded_objects, keep_freed_memory
    from multibranch.loading.checkpoint import load_model
    from multibranch.tasks.translation.translator import Translator

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as `multibranch translate` does
    device = torch.device(args.device)
    loaded = load_model(args.ckpt, device)
    model = decoding_model(loaded.model, precision)
    translators = {batch: Translator(model, loaded.tokenizer, _decode_settings(args, batch), device)
                   for batch in args.batch}
    freeze_loaded_objects()  # as `multibranch translate` does while it decodes
    return lambda lines, batch: translators[batch].translate(lines)


def _hf(args: argparse.Namespace, precision: str):
    """translate(lines, batch) with Hugging Face `generate` on a MarianMTModel holding our weights."""
    import torch

    from bench.decode_speed import hf_translate
    from multibranch.convert.hf_marian_export import marian_model
    from multibranch.inference.precision import HALF_DTYPES
    from multibranch.loading.checkpoint import load_model

    torch.set_num_threads(args.threads)
    loaded = load_model(args.ckpt)
    hf = marian_model(loaded.model.config, loaded.model.state_dict(), beam=args.beam)
    hf = hf.to(args.device, HALF_DTYPES.get(precision, torch.float32))
    inference = torch.inference_mode()

    def translate(lines: list[str], batch: int) -> list[str]:
        with inference:
            return hf_translate(hf, loaded.tokenizer, lines, beam=args.beam, batch=batch, cfg=loaded.model.config)

    return translate


def _ct2(args: argparse.Namespace):
    import ctranslate2
    import sentencepiece as spm

    from multibranch.convert.ct2 import SETTINGS_FILE, max_decoding_length, translate_options

    directory = Path(args.model_dir)
    files = json.loads((directory / SETTINGS_FILE).read_text(encoding="utf-8"))["tokenizer"]
    sp_src = spm.SentencePieceProcessor(model_file=str(directory / files["src"]))
    sp_tgt = spm.SentencePieceProcessor(model_file=str(directory / files["tgt"]))
    translator = ctranslate2.Translator(str(directory), device=args.device, inter_threads=1,
                                        intra_threads=args.threads)
    decode = _decode_settings(args, args.batch[0])
    options = translate_options(decode)

    def translate(batch_lines: list[str], batch: int) -> list[str]:
        pieces = sp_src.encode(batch_lines, out_type=str)
        order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i]))  # longest first, as ours
        out = [""] * len(pieces)
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
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
    """Load one engine, warm it up, then decode all lines once per line on stdin (a batch size), printing one
    JSON line per round: wall seconds, CPU seconds of this process, translations."""
    lines = json.loads(Path(args.lines).read_text(encoding="utf-8"))
    engine = args.worker
    if engine.startswith("multibranch-"):
        translate = _ours(args, engine.removeprefix("multibranch-"))
    elif engine.startswith("hf-generate-"):
        translate = _hf(args, engine.removeprefix("hf-generate-"))
    else:
        translate = _ct2(args)
    for batch in args.batch:  # warm-up (kernels, allocators, autotuning) on two batches of each size
        translate(lines[: 2 * batch], batch)
    print(json.dumps({"ready": True}), flush=True)
    for request in sys.stdin:
        batch = int(request)
        start, cpu = time.perf_counter(), time.process_time()
        hyps = translate(lines, batch)
        print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                          "hyps": hyps}), flush=True)


def _available_engines(device: str) -> list[str]:
    import ctranslate2

    if device == "cuda":  # CTranslate2 is tried even if its CUDA libraries may be missing: it reports why
        return list(CUDA_ENGINES)
    from multibranch.modules.packed_linear import bf16_supported

    ct2_types = ctranslate2.get_supported_compute_types("cpu")
    return [name for name in CPU_ENGINES
            if not (name == "multibranch-bf16" and not bf16_supported())
            and not (name.startswith("ct2-") and name.removeprefix("ct2-") not in ct2_types)]


class Engine:
    """A worker process of one engine, driven round by round over its stdin/stdout."""

    def __init__(self, name: str, cmd: list[str], log: Path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.name, self.log = name, log
        with open(log, "w", encoding="utf-8") as stderr:  # a file, so a chatty worker cannot block on a pipe
            self.proc = subprocess.Popen([sys.executable, *cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, text=True, env=env, cwd=ROOT)

    def wait_ready(self) -> None:
        self._read()  # {"ready": true} after loading and the warm-up

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} worker failed:\n{self.log.read_text(encoding='utf-8')[-3000:]}")
        return json.loads(line)

    def round(self, batch: int) -> dict:
        self.proc.stdin.write(f"{batch}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
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


def _summary(runs: dict[tuple[str, int], list[dict]], base: str, batches: list[int], references: list[str]):
    """Rows (per engine and batch: best round, median ratio to `base` within rounds, BLEU) and pairs (ours
    against a peer of the same precision, per round) of the rounds run so far."""
    from multibranch.evaluate.metrics import score_corpus

    rows = []
    for (name, batch), rounds in runs.items():
        best = min(rounds, key=lambda run: run["seconds"])
        reference = runs[base, batch]
        ratios = [reference[i]["seconds"] / run["seconds"] for i, run in enumerate(rounds)]
        cpu_ratios = [reference[i]["cpu_seconds"] / run["cpu_seconds"] for i, run in enumerate(rounds)]
        bleu = score_corpus(best["hyps"], [references], metrics=("bleu",))["bleu"]["score"]
        rows.append({"engine": name, "batch": batch, "seconds": best["seconds"], "cpu_seconds": best["cpu_seconds"],
                     "sentences_per_s": len(references) / best["seconds"], "bleu": bleu,
                     "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "cpu_ratio_median": statistics.median(cpu_ratios),
                     "round_seconds": [run["seconds"] for run in rounds]})
    pairs = []
    for batch in batches:
        for ours, theirs in PAIRS:
            if (ours, batch) in runs and (theirs, batch) in runs:
                speedups = [b["seconds"] / a["seconds"]
                            for a, b in zip(runs[ours, batch], runs[theirs, batch], strict=True)]
                pairs.append({"ours": ours, "peer": theirs, "batch": batch, "speed_median": statistics.median(speedups),
                              "speed_min": min(speedups), "speed_max": max(speedups)})
    return rows, pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="standard or MAT checkpoint")
    parser.add_argument("--src", help="source lines (default: Multi30k valid, prepared by bench/common.py)")
    parser.add_argument("--ref", help="reference lines for --src")
    parser.add_argument("--name", default="ct2_decode", help="results file bench/results/<name>.json")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch", type=int, nargs="+", default=[32], help="sentences per batch; several: each")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds after each engine's warm-up")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", nargs="+", choices=ENGINES,
                        help="default: every engine this machine can run (bf16 rows need native bf16); on CUDA "
                             f"{' '.join(CUDA_ENGINES)}")
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--lines", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if bool(args.src) != bool(args.ref):
        parser.error("--src and --ref go together")
    args.engines = args.engines or _available_engines(args.device)

    import ctranslate2
    import torch

    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.convert.ct2 import export_ct2

    sources, references, corpus = _sentences(args)
    scratch = work_dir() / "ct2_decode"
    scratch.mkdir(parents=True, exist_ok=True)
    lines_file = scratch / "lines.json"
    lines_file.write_text(json.dumps(sources), encoding="utf-8")
    payload = load_checkpoint(args.ckpt)
    common = [str(Path(__file__).resolve()), "--ckpt", args.ckpt, "--lines", str(lines_file), "--beam", str(args.beam),
              "--batch", *map(str, args.batch), "--threads", str(args.threads), "--device", args.device]
    started, engines, failed = [], [], []
    try:
        for name in args.engines:  # all start and warm up at once (nothing is timed before every one is ready)
            cmd = [*common, "--worker", name]
            if name.startswith("ct2-"):
                directory = scratch / name
                export_ct2(payload, directory, quantization=name.removeprefix("ct2-"), force=True, source=args.ckpt)
                cmd += ["--model-dir", str(directory)]
            started.append(Engine(name, cmd, scratch / f"{name}.stderr"))
        for engine in started:
            try:
                engine.wait_ready()
                engines.append(engine)
            except RuntimeError as err:  # e.g. CTranslate2 without its CUDA libraries: reported, left out
                failed.append({"engine": engine.name, "error": str(err).strip().splitlines()[-1]})
                print(f"left out {engine.name}: {failed[-1]['error']}", flush=True)
        runs: dict[tuple[str, int], list[dict]] = {(e.name, b): [] for b in args.batch for e in engines}
        names = [e.name for e in engines]
        base = BASE[args.device] if BASE[args.device] in names else names[0]
        gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
        for r in range(args.rounds):
            shift = r % len(engines)
            for batch in args.batch:
                for engine in engines[shift:] + engines[:shift]:  # rotate who goes first
                    runs[engine.name, batch].append(engine.round(batch))
                    print(f"round {r + 1}: {engine.name} batch {batch} "
                          f"{len(sources) / runs[engine.name, batch][-1]['seconds']:.1f} sentences/s", flush=True)
            rows, pairs = _summary(runs, base, args.batch, references)  # saved every round: a cut-off run keeps some
            path = save_results(args.name, {
                "environment": {**environment(amp="none"), "ctranslate2": ctranslate2.__version__},
                "checkpoint": args.ckpt, "corpus": corpus, "sentences": len(sources), "device": args.device,
                "gpu": gpu, "beam": args.beam, "batch": args.batch, "threads": args.threads, "rounds": r + 1,
                "base": base, "rows": rows, "pairs": pairs, "failed": failed})
    finally:
        for engine in started:
            engine.close()

    from bench.report import ct2_decode

    print("\n" + "\n".join(ct2_decode(args.name)))
    print(f"written {path}")


if __name__ == "__main__":
    main()
