"""Export a checkpoint as a release directory, and read such a directory back.

    OUT/model.safetensors     the state dict; a tensor shared by several keys (tied embeddings) is
                              stored once, the other keys are listed in config.json "tied_weights"
    OUT/config.json           format + version, the resolved ExperimentConfig, tied weights, key
                              order, tokenizer file names and their sha256, meta (step, validation scores, ...)
    OUT/sentencepiece.model   joint vocabulary, or OUT/source.model + OUT/target.model, or
    OUT/tokenizer.json        a Hugging Face tokenizer (imported BERT/RoBERTa; its ids in config.json)

`load_export(OUT)` returns a payload shaped like `checkpoint.format.load_checkpoint`'s, so any code
that takes a payload (load_model, averaging, conversions) can read an exported directory. The payload's
config is written as given: convert/export.py validates it first (this layer knows no experiment).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import sentencepiece as spm
from safetensors.torch import load_file, save
from torch import Tensor

from multibranch import __version__
from multibranch.atomic import atomic_directory, atomic_write_bytes
from multibranch.checkpoint.payload import FORMAT, VERSION, tied_groups
from multibranch.checkpoint.tokenizer_state import (
    HF_ID_NAMES,
    hf_ids_valid,
    hf_parts,
    hf_state,
    is_hf_state,
    spm_parts,
    spm_state,
)
from multibranch.errors import CheckpointError
from multibranch.json_file import read_json_object

EXPORT_FORMAT = "multibranch-export"
EXPORT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
JOINT_SPM, SOURCE_SPM, TARGET_SPM = "sentencepiece.model", "source.model", "target.model"
HF_TOKENIZER = "tokenizer.json"


def export(payload: dict[str, Any], out_dir: str | Path, *, force: bool = False) -> list[Path]:
    """Write `payload` (its model, config, tokenizer, meta; never training state) to `out_dir`, built beside it
    and swapped in when complete (an existing export is replaced whole, or left as it was)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} is not empty; pass --force to replace the export in it")
    with atomic_directory(out) as folder:  # a complete export replaces the directory, or nothing changes
        written = _write_export(payload, folder)
    return [out / path.name for path in written]


def _write_export(payload: dict[str, Any], out: Path) -> list[Path]:
    """The files of `export`, written into the (empty) directory `out`."""
    config = payload["config"]
    state: dict[str, Tensor] = payload["model"]
    aliases = tied_groups(state)
    tensors = {key: _standalone(t) for key, t in state.items() if key not in aliases}

    written = []
    weights = save(tensors, metadata={"format": "pt", "tied_weights": json.dumps(aliases)})
    written.append(_write_bytes(out / WEIGHTS_FILE, weights))

    tokenizer_files = None
    tokenizer = payload.get("tokenizer")
    if tokenizer:
        if is_hf_state(tokenizer):
            tokenizer_json, ids = hf_parts(tokenizer)
            tokenizer_files = {"hf": HF_TOKENIZER, "ids": ids}
            written.append(_write_bytes(out / HF_TOKENIZER, tokenizer_json))
        else:
            src_proto, tgt_proto = spm_parts(tokenizer)
            if tgt_proto is None or tgt_proto == src_proto:
                tokenizer_files = {"src": JOINT_SPM, "tgt": JOINT_SPM}
                written.append(_write_bytes(out / JOINT_SPM, src_proto))
            else:
                tokenizer_files = {"src": SOURCE_SPM, "tgt": TARGET_SPM}
                written.append(_write_bytes(out / SOURCE_SPM, src_proto))
                written.append(_write_bytes(out / TARGET_SPM, tgt_proto))

    if tokenizer_files is not None:  # checked on loading: a truncated or changed vocabulary is named, not decoded
        tokenizer_files["sha256"] = recorded_sha256(written[1:])
    document = {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_VERSION,
        "multibranch_version": __version__,
        "config": config,
        "tied_weights": aliases,
        "state_keys": list(state),
        "tokenizer": tokenizer_files,
        "meta": payload.get("meta") or {},
    }
    text = json.dumps(document, indent=2, default=_jsonable, ensure_ascii=False) + "\n"
    written.append(_write_bytes(out / CONFIG_FILE, text.encode("utf-8")))  # last: marks a complete export
    return written


