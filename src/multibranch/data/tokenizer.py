"""SentencePiece tokenisation: one source of truth for ids, shared by prepare, train and translate.

Model ids are SentencePiece ids. Every model we train uses pad=0, unk=1, bos=2, eos=3 (set when
`prepare` trains the SentencePiece model). The serialized SentencePiece protos travel inside every
checkpoint, so a checkpoint alone can translate raw text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
import torch

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


def load_processor(proto: bytes) -> spm.SentencePieceProcessor:
    """A SentencePiece processor from a serialized model (the bytes of a .model file)."""
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(proto)
    return processor


@dataclass
class Tokenizer:
    """Source and target SentencePiece models (the same object when the vocabulary is joint)."""

    src_proto: bytes
    tgt_proto: bytes

    def __post_init__(self) -> None:
        self.src = load_processor(self.src_proto)
        self.tgt = self.src if self.tgt_proto == self.src_proto else load_processor(self.tgt_proto)

    @classmethod
    def from_files(cls, src_model: str | Path, tgt_model: str | Path | None = None) -> Tokenizer:
        src = Path(src_model).read_bytes()
        return cls(src, Path(tgt_model).read_bytes() if tgt_model else src)

    @property
    def joint(self) -> bool:
        return self.src_proto == self.tgt_proto

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_piece_size()

    @property
    def pad_id(self) -> int:
        return self.tgt.pad_id()

    @property
    def bos_id(self) -> int:
        return self.tgt.bos_id()

    @property
    def eos_id(self) -> int:
        return self.tgt.eos_id()

    def encode_src(self, lines: list[str]) -> list[list[int]]:
        return self.src.encode(lines)

    def encode_tgt(self, lines: list[str]) -> list[list[int]]:
        return self.tgt.encode(lines)

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """Detokenise target ids (special ids are dropped by SentencePiece)."""
        return self.tgt.decode(ids)

    def to_state(self) -> dict[str, torch.Tensor]:
        """Checkpoint form: the serialized protos as uint8 tensors (loadable with weights_only=True)."""
        state = {"src": torch.frombuffer(bytearray(self.src_proto), dtype=torch.uint8)}
        if not self.joint:
            state["tgt"] = torch.frombuffer(bytearray(self.tgt_proto), dtype=torch.uint8)
        return state

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> Tokenizer:
        src = bytes(state["src"].numpy().tobytes())
        tgt = bytes(state["tgt"].numpy().tobytes()) if "tgt" in state else src
        return cls(src, tgt)
