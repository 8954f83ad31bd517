"""Write a standard multibranch translation model as a Hugging Face `MarianMTModel` folder (`convert to-hf`).

The inverse of `convert from-hf` (convert/hf_marian.py, whose mapping table this one reverses).
Needs the optional extra `multibranch[hf]` (transformers, imported only when used). The folder holds
what `MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` read: config.json,
model.safetensors, generation_config.json, and the tokenizer files source.spm / target.spm (our
SentencePiece models), vocab.json (piece -> id; our ids ARE SentencePiece ids, so it is the identity
on the pieces; ids beyond SentencePiece get placeholder names no tokenizer produces), with
target_vocab.json and separate_vocabs=true when source and target SentencePiece models differ.

What Marian can represent: post-norm layers of one attention and one FFN, sinusoidal positions from
0 (HF's table equals ours: sin | cos halves), no final or embedding layer norm, LayerNorm eps 1e-5,
attention width = d_model (head_dim = d_model / heads), relu / gelu / swish. A MAT with FFN branches
only (N_a = 1) is folded (one FFN of width N_f * d_h, fc2 scaled by the merge constant, as CTranslate2
export does); attention branches cannot be: a folded MAT attends with N_a * d_model inner width, and
Marian's q/k/v projections are d_model -> d_model. MUSE, MUTE and Weighted layers have no Marian
counterpart. Each refusal is one ConfigError line naming why.

Pre-tokenised BPE data (`prepare --pretokenized`): our decoding joins the `@@ ` continuations
(data/tokenizer.py `undo_bpe`). MarianTokenizer decodes with the SentencePiece models, so source.spm and
target.spm get a SentencePiece denormalizer that deletes `@@ ` from decoded text (decoding only; the
ids and the encoding are unchanged): `decode`/`batch_decode` then give our translations. One
difference remains: a text whose last token is a continuation (`... Sch@@`, a hypothesis cut at the
length limit) keeps that final `@@` in Hugging Face's output.

Special tokens: pad_token_id = our pad, eos_token_id = our EOS, decoder_start_token_id = our bos
(`<s>`, where our decoder starts); generation_config.json holds the beam size and length penalty and
bans pad and `<s>` (`bad_words_ids`), which our search never generates. HF applies that ban after
its log-softmax, ours before it, so HF's `generate` scores can differ slightly from ours; logits are
equal (the test compares them).

multibranch_hf.json marks the folder as this converter's, so that `--force` replaces it and never a model folder
another program wrote (a downloaded Marian model).
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from sentencepiece import sentencepiece_model_pb2 as model_pb2
from torch import Tensor

from multibranch import __version__
from multibranch.atomic import atomic_directory
from multibranch.checkpoint.format import HF_MARKER_FILE, CheckpointError
from multibranch.checkpoint.tokenizer_state import missing_tokenizer
from multibranch.config import ConfigError
from multibranch.convert.fold import fold_output
from multibranch.convert.payload import experiment_config, token_strings
from multibranch.data.directories import HF, check_output_directory
from multibranch.data.tokenizer import BPE_CONTINUATION, Tokenizer, is_pretokenized
from multibranch.models import ModelConfig
from multibranch.modules.merge import merge_constant

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu"}
NOT_MARIAN = {
    "muse": "MUSE layers have a dynamic convolution branch and parallel attention/FFN branches, which Marian's "
            "attention-then-FFN layer has no place for",
    "mute": "MUTE encoder layers run several units with their own attention and FFN fused with learned weights, "
            "which Marian's single-path layer cannot express",
    "weighted": "Weighted Transformer layers apply a separate FFN to every attention branch and mix them with "
                "learned kappa/alpha weights, which Marian's one-attention-then-one-FFN layer cannot express",
}
TASK_NAMES = {"classification": "classification", "code": "code-generation"}


def export_marian(payload: dict[str, Any], out_dir: str | Path, *, force: bool = False,
                  source: str | None = None) -> Path:
    """Write `payload` as a Hugging Face MarianMTModel folder; returns the folder. Everything is
    validated before the disk is touched; the folder is built beside `out_dir` and swapped in whole."""
    where = source or "checkpoint"
    out = Path(out_dir)
    check_output_directory(out, HF, force=force, inputs=[source] if source is not None else [])
    cfg = experiment_config(payload)
    if cfg.task != "translation":
        raise ConfigError(f"{where} is a {TASK_NAMES.get(cfg.task, cfg.task)} model; `convert to-hf` writes "
                          "translation models (MarianMTModel)")
    check_marian(cfg.model, where)
    if not payload.get("tokenizer"):
        raise missing_tokenizer(where, "a Marian folder needs: the SentencePiece model(s) stored in the checkpoint")
    tokenizer = Tokenizer.from_state(payload["tokenizer"])
    vocab_src, vocab_tgt = _vocabularies(cfg.model, tokenizer, where)
    model = marian_model(cfg.model, payload["model"], beam=cfg.decode.beam, where=where)
    generation = _import_transformers().GenerationConfig(
        decoder_start_token_id=cfg.model.bos_id, eos_token_id=cfg.model.eos_id, pad_token_id=cfg.model.pad_id,
        forced_eos_token_id=cfg.model.eos_id, num_beams=cfg.decode.beam, length_penalty=cfg.decode.length_penalty,
        max_length=cfg.model.max_positions, bad_words_ids=[[cfg.model.pad_id], [cfg.model.bos_id]],
    )
    with atomic_directory(out) as tmp:
        model.save_pretrained(str(tmp))
        generation.save_pretrained(str(tmp))
        _write_tokenizer(tmp, tokenizer, vocab_src, vocab_tgt, cfg.model)
        _write_json(tmp / HF_MARKER_FILE, {"written_by": "multibranch convert to-hf", "version": __version__})
    return out


# ---- validation ---------------------------------------------------------------------------------


def check_marian(model: ModelConfig, where: str) -> None:
    """ConfigError with a one-line reason unless MarianMTModel computes this model exactly."""
    def refuse(why: str) -> None:
        raise ConfigError(f"{where}: cannot write a Hugging Face Marian model: {why}")

    for side in ("encoder", "decoder"):
        layer = getattr(model, side)
        if layer.kind in NOT_MARIAN:
            refuse(NOT_MARIAN[layer.kind])
        if layer.kind != "transformer":
            refuse(f"the {side} layer kind {layer.kind!r} is not supported")
        if layer.attention_branches > 1:
            refuse(f"the {side} has {layer.attention_branches} attention branches (MAT); folded they attend with "
                   f"{layer.attention_branches} x d_model inner width, and Marian's q/k/v projections are d_model -> "
                   "d_model (decode it with `convert ct2`, which folds it)")
        if layer.layer_heads is not None:
            refuse("it has pruned heads (per-layer head counts)")
        heads = layer.heads or model.heads
        if (layer.head_dim or model.d_model // heads) * heads != model.d_model:
            refuse(f"the {side}'s {heads} heads of width {layer.head_dim} do not add up to d_model={model.d_model}")
    if model.norm != "post":
        refuse("it uses pre-norm layers (and a final layer norm); Marian layers are post-norm")
    if model.positions != "sinusoidal" or model.relative_positions > 0:
        refuse(f"positions={model.positions!r}, relative_positions={model.relative_positions}; Marian has only "
               "sinusoidal absolute positions")
    if model.embedding_norm or model.norm_eps != 1e-5:
        refuse(f"embedding_norm={model.embedding_norm}, norm_eps={model.norm_eps}; Marian has no embedding "
               "layer norm and LayerNorm eps 1e-05")
    if model.activation not in ACTIVATIONS:
        refuse(f"activation {model.activation!r} has no Marian name")


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError("writing a Hugging Face model needs transformers: pip install 'multibranch[hf]'") from None
    return transformers


# ---- config and weights -------------------------------------------------------------------------


def _ffn_dim(model: ModelConfig, side: str) -> int:
    return model.ffn_dim * getattr(model, side).ffn_branches  # N_f branches folded into one FFN


def marian_model(model: ModelConfig, state: Mapping[str, Tensor], *, beam: int, where: str = "model") -> Any:
    """A MarianMTModel (eval mode) with the weights `state` of our standard translation model `model`: it
    computes the same logits (ConfigError, as `convert to-hf`, for what Marian cannot represent). `beam` goes
    into its config's num_beams."""
    check_marian(model, where)
    transformers = _import_transformers()
    hf = transformers.MarianMTModel(marian_config(transformers, model, beam)).eval()
    _fill(hf, model, state)
    return hf