def load_export(directory: str | Path) -> dict[str, Any]:
    """The payload of an exported directory (tied keys share one tensor again)."""
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{directory} is not an exported model (no {CONFIG_FILE})")
    document = read_json_object(config_path, CheckpointError)
    if document.get("format") != EXPORT_FORMAT:
        raise CheckpointError(f"{config_path} is not a multibranch export (no '{EXPORT_FORMAT}' format)")
    if document.get("format_version", 0) > EXPORT_VERSION:
        raise CheckpointError(f"{directory} was exported by a newer multibranch (format {document['format_version']})")
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{directory} is incomplete: missing {WEIGHTS_FILE}")
    try:
        stored = load_file(str(weights))
    except Exception as err:
        raise CheckpointError(f"{weights} is corrupted ({type(err).__name__}: {err})") from None
    for alias, canonical in document.get("tied_weights", {}).items():
        stored[alias] = stored[canonical]
    order = document.get("state_keys") or sorted(stored)
    if set(order) != set(stored):
        raise CheckpointError(f"{weights} does not hold the tensors {config_path} lists")
    state = {key: stored[key] for key in order}

    tokenizer = None
    files = document.get("tokenizer")
    if files:
        paths = [directory / files[side] for side in (("hf",) if "hf" in files else ("src", "tgt"))]
        for path in paths:
            if not path.is_file():
                raise CheckpointError(f"{directory} is incomplete: missing {path.name}")
            check_recorded_sha256(path, files.get("sha256") or {})
        if "hf" in files:
            ids = files.get("ids") or {}
            if not hf_ids_valid(ids):
                raise CheckpointError(f"{config_path}: corrupted (the Hugging Face tokenizer needs integer "
                                      f"{', '.join(HF_ID_NAMES)})")
            tokenizer = hf_state(paths[0].read_bytes(), ids)
        else:
            src_proto, tgt_proto = paths[0].read_bytes(), paths[1].read_bytes()
            for path, proto in {paths[0]: src_proto, paths[1]: tgt_proto}.items():
                _check_spm(path, proto)
            tokenizer = spm_state(src_proto, None if tgt_proto == src_proto else tgt_proto)
    return {
        "format": FORMAT,
        "version": VERSION,
        "config": document["config"],
        "model": state,
        "tokenizer": tokenizer,
        "meta": document.get("meta") or {},
    }


def recorded_sha256(paths: list[Path]) -> dict[str, str]:
    """{file name: sha256 of its bytes}: what an export or CTranslate2 directory records of its vocabulary."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in paths}


def check_recorded_sha256(path: Path, recorded: dict[str, str]) -> None:
    """CheckpointError naming `path` when its bytes differ from the checksum its directory recorded
    (directories written before checksums were recorded have none, and pass)."""
    expected = recorded.get(path.name)
    if expected is not None and recorded_sha256([path])[path.name] != expected:
        raise CheckpointError(f"{path}: differs from the file this directory was exported with (truncated or "
                              "changed); export the checkpoint again")


def _check_spm(path: Path, proto: bytes) -> None:
    """CheckpointError naming `path` unless `proto` loads as a SentencePiece model."""
    try:
        spm.SentencePieceProcessor().LoadFromSerializedProto(proto)
    except (RuntimeError, OSError):
        raise CheckpointError(f"{path}: not a readable SentencePiece model (truncated or corrupted); export the "
                              "checkpoint again") from None


def _standalone(t: Tensor) -> Tensor:
    """A contiguous tensor owning exactly its memory (safetensors refuses partial views)."""
    t = t.detach().contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def _write_bytes(path: Path, data: bytes) -> Path:
    atomic_write_bytes(path, data)
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
