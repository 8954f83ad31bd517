"""Import a local Hugging Face BERT or RoBERTa directory as a multibranch classifier (for fine-tuning).

Needs the optional extra `multibranch[hf]` (transformers, for the config defaults and the tokenizer).
Only LOCAL directories are read; the hub is never contacted. The weights are read straight from
model.safetensors (or its shards) or pytorch_model.bin, so a missing tensor is an error rather
than a silently random one. Key prefixes `bert.` / `roberta.` are optional (BertModel or
BertForSequenceClassification etc.); MLM / pre-training heads are ignored.

Architecture mapping (a post-norm encoder with learned positions and an embedding LayerNorm):
    embeddings.word_embeddings                 -> encoder.embed.tokens
    embeddings.position_embeddings             -> encoder.embed.positions   (RoBERTa: rows from pad+1 on,
                                                  because its position ids start at padding_idx + 1)
    embeddings.token_type_embeddings           -> encoder.embed.segments    (BERT: model.segments = type_vocab_size;
                                                  RoBERTa, whose pairs are all type 0: row 0 folded into
                                                  every position row instead)
    embeddings.LayerNorm                       -> encoder.embed.norm        (model.embedding_norm=True)
    attention.self.query | key | value         -> self_attn.in_proj         (rows Q | K | V)
    attention.output.dense / .LayerNorm        -> self_attn.out_proj + out_bias / self_attn_residual.norm
    intermediate.dense, output.dense / .LayerNorm -> ffn.fc1, ffn.fc2 + fc2_bias / ffn_residual.norm
    BERT pooler.dense | RoBERTa classifier.dense -> dense (tanh), "first" pooling on CLS / <s>
    BERT classifier   | RoBERTa classifier.out_proj -> out
    layer_norm_eps -> model.norm_eps; hidden_act -> activation; scale_embedding=False

In eval mode the logits equal HF's `...ForSequenceClassification` logits, on single texts and on sentence
pairs (`[CLS] a [SEP] b [SEP]`: the segment ids follow the first SEP, see `models.encoder.segment_ids`). The head's dropouts follow HF
too: classifier_dropout (else hidden_dropout_prob) before the output layer, and for RoBERTa also before
the dense layer (classifier.input_dropout).
Ids are the HF model's: the tokenizer of the directory is stored in the checkpoint
(`data.tokenizer.HFTokenizer`), bos/eos = CLS/SEP as HF puts them around a single text.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from multibranch.checkpoint.format import CheckpointError
from multibranch.config import ConfigError
from multibranch.convert.payload import check_state, imported_payload
from multibranch.data.tokenizer import HFTokenizer
from multibranch.errors import DataError
from multibranch.experiment import ExperimentConfig
from multibranch.experiment.training import TrainConfig
from multibranch.json_file import read_json_object
from multibranch.models import LayerConfig, ModelConfig
from multibranch.models.classifier import Classifier, ClassifierConfig
from multibranch.schedules import LRConfig

log = logging.getLogger(__name__)

MODEL_TYPES = ("bert", "roberta")
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "silu": "swish", "swish": "swish"}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def import_bert(directory: str | Path, labels: list[str] | None = None, num_labels: int | None = None,
                seed: int = 1) -> dict[str, Any]:
    """Payload of a multibranch classifier equal to the local BERT/RoBERTa model in `directory`.

    Without `labels`/`num_labels` the HF classification head is kept (its id2label names become
    the labels); with them the head is new (random, seeded) unless the HF head has exactly these
    label names, in which case its rows are reordered to `labels`' order.
    """
    directory = Path(directory)
    raw, config_file = _read_config(directory)
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ConfigError("importing Hugging Face models needs transformers: pip install 'multibranch[hf]'") from None
    try:
        c = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        raise ConfigError(f"{config_file}: transformers cannot read it ({str(err).splitlines()[0]})") from None
    _check_config(c, raw, config_file)

    try:
        tokenizer = HFTokenizer.from_pretrained(directory)
    except DataError as err:
        raise CheckpointError(f"{err}; the import stores the model's own tokenizer, so it needs one") from None
    if tokenizer.pad_id != c.pad_token_id:
        raise ConfigError(f"{config_file}: pad_token_id={c.pad_token_id} but the tokenizer's pad id is "
                          f"{tokenizer.pad_id}; tokenizer and model do not belong together")

    hf = _load_weights(directory, c.model_type)
    take = _Taker(hf, directory)
    d, offset = c.hidden_size, (c.pad_token_id + 1 if c.model_type == "roberta" else 0)
    max_positions = c.max_position_embeddings - offset
    state: dict[str, Tensor] = {
        "encoder.embed.tokens.weight": take("embeddings.word_embeddings.weight", (c.vocab_size, d)),
    }
    positions = take("embeddings.position_embeddings.weight", (c.max_position_embeddings, d))[offset:]
    token_type = take("embeddings.token_type_embeddings.weight", (c.type_vocab_size, d))  # [T, d]
    if _segments(c):  # BERT: segment embeddings, for sentence pairs
        state["encoder.embed.positions.weight"] = positions
        state["encoder.embed.segments.weight"] = token_type
    else:  # RoBERTa (its tokenizer gives type 0 to both texts of a pair): type 0 folded into every position row
        state["encoder.embed.positions.weight"] = positions + token_type[0]  # [P, d]
    state.update(_norm("encoder.embed.norm.", take, "embeddings.LayerNorm", d))
    for i in range(c.num_hidden_layers):
        p, h = f"encoder.layers.{i}.", f"encoder.layer.{i}."
        q, k, v = (take(f"{h}attention.self.{n}.weight", (d, d)) for n in ("query", "key", "value"))
        qb, kb, vb = (take(f"{h}attention.self.{n}.bias", (d,)) for n in ("query", "key", "value"))
        state[p + "self_attn.in_proj.weight"] = torch.cat([q, k, v], 0)  # [3d, d]
        state[p + "self_attn.in_proj.bias"] = torch.cat([qb, kb, vb], 0)  # [3d]
        state[p + "self_attn.out_proj.weight"] = take(f"{h}attention.output.dense.weight", (d, d))
        state[p + "self_attn.out_bias"] = take(f"{h}attention.output.dense.bias", (d,)).reshape(1, d)
        state.update(_norm(p + "self_attn_residual.norm.", take, f"{h}attention.output.LayerNorm", d))
        state[p + "ffn.fc1.weight"] = take(f"{h}intermediate.dense.weight", (c.intermediate_size, d))
        state[p + "ffn.fc1.bias"] = take(f"{h}intermediate.dense.bias", (c.intermediate_size,))
        state[p + "ffn.fc2.weight"] = take(f"{h}output.dense.weight", (d, c.intermediate_size))
        state[p + "ffn.fc2_bias"] = take(f"{h}output.dense.bias", (d,)).reshape(1, d)
        state.update(_norm(p + "ffn_residual.norm.", take, f"{h}output.LayerNorm", d))

    dense, out, hf_labels = _head_keys(c, hf)
    head_labels, rows, head_note = _choose_head(hf_labels, labels, num_labels, directory)

    config = ExperimentConfig(
        model=_model_config(c, max_positions, tokenizer), train=_fine_tuning_defaults(), task="classification",
        classifier=ClassifierConfig(pooling="first", num_labels=len(head_labels) if head_labels else num_labels or 0,
                                    labels=head_labels, dropout=_classifier_dropout(c),
                                    input_dropout=c.model_type == "roberta"),
        description=f"imported from Hugging Face {c.model_type} {directory}",
    )
    fresh = _fresh_head(config, seed) if dense is None or rows is None else {}
    if dense is not None:
        state["dense.weight"], state["dense.bias"] = take(dense + ".weight", (d, d)), take(dense + ".bias", (d,))
    else:
        state["dense.weight"], state["dense.bias"] = fresh["dense.weight"], fresh["dense.bias"]
        head_note += "; no pooler in the checkpoint: new dense layer"
    if rows is not None:
        n = len(hf_labels)
        state["out.weight"] = take(out + ".weight", (n, d))[rows].clone()
        state["out.bias"] = take(out + ".bias", (n,))[rows].clone()
    else:
        state["out.weight"], state["out.bias"] = fresh["out.weight"], fresh["out.bias"]
    state = {key: t.detach().float().contiguous() for key, t in state.items()}
    check_state(config, state, str(directory))

    summary = (f"HF {c.model_type} {c.num_hidden_layers} layers, d={d}, {c.num_attention_heads} heads, "
               f"FFN {c.intermediate_size}, {c.vocab_size} ids, {max_positions} positions; {head_note}")
    return imported_payload(config, state, tokenizer.to_state(), f"hf_{c.model_type}", directory, summary,
                            ignored_weights=sorted(take.unused())[:20])


# ---- configuration ------------------------------------------------------------------------------


def _read_config(directory: Path) -> tuple[dict[str, Any], Path]:
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such directory (expected a local Hugging Face model directory; "
                              "the hub is never contacted)")
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{directory} is not a local Hugging Face model directory (no config.json)")
    raw = read_json_object(config_file, CheckpointError)
    if raw.get("model_type") not in MODEL_TYPES:
        found = raw.get("model_type")
        raise ConfigError(f"{config_file}: model_type={found!r}; `convert from-hf-bert` imports only BERT and RoBERTa "
                          "encoders (model_type 'bert' or 'roberta')")
    return raw, config_file


def _check_config(c: Any, raw: dict[str, Any], where: Path) -> None:
    if c.hidden_act not in ACTIVATIONS:
        raise ConfigError(f"{where}: hidden_act={c.hidden_act!r} is not supported "
                          f"(supported: {', '.join(sorted(ACTIVATIONS))})")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"{where}: position_embedding_type={raw['position_embedding_type']!r}; only 'absolute' "
                          "positions can be imported")
    if raw.get("is_decoder") or raw.get("add_cross_attention"):
        raise ConfigError(f"{where}: a decoder / cross-attention BERT cannot be imported as a classifier")
    if c.hidden_size % c.num_attention_heads:
        raise ConfigError(f"{where}: hidden_size={c.hidden_size} is not divisible by "
                          f"num_attention_heads={c.num_attention_heads}")
    if c.pad_token_id is None or c.type_vocab_size < 1:
        raise ConfigError(f"{where}: needs pad_token_id and type_vocab_size >= 1")
    if c.model_type == "roberta" and c.max_position_embeddings <= c.pad_token_id + 1:
        raise ConfigError(f"{where}: max_position_embeddings={c.max_position_embeddings} leaves no positions after "
                          f"RoBERTa's offset pad_token_id + 1 = {c.pad_token_id + 1}")


def _model_config(c: Any, max_positions: int, tokenizer: Any) -> Any:
    return ModelConfig(
        d_model=c.hidden_size,
        heads=c.num_attention_heads,
        ffn_dim=c.intermediate_size,
        encoder_layers=c.num_hidden_layers,
        decoder_layers=0,
        norm="post",
        activation=ACTIVATIONS[c.hidden_act],
        dropout=float(c.hidden_dropout_prob),
        attention_dropout=float(c.attention_probs_dropout_prob),
        activation_dropout=0.0,
        positions="learned",
        max_positions=max_positions,
        scale_embedding=False,
        embedding_norm=True,
        segments=c.type_vocab_size if _segments(c) else 0,
        norm_eps=float(c.layer_norm_eps),
        encoder=LayerConfig.variant("transformer")(),
        src_vocab_size=c.vocab_size,
        tgt_vocab_size=c.vocab_size,
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
    )


def _segments(c: Any) -> bool:
    """Whether the model gets segment embeddings: BERT with two or more token types (RoBERTa reads pairs with
    type 0 throughout, whatever its type_vocab_size)."""
    return c.model_type == "bert" and c.type_vocab_size >= 2


def _classifier_dropout(c: Any) -> float | None:
    """HF's head dropout: classifier_dropout when set, else hidden_dropout_prob (= our default, None)."""
    value = getattr(c, "classifier_dropout", None)
    return None if value is None else float(value)


