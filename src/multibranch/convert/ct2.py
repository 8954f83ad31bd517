"""Export a standard or MAT checkpoint as a CTranslate2 model directory (`multibranch convert ct2`).

Needs the optional extra `multibranch[ct2]` (ctranslate2, imported only when used). The directory is
usable on its own: CTranslate2's model.bin + config.json + vocabulary file(s), our SentencePiece
model(s) (same names as `convert export`) and `multibranch_ct2.json` (the checkpoint's decode settings
and the rows of its position table). `multibranch translate --ckpt DIR` and `serve --engine ct2` decode
it with `tasks/translation/ct2.py`, whose `translate_options` reproduce our beam search.

Architecture mapping (ctranslate2.specs.TransformerSpec, revision 7):
    layer kind "transformer", N_a = 1        -> TransformerEncoderSpec / TransformerDecoderSpec
    MAT (N_a > 1, N_f > 1)                   -> folded first (convert/fold.py): one attention of
                                                N_a*M heads of width d/M per sublayer
    in_proj [3*H*d_k, d] (rows Q | K | V)    -> self-attention linear[0] (fused QKV, CT2's layout);
                                                cross-attention linear[0] = Q rows, linear[1] = K|V rows
    out_proj [d, H*d_k], out_bias [1, d]     -> linear[-1] weight / bias
    ffn.fc1, c * ffn.fc2, c * sum fc2_bias   -> ffn.linear_0, ffn.linear_1 (any N_f folds this way)
    <sublayer>_residual.norm                 -> the sublayer's layer_norm (CT2 applies it before the
                                                sublayer when pre_norm, after the residual when post)
    final_norm (pre-norm only)               -> encoder/decoder layer_norm
Head width and softmax scale: CT2 derives the head width from d_model / heads unless the attention
spec carries `head_dim`, and the scale from the head width unless it carries `queries_scale`; both
are written explicitly for every attention (folded MATs have H*d_k = N_a*d != d).
Positions: our sinusoidal table (sin | cos halves, HF Marian frequencies) or learned table is
written as `position_encodings` (CT2 then uses it instead of its own sinusoids), first row =
position 0, which is where our decoder puts `<s>`. Shaw relative positions map to CT2's
`relative_position_keys` / `_values` (same clipping, same scale); CT2 has no absolute positions
next to them, so such models need `positions: none`.
Embeddings: `scale_embeddings` = model.scale_embedding (x * sqrt(d_model), as ours); the output
projection is the tied or separate table plus the output bias.
Special tokens: the decoder starts from the target piece of bos_id (`<s>`, id 2 in our models),
unlike Marian-style conversions; the source gets EOS appended (add_source_eos) as our Translator does.
Our search never generates pad or bos (it masks them before the log-softmax); CT2 has no such rule,
so their output bias is set to NEVER_BIAS, which gives them probability 0 in float32 and float16
and leaves every other log-probability unchanged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from multibranch.atomic import atomic_directory
from multibranch.checkpoint.export import JOINT_SPM, SOURCE_SPM, TARGET_SPM, recorded_sha256
from multibranch.checkpoint.format import CT2_SETTINGS_FILE, CheckpointError
from multibranch.checkpoint.tokenizer_state import missing_tokenizer
from multibranch.config import ConfigError
from multibranch.convert.fold import fold_mat, fold_output
from multibranch.convert.payload import experiment_config, token_strings
from multibranch.data.directories import CT2, check_output_directory
from multibranch.data.tokenizer import Tokenizer
from multibranch.modules.merge import merge_constant
from multibranch.modules.positions import sinusoidal_table
from multibranch.tasks.translation.ct2 import max_decoding_length, translate_options

if TYPE_CHECKING:
    from multibranch.data.tokenizer import Tokenizer
    from multibranch.models import ModelConfig

log = logging.getLogger(__name__)
__all__ = ["export_ct2", "check_exportable", "build_spec", "vocabularies", "translate_options", "max_decoding_length",
           "QUANTIZATIONS", "SETTINGS_FILE"]  # the decoding options live in tasks/translation/ct2.py

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16")
NEVER_BIAS = -1.0e4  # output bias of pad and bos: exp() underflows to 0, and it fits float16
SETTINGS_FILE = CT2_SETTINGS_FILE
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which every multibranch LayerNorm uses
REFUSED = {
    "muse": "MUSE layers have a dynamic convolution branch (and parallel attention/FFN branches summed into "
            "one residual) that CTranslate2 has no operator for",
    "mute": "MUTE encoder layers run several units with their own attention and FFN and fuse them with learned "
            "weights, which CTranslate2's single-path Transformer layer cannot express",
    "weighted": "Weighted Transformer layers apply a separate FFN to every attention branch and mix the branches "
                "with learned kappa/alpha weights, which CTranslate2's one-attention-then-one-FFN layer cannot "
                "express",
}


# why a model of another task is not exported: the real cause for each
TASK_NAMES = {"classification": "classification", "code": "code-generation"}
NOT_EXPORTED = {
    "classification": "CTranslate2 runs encoder-decoders, not an encoder with a pooling head; use "
                      "`multibranch convert export` for a safetensors release",
    "code": "the CTranslate2 engine of `serve` has no code-generation mode: it would answer with the corpus's "
            "escaped one-line functions; decode it with `multibranch translate` (--code-format source for Python)",
}


def export_ct2(
    payload: dict[str, Any],
    out_dir: str | Path,
    *,
    quantization: str = "float32",
    force: bool = False,
    source: str | None = None,
) -> Path:
    """Write `payload` as a CTranslate2 model directory; returns the directory.

    Everything is validated before the disk is touched; the directory is built beside `out_dir` and
    swapped in whole, so a failure leaves any previous `out_dir` as it was."""
    where = source or "checkpoint"
    out = Path(out_dir)
    check_output_directory(out, CT2, force=force, inputs=[source] if source is not None else [])
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"--quantization {quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    cfg = experiment_config(payload)
    if cfg.task != "translation":
        raise CheckpointError(f"{where} is a {TASK_NAMES.get(cfg.task, cfg.task)} model; CTranslate2 export is for "
                              f"translation models ({NOT_EXPORTED.get(cfg.task, 'CTranslate2 runs translation')})")
    ct2 = _import_ctranslate2()
    check_exportable(cfg.model, where)
    tokenizer = _tokenizer(payload, where)
    folded = _needs_fold(cfg.model)
    if folded:
        payload = fold_mat(payload, source=source)
        cfg = experiment_config(payload)
    src_vocab, tgt_vocab = vocabularies(cfg.model, tokenizer, where)
    spec = build_spec(ct2, cfg.model, payload["model"], src_vocab, tgt_vocab, unk_token=tokenizer.tgt.id_to_piece(
        tokenizer.tgt.unk_id()))
    try:
        spec.validate()
    except ValueError as err:
        raise CheckpointError(f"{where}: CTranslate2 rejected the converted model ({err})") from None
    spec.optimize(quantization=quantization)

    with atomic_directory(out) as tmp:
        spec.save(str(tmp))
        _write_tokenizer(tmp, tokenizer)
        settings = {
            "source": where,
            "quantization": quantization,
            "model_kind": "MAT, folded into N_a*M heads" if folded else "standard transformer",
            "decode": asdict(cfg.decode),
            "tokenizer": {**_tokenizer_files(tokenizer),
                          "sha256": recorded_sha256(sorted({tmp / name for name in _tokenizer_files(tokenizer).values()}))},
            # ours stop at max_positions whatever the positions (relative ones have no table): so does this
            "max_positions": cfg.model.max_positions,
            "note": "pass translate_options(decode) from multibranch.tasks.translation.ct2 to translate_batch to "
                    "reproduce multibranch's beam search (return_end_token=True: the length penalty counts EOS, as "
                    "ours); `multibranch translate --ckpt` and `serve --engine ct2` read this directory",
        }
        (tmp / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return out


# ---- validation ---------------------------------------------------------------------------------


def check_exportable(model: ModelConfig, where: str) -> None:
    """ConfigError with a one-line reason unless CTranslate2 can run this model exactly."""
    for side in ("encoder", "decoder"):
        kind = getattr(model, side).kind
        if kind in REFUSED:
            raise ConfigError(f"{where}: cannot export to CTranslate2: {REFUSED[kind]}")
        if kind != "transformer":
            raise ConfigError(f"{where}: cannot export to CTranslate2: the {side} layer kind {kind!r} is not supported")
        if getattr(model, side).layer_heads is not None:
            raise ConfigError(f"{where}: cannot export to CTranslate2: it has pruned heads (per-layer head counts, "
                              "which a CTranslate2 model cannot express)")
    if model.embedding_norm or model.norm_eps != 1e-5:
        raise ConfigError(f"{where}: cannot export to CTranslate2: embedding_norm={model.embedding_norm} and "
                          f"norm_eps={model.norm_eps} are not mapped (only the defaults False and 1e-05 are)")
    if model.relative_positions > 0 and model.positions != "none":
        raise ConfigError(f"{where}: cannot export to CTranslate2: it has no absolute positions next to relative "
                          f"ones, but this model uses positions={model.positions!r} with relative_positions="
                          f"{model.relative_positions}")


def _needs_fold(model: ModelConfig) -> bool:
    return any(getattr(model, side).attention_branches > 1 for side in ("encoder", "decoder"))


def _import_ctranslate2() -> Any:
    try:
        import ctranslate2
        import ctranslate2.specs  # noqa: F401
    except ImportError:
        raise ConfigError("exporting to CTranslate2 needs ctranslate2: pip install 'multibranch[ct2]'") from None
    return ctranslate2


def _tokenizer(payload: dict[str, Any], where: str) -> Tokenizer:
    if not payload.get("tokenizer"):
        raise missing_tokenizer(where, "CTranslate2 needs: it maps tokens by the SentencePiece pieces stored in the "
                                       "checkpoint")
    return Tokenizer.from_state(payload["tokenizer"])


def vocabularies(model: ModelConfig, tok: Tokenizer, where: str) -> tuple[list[str], list[str]]:
    """Token strings of our source and target ids (`payload.token_strings`), checked for CTranslate2."""
    src, tgt = token_strings(model, tok, where)
    for what, i in (("pad", model.pad_id), ("bos", model.bos_id), ("eos", model.eos_id)):
        if not 0 <= i < len(tgt):
            raise CheckpointError(f"{where}: {what} id {i} is outside the target vocabulary")
    if model.eos_id >= len(src) or src[model.eos_id] != tgt[model.eos_id]:
        raise CheckpointError(f"{where}: the source and target pieces of eos id {model.eos_id} differ; CTranslate2 "
                              "appends one EOS token string to the source")
    return src, tgt


# ---- the spec -----------------------------------------------------------------------------------


def _np(t: Tensor) -> np.ndarray:
    """A float32 copy: CTranslate2's quantization rescales its arrays in place, which must not
    reach the payload's tensors."""
    return np.array(t.detach().to(torch.float32).cpu().numpy(), dtype=np.float32, order="C", copy=True)


