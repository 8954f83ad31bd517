"""Import a local Hugging Face `MarianMTModel` directory as a standard multibranch Transformer.

Needs the optional extra `multibranch[hf]` (transformers, imported here only). Only LOCAL
directories are read (`local_files_only=True`); the hub is never contacted.

Architecture mapping (HF Marian = post-norm Transformer, sinusoidal positions from 0, no final LN):
    q_proj | k_proj | v_proj (+ biases)     -> <attn>.in_proj.weight / .bias   (rows Q | K | V)
    out_proj.weight / .bias                 -> <attn>.out_proj.weight / .out_bias[0]
    self_attn_layer_norm                    -> self_attn_residual.norm
    encoder_attn, encoder_attn_layer_norm   -> cross_attn, cross_attn_residual.norm
    fc1, fc2 (+ biases), final_layer_norm   -> ffn.fc1, ffn.fc2 + ffn.fc2_bias[0], ffn_residual.norm
    embed_tokens / lm_head / ties           -> share_embeddings "all" | "decoder" | "none"
    final_logits_bias                       -> output_bias (model.output_bias=True when non-zero)
    activation_function, scale_embedding, dropouts, pad/eos ids; bos_id = decoder_start_token_id

Vocabulary. HF Marian ids are `vocab.json` ids, but multibranch model ids are raw SentencePiece ids
(one source of truth, `data/tokenizer.py`). When the directory has `source.spm`, `target.spm` and
`vocab.json`, the embedding/output rows are permuted into SentencePiece-id order so the checkpoint
translates raw text with the stored SentencePiece models:
    our id i < |spm|          -> the row of vocab[piece_i] (source side by source.spm, target side by target.spm)
    gap rows (|spm_s| <= i < max |spm|) -> the <unk> row (never produced by that side's SentencePiece)
    i >= max |spm|            -> vocab entries that are no SentencePiece piece (<pad>, >>lang<< tags)
A piece missing from vocab.json reads as <unk> (as in HF's tokenizer). Target-side "filler" rows get
an output bias of FILLER_BIAS so they are never generated: gap rows, pieces missing from vocab.json,
and the extra ids beyond SentencePiece (target SentencePiece cannot detokenise them; <pad> and the
decoder start are masked by beam search anyway). Logits of every other target token equal HF's;
HF's softmax additionally covers tokens our target side never produces (e.g. source-only pieces of
a joint vocabulary, <pad>, >>lang<< tags), so log-probabilities may differ by that (tiny) mass. HF's Moses punctuation normalisation (applied when
sacremoses is installed) and `>>lang<<` prefixes are not reproduced by our tokenizer.
Without those files (or with use_tokenizer=False) ids stay HF ids and no tokenizer is stored.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from multibranch.checkpoint.format import CheckpointError
from multibranch.config import ConfigError
from multibranch.convert.payload import check_state, imported_payload
from multibranch.data.tokenizer import Tokenizer, load_processor
from multibranch.experiment import ExperimentConfig
from multibranch.experiment.decoding import DecodeConfig
from multibranch.json_file import read_json_object
from multibranch.models import LayerConfig, ModelConfig
from multibranch.modules.positions import sinusoidal_table

log = logging.getLogger(__name__)

FILLER_BIAS = -1.0e4  # output bias of rows HF cannot produce: never generated, finite for fine-tuning
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
# config.json flags of BART-style variants that MarianMTModel silently ignores: refuse them
UNSUPPORTED_FLAGS = {
    "normalize_before": (True, "pre-norm layers"),
    "normalize_embedding": (True, "a layer norm on the embeddings"),
    "layernorm_embedding": (True, "a layer norm on the embeddings"),
    "add_final_layer_norm": (True, "a final layer norm"),
    "static_position_embeddings": (False, "learned position embeddings"),
    "add_bias_logits": (True, "a logits bias layer"),
}


@dataclass
class VocabMap:
    """Our model ids -> HF ids per side, plus the special ids in our id space."""

    src: Tensor  # [V] long: HF encoder row of our id
    tgt: Tensor  # [V] long: HF decoder/output row of our id
    tgt_fillers: Tensor  # [V] bool: target ids HF cannot produce
    pad_id: int
    eos_id: int
    bos_id: int
    tokenizer: dict[str, Tensor] | None
    note: str


def import_marian(directory: str | Path, *, use_tokenizer: bool = True) -> dict[str, Any]:
    """Payload of a standard multibranch model equal to the local MarianMTModel in `directory`."""
    directory = Path(directory)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{directory} is not a local Hugging Face model directory (no config.json); "
                              "the hub is never contacted: download the model first")
    raw = read_json_object(config_file, CheckpointError)
    _check_raw_config(raw, config_file)
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        raise ConfigError("importing Hugging Face models needs transformers: pip install 'multibranch[hf]'") from None

    c = MarianConfig.from_pretrained(str(directory), local_files_only=True)
    if c.encoder_ffn_dim != c.decoder_ffn_dim:
        raise ConfigError(f"{config_file}: encoder_ffn_dim={c.encoder_ffn_dim} != decoder_ffn_dim={c.decoder_ffn_dim}; "
                          "multibranch has one model-wide ffn_dim")
    if c.activation_function not in ACTIVATIONS:
        raise ConfigError(f"{config_file}: activation_function={c.activation_function!r} is not supported "
                          f"(supported: {', '.join(sorted(ACTIVATIONS))})")
    try:
        hf = MarianMTModel.from_pretrained(str(directory), config=c, local_files_only=True).float().eval()
    except (OSError, RuntimeError, ValueError) as err:
        raise CheckpointError(f"{directory}: transformers could not load the MarianMTModel ({err})") from None
    _check_positions(hf, c.d_model, c.max_position_embeddings, config_file)

    enc_table = hf.model.encoder.embed_tokens.weight.detach()
    dec_table = hf.model.decoder.embed_tokens.weight.detach()
    head = hf.lm_head.weight.detach()
    enc_dec_tied = enc_table.data_ptr() == dec_table.data_ptr()
    head_tied = head.data_ptr() == dec_table.data_ptr()
    logits_bias = hf.final_logits_bias.detach().reshape(-1)  # [V_tgt]

    vocab = None
    if use_tokenizer:
        vocab = _spm_vocab_map(directory, c, enc_table.shape[0], dec_table.shape[0])
    if vocab is None:
        if use_tokenizer:
            log.warning("%s has no source.spm/target.spm/vocab.json: weights-only import with HF ids and no tokenizer "
                        "(the checkpoint cannot translate raw text)", directory)
        vocab = _identity_map(c, enc_table.shape[0], dec_table.shape[0])

    # Embeddings and output layer in our id order
    src_rows, tgt_rows = vocab.src, vocab.tgt
    output_bias = logits_bias[tgt_rows].clone()
    output_bias[vocab.tgt_fillers] = FILLER_BIAS
    use_bias = bool(output_bias.any())
    same_order = torch.equal(src_rows, tgt_rows)
    if enc_dec_tied and head_tied and same_order:
        share = "all"
    elif head_tied:
        share = "decoder"
    else:
        share = "none"
    if enc_dec_tied and share != "all":
        log.warning("encoder and decoder embeddings are one table in HF but become separate copies here (%s)",
                    "source and target SentencePiece orders differ" if head_tied else "lm_head is not tied")

    state: dict[str, Tensor] = {}
    src_embed = enc_table[src_rows].clone()
    state["encoder.embed.tokens.weight"] = src_embed
    state["decoder.embed.tokens.weight"] = src_embed if share == "all" else dec_table[tgt_rows].clone()
    if share == "none":
        state["output_weight"] = head[tgt_rows].clone()
    if use_bias:
        state["output_bias"] = output_bias
    for i, layer in enumerate(hf.model.encoder.layers):
        p = f"encoder.layers.{i}."
        state.update(_attention(p + "self_attn.", layer.self_attn))
        state.update(_norm(p + "self_attn_residual.norm.", layer.self_attn_layer_norm))
        state.update(_ffn(p, layer))
    for i, layer in enumerate(hf.model.decoder.layers):
        p = f"decoder.layers.{i}."
        state.update(_attention(p + "self_attn.", layer.self_attn))
        state.update(_norm(p + "self_attn_residual.norm.", layer.self_attn_layer_norm))
        state.update(_attention(p + "cross_attn.", layer.encoder_attn))
        state.update(_norm(p + "cross_attn_residual.norm.", layer.encoder_attn_layer_norm))
        state.update(_ffn(p, layer))

    model = _model_config(c, share, use_bias, vocab, src_rows.shape[0], tgt_rows.shape[0])

    config = ExperimentConfig(model=model, decode=_decode_config(directory),
                              description=f"imported from Hugging Face MarianMTModel {directory}")
    check_state(config, state, str(directory))
    summary = (f"HF Marian {model.encoder_layers}+{model.decoder_layers} layers, d={model.d_model}, "
               f"share_embeddings={share}, {vocab.note}")
    return imported_payload(config, state, vocab.tokenizer, "hf_marian", directory, summary,
                            hf_id_of={"src": vocab.src, "tgt": vocab.tgt})  # our id -> HF id


# ---- configuration ------------------------------------------------------------------------------


def _check_raw_config(raw: dict[str, Any], where: Path) -> None:
    if raw.get("model_type") != "marian":
        raise ConfigError(f"{where}: model_type={raw.get('model_type')!r}; only 'marian' (MarianMTModel) is supported")
    for flag, (bad, what) in UNSUPPORTED_FLAGS.items():
        if flag in raw and bool(raw[flag]) == bad:
            raise ConfigError(f"{where}: {flag}={raw[flag]} asks for {what}, which neither MarianMTModel nor "
                              "multibranch's post-norm import implements")


def _check_positions(hf: Any, d_model: int, max_positions: int, where: Path) -> None:
    """HF's sinusoidal table must equal ours (same layout and frequencies), else the import is wrong."""

    ours = sinusoidal_table(max_positions, d_model)
    for side in ("encoder", "decoder"):
        theirs = getattr(hf.model, side).embed_positions.weight.detach().float()
        if theirs.shape != ours.shape or not torch.allclose(theirs, ours, atol=1e-5, rtol=0):
            raise ConfigError(f"{where}: the {side}'s sinusoidal position table differs from multibranch's "
                              f"(d_model={d_model}); cannot import exactly")


