"""The encoding workers of `prepare`: forked from a single-threaded caller (a script without a main guard
works), started from a fork server while the caller runs threads (a server's engine, a progress bar's
monitor), so no worker inherits a lock that no thread of the worker will release; and the module they
import stays free of torch, so a fork server starts in a fraction of a second."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import sentencepiece as spm

from multibranch.data.encoding import ChunkEncoder, LengthFilter, encode_chunk
from multibranch.data.text import ParallelChunk
from multibranch.data.tokenizer import Tokenizer


def _tokenizer(tmp_path) -> Tokenizer:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"a house number {i} stands by the river\n" for i in range(200)), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "spm"), vocab_size=40,
                                   pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)
    proto = (tmp_path / "spm.model").read_bytes()
    return Tokenizer(proto, proto)


def test_workers_are_not_forked_from_a_caller_that_holds_a_lock(tmp_path):
    tokenizer = _tokenizer(tmp_path)
    held, release = threading.Lock(), threading.Event()
    holder = threading.Thread(target=lambda: (held.acquire(), release.wait(), held.release()))
    holder.start()
    try:
        chunks = [ParallelChunk(src=[f"house {i}", ""], tgt=[f"river {i}", "x"], first_line=2 * i + 1)
                  for i in range(6)]
        filters = LengthFilter(max_len=50, max_len_ratio=None, ratio_allowance=0)
        with ChunkEncoder(tokenizer, workers=2) as encoder:
            parents = {encoder.pool.apply(os.getppid) for _ in range(4)}
            results = list(encoder.map(chunks, filters))
    finally:
        release.set()
        holder.join()
    assert os.getpid() not in parents  # the workers' parent is the fork server, not this process
    for chunk, encoded in results:  # in order, and what one process computes
        alone = encode_chunk(tokenizer, chunk.src, chunk.tgt, filters)
        assert encoded.keep.tolist() == alone.keep.tolist() == [True, False]
        for side in ("src", "tgt"):
            assert [a.tolist() for a in encoded.encoded[side]] == [a.tolist() for a in alone.encoded[side]]


def test_a_script_without_a_main_guard_prepares_with_workers(tmp_path):
    """Single-threaded: forked workers, which do not run the caller's script again (a spawned or fork-server
    worker would, and a script without `if __name__ == "__main__":` would then prepare in every worker)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        from pathlib import Path
        from multibranch.data.parallel_prepare import PrepareConfig
        from multibranch.tasks.translation.prepare import prepare
        from multibranch.tasks.translation.synthetic import generate_synthetic_task
        root = Path({str(tmp_path)!r})
        generate_synthetic_task(root / "raw", seed=1, n_train=300, n_valid=20, n_test=20)
        meta = prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(root / "raw" / "train"),
                                     valid=str(root / "raw" / "valid"), out=str(root / "data"), vocab_size=120,
                                     workers=2, chunk_lines=50, progress=True))
        print(meta["splits"]["train"]["pairs"])
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) > 250


def test_the_worker_module_imports_without_torch():
    probe = "import sys, multibranch.data.encoding; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"



def test_workers_obey_sigterm_whatever_handler_the_caller_set(tmp_path):
    """Pool.terminate ends the workers with SIGTERM: a Python handler inherited from the CLI would run only
    when a worker next executes bytecode, so the workers restore the default action."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        with ChunkEncoder(_tokenizer(tmp_path), workers=2) as encoder:
            handlers = {encoder.pool.apply(signal.getsignal, (signal.SIGTERM,)) for _ in range(4)}
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert handlers == {signal.SIG_DFL}