def _fine_tuning_defaults() -> Any:
    """The usual BERT fine-tuning settings (Devlin et al.): AdamW 2e-5, betas (0.9, 0.999), weight decay
    0.01, batches of 32 texts, no label smoothing, 3 epochs, best checkpoint by accuracy."""

    return TrainConfig(lr=LRConfig(schedule="constant", lr=2e-5, warmup=100), betas=(0.9, 0.999), weight_decay=0.01,
                       max_sentences=32, max_tokens=32 * 512, label_smoothing=0.0, max_epochs=3, valid_every=500,
                       best_metric="accuracy")


# ---- weights ------------------------------------------------------------------------------------


def _load_weights(directory: Path, model_type: str) -> dict[str, Tensor]:
    """Every tensor of the directory's weights file(s), keys without the `bert.`/`roberta.` prefix."""
    found = next((directory / name for name in WEIGHT_FILES if (directory / name).is_file()), None)
    if found is None:
        raise CheckpointError(f"{directory}: no weights ({' or '.join(WEIGHT_FILES)})")
    try:
        if found.name == "pytorch_model.bin":
            state = torch.load(found, map_location="cpu", weights_only=True)
        else:

            files = [found]
            if found.name.endswith(".index.json"):
                shards = json.loads(found.read_text(encoding="utf-8"))["weight_map"].values()
                files = [directory / name for name in sorted(set(shards))]
            state = {}
            for file in files:
                state.update(load_file(str(file)))
    except Exception as err:  # any unreadable file: one line naming it
        raise CheckpointError(f"{found}: cannot read the weights ({type(err).__name__}: {err})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{found}: not a state dict")
    prefix = model_type + "."
    weights = {}
    for key, tensor in state.items():
        key = key.removeprefix(prefix)
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        weights[key] = tensor
    return weights