def _decode_config(directory: Path) -> Any:
    """Beam size and length penalty from generation_config.json (HF's penalty is score / len^alpha,
    our "fairseq" kind); everything else keeps multibranch's defaults."""

    cfg = DecodeConfig()
    path = directory / "generation_config.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            data = {}
        if isinstance(data.get("num_beams"), int) and data["num_beams"] >= 1:
            cfg.beam = data["num_beams"]
        if isinstance(data.get("length_penalty"), (int, float)):
            cfg.length_penalty = float(data["length_penalty"])
    return cfg


def _model_config(c: Any, share: str, output_bias: bool, vocab: VocabMap, src_size: int, tgt_size: int) -> Any:
    layer = LayerConfig.variant("transformer")
    decoder_heads = None if c.decoder_attention_heads == c.encoder_attention_heads else c.decoder_attention_heads
    return ModelConfig(
        d_model=c.d_model,
        heads=c.encoder_attention_heads,
        ffn_dim=c.encoder_ffn_dim,
        encoder_layers=c.encoder_layers,
        decoder_layers=c.decoder_layers,
        norm="post",
        activation=ACTIVATIONS[c.activation_function],
        dropout=float(c.dropout),
        attention_dropout=float(c.attention_dropout),
        activation_dropout=float(c.activation_dropout),
        positions="sinusoidal",
        max_positions=c.max_position_embeddings,
        share_embeddings=share,
        scale_embedding=bool(c.scale_embedding),
        output_bias=output_bias,
        encoder=layer(),
        decoder=layer(heads=decoder_heads),
        src_vocab_size=src_size,
        tgt_vocab_size=tgt_size,
        pad_id=vocab.pad_id,
        bos_id=vocab.bos_id,
        eos_id=vocab.eos_id,
    )


