"""How a tokenizer is stored in a checkpoint payload: plain tensors, loadable with weights_only=True.

    SentencePiece:  {"src": uint8 proto bytes, "tgt": uint8 proto bytes (absent when joint)}
    Hugging Face:   {"hf_json": uint8 tokenizer.json bytes, "hf_ids": int64 [vocab_size, pad, bos, eos, unk]}

data/tokenizer.py builds tokenizers from these; export directories store the same bytes as files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multibranch.errors import CheckpointError

if TYPE_CHECKING:  # torch is imported where a tensor is made: a worker that only encodes text stays light
    import torch

HF_ID_NAMES = ("vocab_size", "pad", "bos", "eos", "unk")


def missing_tokenizer(where: str, needed_for: str) -> CheckpointError:
    """The error for a checkpoint that kept no tokenizer; `needed_for` says what the tokenizer is needed for."""
    return CheckpointError(f"{where} has no tokenizer, which {needed_for}")


def _bytes_tensor(data: bytes) -> torch.Tensor:
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def tensor_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.numpy().tobytes())


def spm_state(src_proto: bytes, tgt_proto: bytes | None) -> dict[str, torch.Tensor]:
    """SentencePiece protos; `tgt_proto` None for a joint vocabulary."""
    state = {"src": _bytes_tensor(src_proto)}
    if tgt_proto is not None:
        state["tgt"] = _bytes_tensor(tgt_proto)
    return state


def hf_ids_valid(ids: dict[str, Any]) -> bool:
    return all(isinstance(ids.get(name), int) for name in HF_ID_NAMES)


def hf_state(tokenizer_json: bytes, ids: dict[str, int]) -> dict[str, torch.Tensor]:
    """A Hugging Face tokenizer.json with its model's special ids (HF_ID_NAMES; unk -1: none)."""
    import torch

    return {"hf_json": _bytes_tensor(tokenizer_json),
            "hf_ids": torch.tensor([ids[name] for name in HF_ID_NAMES], dtype=torch.int64)}


def is_hf_state(state: dict[str, Any]) -> bool:
    return "hf_json" in state


def hf_parts(state: dict[str, torch.Tensor]) -> tuple[bytes, dict[str, int]]:
    """(tokenizer.json bytes, special ids) of a Hugging Face tokenizer state."""
    return tensor_bytes(state["hf_json"]), dict(zip(HF_ID_NAMES, state["hf_ids"].tolist(), strict=True))


def spm_parts(state: dict[str, torch.Tensor]) -> tuple[bytes, bytes | None]:
    """(source proto, target proto or None when joint) of a SentencePiece tokenizer state."""
    return tensor_bytes(state["src"]), tensor_bytes(state["tgt"]) if "tgt" in state else None