class _Taker:
    """Tensors by HF key with their expected shapes; one clear error for a missing or misshapen one."""

    def __init__(self, weights: dict[str, Tensor], directory: Path):
        self.weights, self.directory, self.used = weights, directory, set()

    def __call__(self, key: str, shape: tuple[int, ...]) -> Tensor:
        if key not in self.weights:
            raise CheckpointError(f"{self.directory}: the weights have no {key!r}; they do not match config.json "
                                  "(or are not a BERT/RoBERTa model)")
        tensor = self.weights[key]
        if tuple(tensor.shape) != shape:
            raise CheckpointError(f"{self.directory}: {key} has shape {tuple(tensor.shape)} but config.json implies "
                                  f"{shape}; weights and config.json do not match")
        self.used.add(key)
        return tensor.float()

    def unused(self) -> set[str]:
        return set(self.weights) - self.used - {"embeddings.position_ids"}


def _norm(prefix: str, take: _Taker, hf: str, d: int) -> dict[str, Tensor]:
    return {prefix + "weight": take(hf + ".weight", (d,)), prefix + "bias": take(hf + ".bias", (d,))}


def _head_keys(c: Any, weights: dict[str, Tensor]) -> tuple[str | None, str | None, list[str]]:
    """(dense key prefix or None, output key prefix or None, HF label names in id order)."""
    if c.model_type == "roberta":
        dense = "classifier.dense" if "classifier.dense.weight" in weights else "pooler.dense"
        out = "classifier.out_proj"
    else:
        dense, out = "pooler.dense", "classifier"
    dense_found = dense if dense + ".weight" in weights else None
    if out + ".weight" not in weights:
        return dense_found, None, []
    names = [str(c.id2label.get(i, i)) for i in range(weights[out + ".weight"].shape[0])] \
        if getattr(c, "id2label", None) else [str(i) for i in range(weights[out + ".weight"].shape[0])]
    return dense_found, out, names


