"""Loading a directory written by `prepare`: metadata, tokenizer, and memory-mapped splits.

    data = PreparedData.load("runs/m30k/data")
    train = data.split("train")
    train.src(0), train.tgt(0)          # int32 id arrays without EOS (views into a memory map)
    train.src_lengths                   # int64 [n], lengths without EOS
    data.tokenizer().decode_tgt([train.tgt(0).tolist()])
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from multibranch.data.meta import read_meta
from multibranch.data.text import read_lines
from multibranch.data.tokenizer import Tokenizer
from multibranch.errors import DataError
from multibranch.tasks.translation.prepare import FORMAT, FORMAT_VERSION, SIDES, fingerprint


@dataclass
class ParallelSplit:
    """One split: concatenated token arrays with offsets per side (sentence i = tokens[off[i]:off[i+1]])."""

    name: str
    src_tokens: np.ndarray  # [N_src] int32
    src_offsets: np.ndarray  # [n+1] int64
    tgt_tokens: np.ndarray  # [N_tgt] int32
    tgt_offsets: np.ndarray  # [n+1] int64
    raw_paths: tuple[Path, Path] | None = None

    def __post_init__(self) -> None:
        self.src_lengths = np.diff(np.asarray(self.src_offsets)).astype(np.int64, copy=False)  # [n]
        self.tgt_lengths = np.diff(np.asarray(self.tgt_offsets)).astype(np.int64, copy=False)  # [n]

    @classmethod
    def from_sequences(cls, src: list[list[int]], tgt: list[list[int]], name: str = "memory") -> ParallelSplit:
        """An in-memory split (tests, small tasks); the id lists must not contain BOS/EOS."""
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source vs {len(tgt)} target sequences")

        def pack(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
            offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
            np.cumsum([len(s) for s in seqs], out=offsets[1:])
            tokens = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
            return tokens, offsets

        return cls(name, *pack(src), *pack(tgt))

    def __len__(self) -> int:
        return len(self.src_lengths)

    def src(self, i: int) -> np.ndarray:
        return self.src_tokens[self.src_offsets[i] : self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_tokens[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]

    def raw_src_lines(self) -> list[str]:
        """The cleaned source text of this split, one line per example."""
        return self._raw(0)

    def raw_tgt_lines(self) -> list[str]:
        """The cleaned target text (BLEU references), one line per example."""
        return self._raw(1)

    def _raw(self, side: int) -> list[str]:
        if self.raw_paths is None:
            raise DataError(f"split {self.name!r} has no raw text (it was built in memory)")
        lines = read_lines(self.raw_paths[side]).lines
        if len(lines) != len(self):
            raise DataError(
                f"{self.raw_paths[side]}: {len(lines)} lines but the split has {len(self)} examples; "
                "the data directory is corrupted, run prepare again"
            )
        return lines


class PreparedData:
    """A prepared data directory (see `multibranch.tasks.translation.prepare` for the layout)."""

    def __init__(self, directory: Path, meta: dict[str, Any]) -> None:
        self.directory = directory
        self.meta = meta
        self._splits: dict[str, ParallelSplit] = {}

    @classmethod
    def load(cls, directory: str | Path) -> PreparedData:
        directory = Path(directory)
        meta = read_meta(directory, FORMAT, FORMAT_VERSION, ("spm", "splits", "fingerprint", "vocab_size"), "multibranch")
        for name in sorted(set(meta["spm"].values())):
            if not (directory / name).is_file():
                raise DataError(f"{directory / name}: missing; run `multibranch prepare` again")
        return cls(directory, meta)

    @property
    def fingerprint(self) -> str:
        return self.meta["fingerprint"]

    @property
    def split_names(self) -> list[str]:
        return list(self.meta["splits"])

    def verify(self) -> None:
        """Recompute the fingerprint from the files; DataError if they changed since `prepare`."""
        actual = fingerprint(self.directory, self.meta["spm"], self.split_names)
        if actual != self.fingerprint:
            raise DataError(f"{self.directory}: files do not match data.json's fingerprint; run prepare again")

    def tokenizer(self):
        """The `Tokenizer` of this data (SentencePiece model(s) written by prepare)."""

        spm = self.meta["spm"]
        tgt = None if spm["tgt"] == spm["src"] else self.directory / spm["tgt"]
        return Tokenizer.from_files(self.directory / spm["src"], tgt)

    def split(self, name: str) -> ParallelSplit:
        if name not in self.meta["splits"]:
            raise DataError(f"{self.directory}: no split {name!r}; available: {', '.join(self.split_names)}")
        if name not in self._splits:
            self._splits[name] = self._load_split(name)
        return self._splits[name]

    def _load_split(self, name: str) -> ParallelSplit:
        arrays = {}
        for side in SIDES:
            for kind in ("tokens", "offsets"):
                path = self.directory / f"{name}.{side}.{kind}.npy"
                if not path.is_file():
                    raise DataError(f"{path}: missing; run `multibranch prepare` again")
                try:
                    arrays[f"{side}_{kind}"] = np.load(path, mmap_mode="r", allow_pickle=False)
                except (ValueError, OSError) as err:
                    raise DataError(f"{path}: corrupted ({err}); run `multibranch prepare` again") from None
        n = self.meta["splits"][name]["pairs"]
        for side in SIDES:
            tokens, offsets = arrays[f"{side}_tokens"], arrays[f"{side}_offsets"]
            ok = (
                tokens.ndim == 1 and offsets.ndim == 1 and len(offsets) == n + 1
                and np.issubdtype(tokens.dtype, np.integer) and np.issubdtype(offsets.dtype, np.integer)
                and int(offsets[0]) == 0 and int(offsets[-1]) == len(tokens)
            )
            if not ok:
                raise DataError(
                    f"{self.directory}/{name}.{side}.*.npy: corrupted (shape/offsets do not match data.json); "
                    "run `multibranch prepare` again"
                )
        raw = (self.directory / f"{name}.src.txt", self.directory / f"{name}.tgt.txt")
        return ParallelSplit(name, raw_paths=raw, **arrays)