def marian_config(transformers: Any, model: ModelConfig, beam: int) -> Any:
    """The MarianConfig of a (checked) standard model (`transformers`: the imported module)."""
    heads = {side: getattr(model, side).heads or model.heads for side in ("encoder", "decoder")}
    return transformers.MarianConfig(
        vocab_size=model.src_vocab_size, decoder_vocab_size=model.tgt_vocab_size, d_model=model.d_model,
        encoder_layers=model.encoder_layers, decoder_layers=model.decoder_layers,
        encoder_attention_heads=heads["encoder"], decoder_attention_heads=heads["decoder"],
        encoder_ffn_dim=_ffn_dim(model, "encoder"), decoder_ffn_dim=_ffn_dim(model, "decoder"),
        max_position_embeddings=model.max_positions, activation_function=ACTIVATIONS[model.activation],
        dropout=model.dropout, attention_dropout=model.attention_dropout, activation_dropout=model.activation_dropout,
        scale_embedding=bool(model.scale_embedding), pad_token_id=model.pad_id, eos_token_id=model.eos_id,
        decoder_start_token_id=model.bos_id, forced_eos_token_id=model.eos_id,
        share_encoder_decoder_embeddings=model.share_embeddings == "all",
        tie_word_embeddings=model.share_embeddings != "none", num_beams=beam,
    )


