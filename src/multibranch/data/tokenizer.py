"""Tokenisation: one source of truth for ids, shared by prepare, train, translate and classify.

`Tokenizer` (SentencePiece): model ids are SentencePiece ids. Every model we train uses pad=0, unk=1,
bos=2, eos=3 (set when `prepare` trains the SentencePiece model). The serialized SentencePiece protos
travel inside every checkpoint, so a checkpoint alone can translate raw text.

`HFTokenizer` (classification with an imported BERT/RoBERTa): the Hugging Face model's own fast
tokenizer (its `tokenizers` JSON), so the ids are the HF model's ids; bos/eos are its CLS/SEP
(`[CLS]`/`[SEP]`, `<s>`/`</s>`), which the classification task puts around every text, as HF does.

Both have the same interface (vocabulary sizes, special ids, encode/decode, `to_state`/`files`);
`tokenizer_from_state` rebuilds either from a checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sentencepiece as spm

from multibranch.checkpoint.tokenizer_state import (
    HF_ID_NAMES,
    hf_ids_valid,
    hf_parts,
    hf_state,
    is_hf_state,
    spm_parts,
    spm_state,
)
from multibranch.errors import DataError

if TYPE_CHECKING:
    import torch

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# The model_prefix of a vocabulary over pre-tokenised BPE text (data/vocabulary.py): decoding joins `@@ `.
PRETOKENIZED_MARK = "multibranch:pretokenized-bpe"
BPE_CONTINUATION = "@@ "


def is_pretokenized(proto: bytes) -> bool:
    """Whether a serialized SentencePiece model is a vocabulary over pre-tokenised BPE text."""
    return PRETOKENIZED_MARK.encode() in proto


def word_ids(processor: spm.SentencePieceProcessor) -> dict[str, int]:
    """word -> id of a word vocabulary (data/vocabulary.py's WORD model; pieces are "▁" + word)."""
    return {processor.id_to_piece(i)[1:]: i for i in range(processor.get_piece_size())
            if not (processor.is_control(i) or processor.is_unknown(i))}


def encode_words(ids: dict[str, int], lines: list[str], unk_id: int) -> list[list[int]]:
    """Whitespace-split words -> ids, one `unk_id` per unknown word (SentencePiece would merge a run of
    unknown words into one <unk>; fairseq, whose preparation this text comes from, does not)."""
    return [[ids.get(word, unk_id) for word in line.split()] for line in lines]


def undo_bpe(text: str) -> str:
    """Join BPE continuations ("new@@ s" -> "news"), as fairseq's `--post-process subword_nmt` does."""
    return (text + " ").replace(BPE_CONTINUATION, "").strip()


def load_processor(proto: bytes, where: str | Path = "a SentencePiece model") -> spm.SentencePieceProcessor:
    """A SentencePiece processor from a serialized model (the bytes of a .model file); DataError naming
    `where` (its file) when the bytes are not one (truncated or corrupted)."""
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(proto)
    except (RuntimeError, OSError):
        raise DataError(f"{where}: not a readable SentencePiece model (truncated or corrupted)") from None
    return processor


@dataclass
class Tokenizer:
    """Source and target SentencePiece models (the same object when the vocabulary is joint)."""

    src_proto: bytes
    tgt_proto: bytes

    def __post_init__(self) -> None:
        self.src = load_processor(self.src_proto)
        self.tgt = self.src if self.tgt_proto == self.src_proto else load_processor(self.tgt_proto)
        self.words = {side: word_ids(processor) if is_pretokenized(proto) else None for side, processor, proto in
                      (("src", self.src, self.src_proto), ("tgt", self.tgt, self.tgt_proto))}

    @classmethod
    def from_files(cls, src_model: str | Path, tgt_model: str | Path | None = None) -> Tokenizer:
        src = Path(src_model).read_bytes()
        tgt = Path(tgt_model).read_bytes() if tgt_model else src
        try:
            return cls(src, tgt)
        except DataError:
            for path, proto in ((src_model, src), (tgt_model, tgt)):
                if path is not None:
                    load_processor(proto, path)  # names the file that does not load
            raise

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
        words = self.words["src"]
        return self.src.encode(lines) if words is None else encode_words(words, lines, self.src.unk_id())

    def encode_tgt(self, lines: list[str]) -> list[list[int]]:
        words = self.words["tgt"]
        return self.tgt.encode(lines) if words is None else encode_words(words, lines, self.tgt.unk_id())

    def sample_src(self, lines: list[str], alpha: float, seed: int) -> list[list[int]]:
        """Sampled segmentations of `lines` (subword regularisation: BPE-dropout with probability `alpha`
        for a BPE model, sampling with smoothing `alpha` for a unigram model), the same for the same
        `seed`: SentencePiece's generator is seeded and the lines are encoded one by one (its batch
        encoding samples in several threads, in no fixed order)."""
        spm.set_random_generator_seed(seed)
        return [self.src.encode(line, enable_sampling=True, alpha=alpha, nbest_size=-1) for line in lines]

    @property
    def unk_id(self) -> int:
        return self.src.unk_id()

    @property
    def pretokenized(self) -> bool:
        """Target ids are words of pre-tokenised BPE text: decoding undoes `@@ ` and does no detokenisation.
        (Read from the word table made at construction: scanning the model's bytes took ~40 us a call.)"""
        return self.words["tgt"] is not None

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """Detokenise target ids (special ids are dropped by SentencePiece); for pre-tokenised BPE text,
        join the `@@ ` continuations and leave the tokens as they are (the user's pipeline detokenises).
        One sentence per call: SentencePiece's batch decode starts a thread pool each call (~150 us, more
        than decoding a sentence; the search calls this per finished sentence)."""
        texts = [self.tgt.decode(sentence) for sentence in ids]
        return [undo_bpe(text) for text in texts] if self.pretokenized else texts

    def files(self) -> dict[str, bytes]:
        """The files a run directory's tokenizer/ folder holds."""
        return {"src.model": self.src_proto, "tgt.model": self.tgt_proto}

    def to_state(self) -> dict[str, torch.Tensor]:
        """Checkpoint form (checkpoint/tokenizer_state.py): the serialized protos as uint8 tensors."""
        return spm_state(self.src_proto, None if self.joint else self.tgt_proto)

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> Tokenizer:
        src, tgt = spm_parts(state)
        return cls(src, src if tgt is None else tgt)


HF_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json")  # a directory needs one of them


class HFTokenizer:
    """A Hugging Face fast tokenizer (`tokenizers` JSON) with the special ids of its model.

    `vocab_size` is the number of embedding rows the ids address (the model's config.json
    `vocab_size`, which may exceed the tokenizer's own count); bos/eos are the CLS/SEP tokens.
    `encode_src` gives ids without special tokens (the task adds bos and eos).
    """

    joint = True

    def __init__(self, tokenizer_json: bytes, vocab_size: int, pad: int, bos: int, eos: int, unk: int | None):
        from tokenizers import Tokenizer as Backend

        self.tokenizer_json = tokenizer_json
        self.backend = Backend.from_str(tokenizer_json.decode("utf-8"))
        # A saved tokenizer.json may pad or cut every text to a fixed length (sentence-transformers models
        # pad to 128): ids here are the text's own; the tasks add the specials, pad per batch and `prepare` cuts.
        self.backend.no_padding()
        self.backend.no_truncation()
        self.vocab_size = vocab_size
        self.ids = {"vocab_size": vocab_size, "pad": pad, "bos": bos, "eos": eos, "unk": -1 if unk is None else unk}

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> HFTokenizer:
        """The tokenizer of a local HF model directory (tokenizer.json, or vocab.txt / vocab.json +
        merges.txt converted by transformers); never the hub. DataError when there is none."""
        directory = Path(directory)
        if not directory.is_dir():
            raise DataError(f"{directory}: not a directory (expected a local Hugging Face model or tokenizer directory)")
        if not any((directory / name).is_file() for name in HF_TOKENIZER_FILES):
            # transformers would build an empty-vocabulary tokenizer from config.json alone
            raise DataError(f"{directory}: no Hugging Face tokenizer ({', '.join(HF_TOKENIZER_FILES)})")
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise DataError("Hugging Face tokenizers need transformers: pip install 'multibranch[hf]'") from None
        try:
            hf = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
            backend = hf.backend_tokenizer
        except Exception as err:  # any failure of transformers/tokenizers to read the files: one line
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise DataError(f"{directory}: transformers cannot load its tokenizer: {reason}") from None
        specials = {"pad": hf.pad_token_id, "bos": hf.cls_token_id, "eos": hf.sep_token_id}
        missing = [f"{name} ({token})" for name, token in zip(specials, ("pad", "cls", "sep")) if specials[name] is None]
        if missing:
            raise DataError(f"{directory}: the tokenizer has no {', '.join(missing)} token; a BERT/RoBERTa classifier "
                            "needs CLS, SEP and pad tokens")
        size = backend.get_vocab_size(with_added_tokens=True)
        vocab_size = max(size, max(backend.get_vocab(with_added_tokens=True).values()) + 1)
        config = directory / "config.json"
        if config.is_file():  # the model's embedding table may have more rows than the tokenizer has ids
            try:
                rows = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                rows = None
            if isinstance(rows, int):
                if rows < vocab_size:
                    raise DataError(f"{directory}: the tokenizer has ids up to {vocab_size - 1} but config.json has "
                                    f"vocab_size={rows}; tokenizer and model do not belong together")
                vocab_size = rows
        return cls(backend.to_str().encode("utf-8"), vocab_size, specials["pad"], specials["bos"], specials["eos"],
                   hf.unk_token_id)

    @property
    def src_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def pad_id(self) -> int:
        return self.ids["pad"]

    @property
    def bos_id(self) -> int:
        return self.ids["bos"]

    @property
    def eos_id(self) -> int:
        return self.ids["eos"]

    @property
    def unk_id(self) -> int:
        return self.ids["unk"]

    def describe(self) -> dict[str, int]:
        """Vocabulary size and special ids (for data.json and reports)."""
        return dict(self.ids)

    @classmethod
    def from_description(cls, tokenizer_json: bytes, ids: dict[str, Any], where: str) -> HFTokenizer:
        """The inverse of `describe` (unk -1 = none); DataError naming `where` for missing or bad ids."""
        if not hf_ids_valid(ids):
            raise DataError(f"{where}: corrupted (the Hugging Face tokenizer needs integer {', '.join(HF_ID_NAMES)})")
        unk = ids["unk"] if ids["unk"] >= 0 else None
        return cls(tokenizer_json, ids["vocab_size"], ids["pad"], ids["bos"], ids["eos"], unk)

    def encode_src(self, lines: list[str]) -> list[list[int]]:
        return [enc.ids for enc in self.backend.encode_batch(list(lines), add_special_tokens=False)]

    encode_tgt = encode_src

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        return self.backend.decode_batch(ids)

    def files(self) -> dict[str, bytes]:
        return {"tokenizer.json": self.tokenizer_json,
                "special_ids.json": (json.dumps(self.ids, indent=2) + "\n").encode("utf-8")}

    def to_state(self) -> dict[str, torch.Tensor]:
        """Checkpoint form (checkpoint/tokenizer_state.py): the JSON bytes and the special ids as tensors."""
        return hf_state(self.tokenizer_json, self.ids)

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> HFTokenizer:
        tokenizer_json, ids = hf_parts(state)
        return cls.from_description(tokenizer_json, ids, "checkpoint tokenizer")


AnyTokenizer = Tokenizer | HFTokenizer


def tokenizer_from_state(state: dict[str, Any]) -> AnyTokenizer:
    """The tokenizer of a checkpoint's `tokenizer` entry (SentencePiece or Hugging Face)."""
    return HFTokenizer.from_state(state) if is_hf_state(state) else Tokenizer.from_state(state)