def _activation(ct2: Any, name: str) -> Any:
    act = ct2.specs.Activation
    return {"relu": act.RELU, "gelu": act.GELU, "swish": act.SWISH}[name]  # GELU = erf form, as F.gelu


def build_spec(ct2: Any, model: ModelConfig, state: dict[str, Tensor], src_vocab: list[str],
               tgt_vocab: list[str], unk_token: str = "<unk>") -> Any:
    """A filled ctranslate2.specs.TransformerSpec of a (folded) standard model."""
    specs = ct2.specs
    pre_norm = model.norm == "pre"
    relative = model.relative_positions > 0
    heads = {s: getattr(model, s).heads or model.heads for s in ("encoder", "decoder")}
    head_dim = {s: getattr(model, s).head_dim or model.d_model // heads[s] for s in heads}
    encoder = specs.TransformerEncoderSpec(
        model.encoder_layers, heads["encoder"], pre_norm=pre_norm, activation=_activation(ct2, model.activation),
        relative_position=relative, head_dim=head_dim["encoder"],
    )
    decoder = specs.TransformerDecoderSpec(
        model.decoder_layers, heads["decoder"], pre_norm=pre_norm, activation=_activation(ct2, model.activation),
        relative_position=relative, head_dim=head_dim["decoder"],
    )
    spec = specs.TransformerSpec(encoder, decoder)

    for side, side_spec in (("encoder", encoder), ("decoder", decoder)):
        side_spec.scale_embeddings = bool(model.scale_embedding)
        positions = _position_table(model, state, side)
        if positions is not None:
            side_spec.position_encodings.encodings = _np(positions)
        if pre_norm:
            _norm(side_spec.layer_norm, state, f"{side}.final_norm.")
        c_ffn = merge_constant(getattr(model, side).ffn_branches, getattr(model, side).branch_merge)
        scale = np.float32(head_dim[side] ** -0.5)
        for i, layer in enumerate(side_spec.layer):
            p = f"{side}.layers.{i}."
            _attention(layer.self_attention, state, p + "self_attn.", fused_qkv=True, scale=scale)
            _norm(layer.self_attention.layer_norm, state, p + "self_attn_residual.norm.")
            if side == "decoder":
                _attention(layer.attention, state, p + "cross_attn.", fused_qkv=False, scale=scale)
                _norm(layer.attention.layer_norm, state, p + "cross_attn_residual.norm.")
            _ffn(layer.ffn, state, p, c_ffn)
            _norm(layer.ffn.layer_norm, state, p + "ffn_residual.norm.")

    encoder.embeddings[0].weight = _np(state["encoder.embed.tokens.weight"])
    decoder.embeddings.weight = _np(state["decoder.embed.tokens.weight"])
    out_weight = state["output_weight"] if model.share_embeddings == "none" else state["decoder.embed.tokens.weight"]
    out_bias = state["output_bias"].clone() if model.output_bias else torch.zeros(model.tgt_vocab_size)
    out_bias[[model.pad_id, model.bos_id]] = NEVER_BIAS
    decoder.projection.weight = _np(out_weight)
    decoder.projection.bias = _np(out_bias)

    config = spec.config
    config.bos_token = tgt_vocab[model.bos_id]
    config.decoder_start_token = tgt_vocab[model.bos_id]
    config.eos_token = tgt_vocab[model.eos_id]
    config.unk_token = unk_token
    config.add_source_eos = True
    config.add_source_bos = False
    config.layer_norm_epsilon = LAYER_NORM_EPS
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    return spec


def _position_table(model: ModelConfig, state: dict[str, Tensor], side: str) -> Tensor | None:
    """[P, d] absolute position table of one side (None with relative positions: CT2 then has no
    position encoder)."""
    if model.relative_positions > 0:
        return None
    if model.positions == "learned":
        return state[f"{side}.embed.positions.weight"]
    if model.positions == "none":
        return torch.zeros(model.max_positions, model.d_model)

    return sinusoidal_table(model.max_positions, model.d_model)


def _attention(spec: Any, state: dict[str, Tensor], p: str, *, fused_qkv: bool, scale: np.float32) -> None:
    weight, bias = state[p + "in_proj.weight"], state[p + "in_proj.bias"]  # [3*H*d_k, d], [3*H*d_k]
    inner = weight.shape[0] // 3
    out_bias = state[p + "out_bias"]  # [1, d] (folded)
    if out_bias.shape[0] != 1:
        raise AssertionError(f"{p}out_bias has {out_bias.shape[0]} branches after folding")
    if fused_qkv:
        _linear(spec.linear[0], weight, bias)
    else:
        _linear(spec.linear[0], weight[:inner], bias[:inner])
        _linear(spec.linear[1], weight[inner:], bias[inner:])
    _linear(spec.linear[-1], state[p + "out_proj.weight"], out_bias[0])
    spec.queries_scale = scale
    if hasattr(spec, "relative_position_keys"):
        keys = state[p + "relative.key_table"]
        spec.relative_position_keys = _np(keys)
        spec.relative_position_values = _np(state.get(p + "relative.value_table", keys))


def _ffn(spec: Any, state: dict[str, Tensor], p: str, c: float) -> None:
    _linear(spec.linear_0, state[p + "ffn.fc1.weight"], state[p + "ffn.fc1.bias"])
    weight = fold_output("fc2.weight", state[p + "ffn.fc2.weight"], c)  # [d, N_f*d_h]
    bias = fold_output("fc2_bias", state[p + "ffn.fc2_bias"], c)  # [1, d]
    _linear(spec.linear_1, weight, bias[0])


def _linear(spec: Any, weight: Tensor, bias: Tensor | None) -> None:
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _norm(spec: Any, state: dict[str, Tensor], p: str) -> None:
    spec.gamma = _np(state[p + "weight"])
    spec.beta = _np(state[p + "bias"])


# ---- files --------------------------------------------------------------------------------------


def _tokenizer_files(tok: Tokenizer) -> dict[str, str]:
    return {"src": JOINT_SPM, "tgt": JOINT_SPM} if tok.joint else {"src": SOURCE_SPM, "tgt": TARGET_SPM}


def _write_tokenizer(directory: Path, tok: Tokenizer) -> None:
    files = _tokenizer_files(tok)
    (directory / files["src"]).write_bytes(tok.src_proto)
    if not tok.joint:
        (directory / files["tgt"]).write_bytes(tok.tgt_proto)