def _fill(hf: Any, model: ModelConfig, state: Mapping[str, Tensor]) -> None:
    """Copy our weights into a fresh MarianMTModel (the inverse of hf_marian's import mapping)."""
    with torch.no_grad():
        hf.model.encoder.embed_tokens.weight.copy_(state["encoder.embed.tokens.weight"])
        hf.model.decoder.embed_tokens.weight.copy_(state["decoder.embed.tokens.weight"])
        if model.share_embeddings == "none":
            hf.lm_head.weight.copy_(state["output_weight"])
        bias = state["output_bias"] if model.output_bias else torch.zeros(model.tgt_vocab_size)
        hf.final_logits_bias.copy_(bias.reshape(1, -1))
        for side in ("encoder", "decoder"):
            c_ffn = merge_constant(getattr(model, side).ffn_branches, getattr(model, side).branch_merge)
            for i, layer in enumerate(getattr(hf.model, side).layers):
                p = f"{side}.layers.{i}."
                _attention(layer.self_attn, state, p + "self_attn.")
                _norm(layer.self_attn_layer_norm, state, p + "self_attn_residual.norm.")
                if side == "decoder":
                    _attention(layer.encoder_attn, state, p + "cross_attn.")
                    _norm(layer.encoder_attn_layer_norm, state, p + "cross_attn_residual.norm.")
                layer.fc1.weight.copy_(state[p + "ffn.fc1.weight"])  # [N_f*d_h, d]
                layer.fc1.bias.copy_(state[p + "ffn.fc1.bias"])
                layer.fc2.weight.copy_(fold_output("fc2.weight", state[p + "ffn.fc2.weight"], c_ffn))  # [d, N_f*d_h]
                layer.fc2.bias.copy_(fold_output("fc2_bias", state[p + "ffn.fc2_bias"], c_ffn)[0])  # [d]
                _norm(layer.final_layer_norm, state, p + "ffn_residual.norm.")