# ---- vocabulary ---------------------------------------------------------------------------------


def _first(value: Any) -> int:
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _identity_map(c: Any, enc_rows: int, dec_rows: int) -> VocabMap:
    return VocabMap(
        src=torch.arange(enc_rows), tgt=torch.arange(dec_rows), tgt_fillers=torch.zeros(dec_rows, dtype=torch.bool),
        pad_id=int(c.pad_token_id), eos_id=_first(c.eos_token_id), bos_id=int(c.decoder_start_token_id),
        tokenizer=None, note="HF vocabulary ids kept (no tokenizer stored)",
    )


def _spm_vocab_map(directory: Path, c: Any, enc_rows: int, dec_rows: int) -> VocabMap | None:
    """Permutation into SentencePiece-id order (see the module docstring), or None without the files."""
    files = [directory / "source.spm", directory / "target.spm", directory / "vocab.json"]
    if not all(f.is_file() for f in files):
        return None

    src_bytes, tgt_bytes = files[0].read_bytes(), files[1].read_bytes()
    sp_src, sp_tgt = load_processor(src_bytes), load_processor(tgt_bytes)
    vocab_src: dict[str, int] = read_json_object(files[2], CheckpointError)
    target_vocab = directory / "target_vocab.json"
    separate = _separate_vocabs(directory) and target_vocab.is_file()
    vocab_tgt: dict[str, int] = (read_json_object(target_vocab, CheckpointError) if separate
                                 else vocab_src)
    for name, vocab, rows in (("source", vocab_src, enc_rows), ("target", vocab_tgt, dec_rows)):
        if "<unk>" not in vocab:
            raise ConfigError(f"{directory}: the {name} vocabulary has no <unk> entry")
        if max(vocab.values()) >= rows:
            raise ConfigError(f"{directory}: {name} vocabulary ids exceed the embedding table ({rows} rows)")

    pieces_src = [sp_src.id_to_piece(i) for i in range(sp_src.get_piece_size())]
    pieces_tgt = [sp_tgt.id_to_piece(i) for i in range(sp_tgt.get_piece_size())]
    spm_pieces = set(pieces_src) | set(pieces_tgt)
    extras: list[str] = []
    for vocab in (vocab_tgt, vocab_src):
        for piece, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
            if piece not in spm_pieces and piece not in extras:
                extras.append(piece)
    base = max(len(pieces_src), len(pieces_tgt))
    size = base + len(extras)

    def side_map(pieces: list[str], vocab: dict[str, int]) -> tuple[Tensor, Tensor]:
        unk = vocab["<unk>"]
        ids = torch.full((size,), unk, dtype=torch.long)
        filler = torch.ones(size, dtype=torch.bool)
        for i, piece in enumerate(pieces + [""] * (base - len(pieces)) + extras):
            if piece in vocab:
                ids[i] = vocab[piece]
                filler[i] = False
        return ids, filler

    src_map, _ = side_map(pieces_src, vocab_src)
    tgt_map, tgt_fillers = side_map(pieces_tgt, vocab_tgt)
    tgt_fillers[base:] = True  # ids beyond SentencePiece (<pad>, >>lang<<): never generated, never detokenised
    unmapped = sum(1 for p in pieces_tgt if p not in vocab_tgt) + sum(1 for p in pieces_src if p not in vocab_src)
    if unmapped:
        log.warning("%d SentencePiece pieces are missing from vocab.json; they read as <unk> and are never generated",
                    unmapped)

    hf_tgt_piece = {i: p for p, i in vocab_tgt.items()}
    src_set, tgt_set = set(pieces_src), set(pieces_tgt)

    def our_id(hf_id: int, what: str) -> int:
        """The one id of a special token that means the same on both sides."""
        piece = hf_tgt_piece.get(hf_id)
        if piece is None:
            raise ConfigError(f"{directory}: {what} id {hf_id} is not in the target vocabulary")
        if piece in extras:
            return base + extras.index(piece)
        if piece not in tgt_set:
            raise ConfigError(f"{directory}: {what} {piece!r} is not a piece of target.spm")
        i_src = sp_src.piece_to_id(piece) if piece in src_set else None
        i_tgt = sp_tgt.piece_to_id(piece)
        if i_src is not None and i_src != i_tgt:
            raise ConfigError(f"{directory}: source.spm and target.spm give {what} {piece!r} different ids "
                              f"({i_src} vs {i_tgt}); one model id cannot mean both")
        return i_tgt

    pad_id = our_id(int(c.pad_token_id), "pad")
    eos_id = our_id(_first(c.eos_token_id), "eos")
    bos_id = our_id(int(c.decoder_start_token_id), "decoder start")
    tokenizer = Tokenizer(src_bytes, tgt_bytes)
    note = (f"ids permuted into SentencePiece order ({len(pieces_src)}/{len(pieces_tgt)} pieces + "
            f"{len(extras)} extra ids {extras[:4]}{'...' if len(extras) > 4 else ''}; pad={pad_id}, eos={eos_id}, "
            f"bos={bos_id}); tokenizer stored")
    return VocabMap(src_map, tgt_map, tgt_fillers, pad_id, eos_id, bos_id, tokenizer.to_state(), note)