def _choose_head(hf_labels: list[str], labels: list[str] | None, num_labels: int | None,
                 directory: Path) -> tuple[list[str], list[int] | None, str]:
    """(our label names, HF rows in our order or None for a new head, a note for the summary)."""
    if labels is None and num_labels is None:
        if not hf_labels:
            raise ConfigError(f"{directory} has no classification head (a base model); give --labels or "
                              "--num-labels for a new one")
        order = "" if hf_labels == sorted(hf_labels) else "; `prepare` sorts labels: give --labels to reorder the head"
        return hf_labels, list(range(len(hf_labels))), f"classification head kept (labels {', '.join(hf_labels)}{order})"
    if labels is not None:
        if len(set(labels)) != len(labels) or len(labels) < 2:
            raise ConfigError(f"--labels {','.join(labels)}: give at least two distinct labels")
        if num_labels is not None and num_labels != len(labels):
            raise ConfigError(f"--num-labels {num_labels} but --labels names {len(labels)}")
        if sorted(labels) == sorted(hf_labels):
            return labels, [hf_labels.index(name) for name in labels], "classification head kept, rows in --labels order"
        return labels, None, f"new classification head ({len(labels)} labels)"
    assert num_labels is not None
    if num_labels < 2:
        raise ConfigError(f"--num-labels {num_labels}: must be >= 2")
    return [], None, f"new classification head ({num_labels} labels)"


def _fresh_head(config: Any, seed: int) -> dict[str, Tensor]:
    """dense/out weights of a freshly initialised classifier of `config` (seeded)."""

    fork = torch.random.fork_rng(devices=[])
    with fork:
        torch.manual_seed(seed)
        model = Classifier(config.model, config.classifier)
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k.startswith(("dense.", "out."))}