def _attention(attn: Any, state: Mapping[str, Tensor], p: str) -> None:
    """Our fused in_proj (rows Q | K | V) -> q/k/v_proj; out_proj + out_bias [1, d] -> out_proj."""
    weight, bias = state[p + "in_proj.weight"], state[p + "in_proj.bias"]  # [3d, d], [3d]
    for i, proj in enumerate((attn.q_proj, attn.k_proj, attn.v_proj)):
        rows = slice(i * proj.weight.shape[0], (i + 1) * proj.weight.shape[0])
        proj.weight.copy_(weight[rows])
        proj.bias.copy_(bias[rows])
    attn.out_proj.weight.copy_(state[p + "out_proj.weight"])
    attn.out_proj.bias.copy_(state[p + "out_bias"][0])


def _norm(norm: Any, state: Mapping[str, Tensor], p: str) -> None:
    norm.weight.copy_(state[p + "weight"])
    norm.bias.copy_(state[p + "bias"])


# ---- tokenizer ----------------------------------------------------------------------------------


def _vocabularies(model: ModelConfig, tok: Tokenizer, where: str) -> tuple[list[str], list[str]]:
    """Token strings of our source and target ids (`payload.token_strings`), checked for MarianTokenizer."""
    src, tgt = token_strings(model, tok, where)
    for what, i in (("pad", model.pad_id), ("eos", model.eos_id)):
        if src[i] != tgt[i]:
            raise CheckpointError(f"{where}: the source and target pieces of {what} id {i} differ "
                                  f"({src[i]!r} vs {tgt[i]!r}); MarianTokenizer has one {what} token")
    return src, tgt


def _write_tokenizer(directory: Path, tok: Tokenizer, src: list[str], tgt: list[str], model: ModelConfig) -> None:
    separate = not tok.joint
    (directory / "source.spm").write_bytes(marian_spm(tok.src_proto))
    (directory / "target.spm").write_bytes(marian_spm(tok.tgt_proto))
    _write_json(directory / "vocab.json", {piece: i for i, piece in enumerate(src)})
    if separate:
        _write_json(directory / "target_vocab.json", {piece: i for i, piece in enumerate(tgt)})
    _write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "MarianTokenizer", "separate_vocabs": separate, "model_max_length": model.max_positions,
        "unk_token": tgt[tok.tgt.unk_id()], "eos_token": tgt[model.eos_id], "pad_token": tgt[model.pad_id],
        **({"target_vocab_file": "target_vocab.json"} if separate else {}),
    })


def marian_spm(proto: bytes) -> bytes:
    """The SentencePiece model MarianTokenizer gets: `proto` itself, or, for a vocabulary of pre-tokenised
    BPE text, `proto` with a denormalizer that deletes the `@@ ` continuations when decoding."""
    if not is_pretokenized(proto):
        return proto
    model = model_pb2.ModelProto()
    model.ParseFromString(proto)
    model.denormalizer_spec.CopyFrom(_bpe_joining_denormalizer())
    return model.SerializeToString()


def _bpe_joining_denormalizer() -> Any:
    """A SentencePiece NormalizerSpec that rewrites `@@ ` to nothing. Its compiled rule table is made by
    SentencePiece's own trainer (the only public builder), on a throwaway model of one sentence."""
    rule = " ".join(f"{ord(c):x}" for c in BPE_CONTINUATION) + "\t\n"  # source code points -> nothing
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "denormalize.tsv"
        rules.write_text(rule, encoding="utf-8")
        writer = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b"]), model_writer=writer, model_type="word",
                                       vocab_size=8, hard_vocab_limit=False, normalization_rule_name="identity",
                                       denormalization_rule_tsv=str(rules), minloglevel=3)
    model = model_pb2.ModelProto()
    model.ParseFromString(writer.getvalue())
    return model.denormalizer_spec


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