def _separate_vocabs(directory: Path) -> bool:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return False
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")).get("separate_vocabs", False))
    except json.JSONDecodeError:
        return False


# ---- tensors ------------------------------------------------------------------------------------


def _attention(prefix: str, attn: Any) -> dict[str, Tensor]:
    """HF q/k/v/out projections -> our fused in_proj (rows Q | K | V) and out_proj + out_bias [1, d]."""
    weight = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], 0)  # [3d, d]
    bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias], 0)  # [3d]
    return {
        prefix + "in_proj.weight": weight.detach().clone(),
        prefix + "in_proj.bias": bias.detach().clone(),
        prefix + "out_proj.weight": attn.out_proj.weight.detach().clone(),
        prefix + "out_bias": attn.out_proj.bias.detach().reshape(1, -1).clone(),
    }


def _norm(prefix: str, norm: Any) -> dict[str, Tensor]:
    return {prefix + "weight": norm.weight.detach().clone(), prefix + "bias": norm.bias.detach().clone()}


def _ffn(prefix: str, layer: Any) -> dict[str, Tensor]:
    return {
        prefix + "ffn.fc1.weight": layer.fc1.weight.detach().clone(),
        prefix + "ffn.fc1.bias": layer.fc1.bias.detach().clone(),
        prefix + "ffn.fc2.weight": layer.fc2.weight.detach().clone(),
        prefix + "ffn.fc2_bias": layer.fc2.bias.detach().reshape(1, -1).clone(),
        **_norm(prefix + "ffn_residual.norm.", layer.final_layer_norm),
    }
