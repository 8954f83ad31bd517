"""`prepare`: raw parallel text -> a vocabulary + memory-mappable binarised shards + a report, streaming.

Inputs are fairseq-style `{prefix}.{lang}` files, read in chunks of `chunk_lines` pairs with the strict
line rules of `multibranch.data.text` (invalid UTF-8 and unequal line counts are errors naming the file
and line); pairs with an empty (or whitespace-only) side are dropped everywhere. Memory does not grow with
the corpus: two passes stream the files.

1. Scan: every split is read once, so bad input anywhere stops `prepare` before anything is written;
   the vocabulary's sample is drawn from the training pairs as they pass (a seeded reservoir sample
   of `spm_max_sentences` sentences, `--spm-sample`), or their words are counted (`--pretokenized`).
2. The vocabulary: SentencePiece trained on that sample (default), an existing SentencePiece model
   (`--spm-model`, data/vocabulary.py keeps its ids), or the words of pre-tokenised BPE text
   (`--pretokenized`, from a fairseq `dict.txt` or counted).
3. Encode: chunk by chunk in `workers` processes (data/encoding.py); training pairs
   longer than `max_len` subword tokens, or whose lengths differ by more than `max_len_ratio` (plus a
   small allowance for short sentences), are dropped. Validation and test pairs are references and are
   never length-filtered. Every drop is counted by reason in `data.json` and `report.md`.

Output directory (split names: `train`, `valid`, `test`, `test1`, ... for further test prefixes): the
layout is written down once, in data/parallel_prepare.py (its writer and settings); shards: data/shards.py.

Shard k of split S is `S` (k = 0) or `S.k`; data.json lists each split's shards. A directory of format
version 1 (one unnamed shard per split) loads as before. The directory is built in a temporary sibling
and swapped in at the end, so a failure or an interrupt never leaves a half-written output directory.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from multibranch.atomic import atomic_directory
from multibranch.data.directories import DATA, check_output_directory
from multibranch.data.parallel_prepare import (
    PrepareConfig,
    Scan,
    check_inputs,
    require_pairs,
    sample_pairs,
    vocabulary_protos,
    write_data_dir,
)
from multibranch.data.progress import progress_bar
from multibranch.data.text import ParallelChunk, count_lines, iter_parallel
from multibranch.errors import DataError


def prepare(cfg: PrepareConfig) -> dict[str, Any]:
    """Run the whole preparation; returns the `data.json` contents plus `out`."""
    cfg.validate()
    out = Path(cfg.out).resolve()
    check_inputs(cfg)
    check_output_directory(out, DATA, force=cfg.force, inputs=cfg.read_paths(), error=DataError)
    scan = scan_inputs(cfg) if needs_scan(cfg) else Scan()
    if scan.pairs:  # else the same checks run once the splits are written
        require_pairs(cfg, scan.pairs)
    protos = vocabulary_protos(cfg, scan)
    total = sum(scan.lines.values()) if scan.lines else _total_lines(cfg)
    del scan  # the sample is spent; encoding workers forked later would carry it
    streams = [(name, prefix, _file_chunks(cfg, prefix), None) for name, prefix in cfg.splits()]
    with atomic_directory(out) as tmp:
        meta = write_data_dir(cfg, protos, streams, tmp, total_lines=total)
    return {**meta, "out": cfg.out}


def needs_scan(cfg: PrepareConfig) -> bool:
    """Whether the vocabulary is built from the training text (a first pass over the files): a trained
    SentencePiece model, or words counted from pre-tokenised text. A reused model or dict.txt is applied
    in one pass; bad input is then found while writing, which leaves nothing behind either."""
    return cfg.vocabulary_kind == "trained" or (cfg.pretokenized and cfg.dict is None)


def _total_lines(cfg: PrepareConfig) -> int:
    """Lines of every split, counted only for a progress bar that will be shown."""
    if not (sys.stderr.isatty() if cfg.progress is None else cfg.progress):
        return 0
    return sum(count_lines(str(cfg.input_files(prefix)[0])) or 0 for _, prefix in cfg.splits())


# ------------------------------------------------------------------------------------ reading


def _file_chunks(cfg: PrepareConfig, prefix: str) -> Iterator[ParallelChunk]:
    return iter_parallel(*cfg.input_files(prefix), cfg.chunk_lines, encoding_errors=cfg.encoding_errors)


def _non_empty(chunk: ParallelChunk) -> tuple[list[str], list[str]]:
    """The pairs of a chunk with text on both sides."""
    kept = [(s, t) for s, t in zip(chunk.src, chunk.tgt, strict=True) if s.strip() and t.strip()]
    return [s for s, _ in kept], [t for _, t in kept]


def scan_inputs(cfg: PrepareConfig) -> Scan:
    """Pass 1: read every split (so bad input stops `prepare` before it writes), count lines and
    non-empty pairs, and gather the vocabulary's material from the training pairs."""
    scan = Scan()
    with progress_bar(cfg.progress, _total_lines(cfg), "prepare: reading") as bar:
        for name, prefix in cfg.splits():
            scan.lines[name] = scan.pairs[name] = 0
            for chunk in _file_chunks(cfg, prefix):
                src, tgt = _non_empty(chunk)
                scan.lines[name] += len(chunk)
                scan.pairs[name] += len(src)
                if name == "train":
                    sample_pairs(cfg, scan, src, tgt)
                bar.update(len(chunk))
    return scan
