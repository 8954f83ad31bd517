"""Loading a directory written by `prepare_classification`: labels, tokenizer, memory-mapped splits.

    data = ClassificationData.load("runs/trec6/data")
    train = data.split("train")
    train.ids(0), train.labels[0]       # int32 ids without BOS/EOS (a view into a memory map), label id
    train.lengths                       # int64 [n]
    data.labels[train.labels[0]]        # the label's name
    data.tokenizer().encode_src(["How far is it ?"])
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from multibranch.data.meta import AGAIN, META_FILE, read_meta
from multibranch.data.shards import binarise
from multibranch.data.text import read_lines
from multibranch.data.tokenizer import HFTokenizer, Tokenizer  # imports torch: only when asked
from multibranch.errors import DataError
from multibranch.tasks.classification.prepare import ARRAYS, FORMAT, FORMAT_VERSION, fingerprint

if TYPE_CHECKING:
    from multibranch.data.tokenizer import HFTokenizer, Tokenizer



@dataclass
class ClassificationSplit:
    """One split: concatenated token ids with offsets (text i = tokens[offsets[i]:offsets[i+1]]) and labels."""

    name: str
    tokens: np.ndarray  # [N] int32
    offsets: np.ndarray  # [n+1] int64
    labels: np.ndarray  # [n] int64 label ids
    raw_path: Path | None = None

    def __post_init__(self) -> None:
        self.lengths = np.diff(np.asarray(self.offsets)).astype(np.int64, copy=False)  # [n]

    @classmethod
    def from_sequences(cls, ids: list[list[int]], labels: list[int], name: str = "memory") -> ClassificationSplit:
        """An in-memory split (tests, small tasks); the id lists must not contain BOS/EOS."""
        if len(ids) != len(labels):
            raise ValueError(f"{len(ids)} texts vs {len(labels)} labels")
        return cls(name, *binarise(ids), np.asarray(labels, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.labels)

    def ids(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def raw_lines(self) -> list[str]:
        """The kept raw texts of this split (untruncated), one per example."""
        if self.raw_path is None:
            raise DataError(f"split {self.name!r} has no raw text (it was built in memory)")
        lines = read_lines(self.raw_path).lines
        if len(lines) != len(self):
            raise DataError(f"{self.raw_path}: {len(lines)} lines but the split has {len(self)} examples; "
                            f"the data directory is corrupted, {AGAIN}")
        return lines


class ClassificationData:
    """A prepared classification directory (see `multibranch.tasks.classification.prepare` for the layout)."""

    def __init__(self, directory: Path, meta: dict[str, Any]) -> None:
        self.directory = directory
        self.meta = meta
        self._splits: dict[str, ClassificationSplit] = {}

    @classmethod
    def load(cls, directory: str | Path) -> ClassificationData:
        directory = Path(directory)
        meta = read_meta(directory, FORMAT, FORMAT_VERSION, ("spm", "labels", "splits", "fingerprint", "vocab_size"),
                         "classification")
        meta_path = directory / META_FILE
        labels = meta["labels"]
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels) \
                or len(set(labels)) != len(labels):
            raise DataError(f"{meta_path}: corrupted (labels must be a list of distinct strings); {AGAIN}")
        hf = meta.get("hf_tokenizer")
        if hf is not None and not (isinstance(hf, dict) and isinstance(hf.get("file"), str)):
            raise DataError(f"{meta_path}: corrupted (hf_tokenizer); {AGAIN}")
        if meta["spm"] is None and hf is None:
            raise DataError(f"{meta_path}: corrupted (neither spm nor hf_tokenizer); {AGAIN}")
        tokenizer_file = directory / (hf["file"] if hf else meta["spm"])
        if not tokenizer_file.is_file():
            raise DataError(f"{tokenizer_file}: missing; {AGAIN}")
        return cls(directory, meta)

    @property
    def tokenizer_file(self) -> str:
        """The tokenizer's file name in the directory (SentencePiece model or HF tokenizer.json)."""
        hf = self.meta.get("hf_tokenizer")
        return hf["file"] if hf else self.meta["spm"]

    @property
    def fingerprint(self) -> str:
        return self.meta["fingerprint"]

    @property
    def labels(self) -> list[str]:
        """Label names; label id i is `labels[i]`."""
        return list(self.meta["labels"])

    @property
    def pairs(self) -> bool:
        """Whether the examples are sentence pairs (stored as `a + separator + b`)."""
        return bool(self.meta.get("pairs", False))

    @property
    def num_labels(self) -> int:
        return len(self.meta["labels"])

    @property
    def split_names(self) -> list[str]:
        return list(self.meta["splits"])

    def verify(self) -> None:
        """Recompute the fingerprint from the files; DataError if they changed since `prepare`."""
        if fingerprint(self.directory, self.labels, self.split_names, self.tokenizer_file) != self.fingerprint:
            raise DataError(f"{self.directory}: files do not match data.json's fingerprint; {AGAIN}")

    def tokenizer(self) -> Tokenizer | HFTokenizer:
        """The tokenizer of this data: its SentencePiece model (as a joint `Tokenizer`), or the Hugging Face
        tokenizer it was prepared with; use `encode_src`."""

        hf = self.meta.get("hf_tokenizer")
        if hf:
            return HFTokenizer.from_description((self.directory / hf["file"]).read_bytes(), hf,
                                                str(self.directory / META_FILE))
        return Tokenizer.from_files(self.directory / self.meta["spm"])

    def split(self, name: str) -> ClassificationSplit:
        if name not in self.meta["splits"]:
            raise DataError(f"{self.directory}: no split {name!r}; available: {', '.join(self.split_names)}")
        if name not in self._splits:
            self._splits[name] = self._load_split(name)
        return self._splits[name]

    def _load_split(self, name: str) -> ClassificationSplit:
        arrays = {}
        for kind in ARRAYS:
            path = self.directory / f"{name}.{kind}.npy"
            if not path.is_file():
                raise DataError(f"{path}: missing; {AGAIN}")
            try:
                arrays[kind] = np.load(path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError) as err:
                raise DataError(f"{path}: corrupted ({err}); {AGAIN}") from None
        n = self.meta["splits"][name]["examples"]
        tokens, offsets, labels = arrays["tokens"], arrays["offsets"], arrays["labels"]
        ok = (
            tokens.ndim == 1 and offsets.ndim == 1 and labels.ndim == 1
            and all(np.issubdtype(a.dtype, np.integer) for a in (tokens, offsets, labels))
            and len(offsets) == n + 1 and len(labels) == n
            and int(offsets[0]) == 0 and int(offsets[-1]) == len(tokens)
            and (n == 0 or (int(labels.min()) >= 0 and int(labels.max()) < self.num_labels))
        )
        if not ok:
            raise DataError(f"{self.directory}/{name}.*.npy: corrupted (shapes, offsets or label ids do not match "
                            f"data.json); {AGAIN}")
        return ClassificationSplit(name, tokens, offsets, labels, raw_path=self.directory / f"{name}.txt")
