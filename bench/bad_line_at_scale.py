"""A malformed line deep in a large corpus: `multibranch prepare` must name file:line within seconds of reaching
it and leave nothing behind (the case measured: a malformed line at line 7,000,001).

A synthetic corpus (never committed) of `--line - 1` good pairs, then one target line with an invalid UTF-8 byte,
then 1,000 more good pairs, is prepared twice as a user would, with the CLI in a fresh process:

- `prepare --spm-model M` (one pass: read, encode, write shards), against the same command on the corpus cut
  just before the bad line (the clean prefix, prepared completely): when both take about as long, the error
  came as soon as the reader got there;
- `prepare` with SentencePiece trained on a sample (the default): its sampling pass reads the whole corpus
  first, so the error comes from that pass, before anything is encoded.

Each run: exit status, wall seconds, the error line, and whether the output directory exists afterwards.

    python bench/bad_line_at_scale.py --line 7000001          # the case measured (about 10 minutes on 2 cores)
    python bench/bad_line_at_scale.py --line 20001 --name bad_line_smoke
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "src")]

from bench.common import ROOT, environment, save_results, work_dir  # noqa: E402

PREPARE_TIMEOUT: float | None = None  # seconds a prepare may take (the test sets one: a hang is a failure)
POOL = 20_000  # distinct generated pairs, repeated to the corpus size (the sentences' content does not matter)


def _pool(seed: int = 1) -> list[tuple[str, str]]:
    from multibranch.tasks.translation.synthetic import Grammar, build_lexicon

    grammar, rng = Grammar(build_lexicon(seed)), random.Random(f"bad-line:{seed}")
    pairs = []
    for _ in range(POOL):
        (s1, t1), (s2, t2) = grammar.sentence(rng), grammar.sentence(rng)
        pairs.append((f"{s1} {s2}", f"{t1} {t2}"))
    return pairs


def _write(prefix: Path, pool: list[tuple[str, str]], good_before: int, bad: bool, good_after: int) -> None:
    """good_before pairs, then (if `bad`) a pair whose target has an invalid UTF-8 byte, then good_after pairs."""
    block_src = "".join(s + "\n" for s, _ in pool).encode()
    block_tgt = "".join(t + "\n" for _, t in pool).encode()
    with open(f"{prefix}.src", "wb") as src, open(f"{prefix}.tgt", "wb") as tgt:
        for start in range(0, good_before, POOL):
            n = min(POOL, good_before - start)
            src.write(block_src if n == POOL else "".join(s + "\n" for s, _ in pool[:n]).encode())
            tgt.write(block_tgt if n == POOL else "".join(t + "\n" for _, t in pool[:n]).encode())
        if bad:
            src.write(b"a perfectly fine source line\n")
            tgt.write(b"a target line with a bad \xff byte\n")
        src.write("".join(s + "\n" for s, _ in pool[:good_after]).encode())
        tgt.write("".join(t + "\n" for _, t in pool[:good_after]).encode())


def _spm_model(pool: list[tuple[str, str]], path: Path) -> None:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(sentence_iterator=iter([s for pair in pool for s in pair]),
                                   model_prefix=str(path.with_suffix("")), vocab_size=500, model_type="unigram",
                                   pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)


def _prepare(name: str, train: Path, valid: Path, out: Path, extra: list[str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "multibranch", "prepare", "--src", "src", "--tgt", "tgt", "--train", str(train),
           "--valid", str(valid), "--out", str(out), *extra]
    start = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=PREPARE_TIMEOUT)
    seconds = time.perf_counter() - start
    errors = [line for line in run.stderr.splitlines() if line.strip()]
    row = {"run": name, "exit": run.returncode, "seconds": seconds, "error": errors[-1] if errors else "",
           "stderr_lines": len(errors), "output_left": out.exists()}
    print(f"{name}: exit {row['exit']} after {seconds:.1f} s; {row['error'][:160]}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--line", type=int, default=7_000_001, help="the 1-based line number of the bad line")
    parser.add_argument("--name", default="bad_line_at_scale", help="results file bench/results/<name>.json")
    args = parser.parse_args()
    scratch = work_dir() / "bad_line"
    scratch.mkdir(parents=True, exist_ok=True)
    pool = _pool()
    model = scratch / "spm.model"
    _spm_model(pool, model)
    _write(scratch / "valid", pool, 1000, False, 0)
    _write(scratch / "bad", pool, args.line - 1, True, 1000)
    _write(scratch / "clean", pool, args.line - 1, False, 0)
    rows = [
        _prepare("--spm-model, bad line", scratch / "bad", scratch / "valid", scratch / "out", ["--spm-model", str(model)]),
        _prepare("--spm-model, clean prefix (complete)", scratch / "clean", scratch / "valid", scratch / "out",
                 ["--spm-model", str(model)]),
        _prepare("default (sampled SentencePiece), bad line", scratch / "bad", scratch / "valid", scratch / "out",
                 ["--vocab-size", "500"]),
    ]
    shutil.rmtree(scratch / "out", ignore_errors=True)
    for prefix in ("bad", "clean"):
        for side in ("src", "tgt"):
            Path(f"{scratch / prefix}.{side}").unlink()
    path = save_results(args.name, {"environment": environment(amp="none"), "line": args.line, "rows": rows})
    print(f"written {path}")


if __name__ == "__main__":
    main()
