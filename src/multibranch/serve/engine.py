"""Engines behind the server: one model copy, used by one worker thread at a time.

A translation engine (`task = "translation"`) turns a batch of texts into n-best lists for one decode
setting (beam, nbest); a classification engine (`task = "classification"`) into label probabilities.
Both count source tokens (for the batching budget). `TorchEngine` wraps our Translator (every model
kind) and also draws attention maps (`attention_choices`, `attention`); `Ct2Engine` a directory written
by `multibranch convert ct2` (no attention maps: CTranslate2 returns only the alignment heads chosen at
conversion, not a chosen layer and head); `ClassifierEngine` a classifier checkpoint (`multibranch
classify`'s model). `load_torch_engine` picks the engine from the checkpoint's task.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Protocol

import torch

from multibranch.checkpoint.format import CheckpointError
from multibranch.errors import UserError
from multibranch.inference.ensemble import Ensemble
from multibranch.loading.model import LoadedModel, check_ct2_options
from multibranch.modules.simplex import BranchWeights
from multibranch.serve.attention import attention_choices, sentence_ids, sentence_map
from multibranch.tasks.classification.inference import Example, encode_examples
from multibranch.tasks.translation.ct2 import Ct2Translator
from multibranch.tasks.translation.translator import Translator

Hypotheses = list[tuple[str, float]]  # (text, normalised score), best first


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """A request's decode settings beyond beam and n-best, as `multibranch translate` takes them: `fields`, the
    decode config fields it sets (sorted (name, value) pairs: sampling, temperature, seed, length_penalty,
    no_repeat_ngram_size, ...), target prefixes (the items are then (text, prefix) pairs) and attention-based
    alignments. One engine call decodes requests of equal options together."""

    beam: int
    nbest: int = 1
    fields: tuple[tuple[str, Any], ...] = ()
    prefixed: bool = False
    aligned: bool = False

    @property
    def sampling(self) -> bool:
        return bool(dict(self.fields).get("sampling", False))

    @property
    def seed(self) -> int | None:
        return dict(self.fields).get("seed")


class Engine(Protocol):
    """What the app and the batcher need. Translation engines also have `default_beam` and
    `translate(texts, beam, nbest) -> list[Hypotheses]`; classification engines `labels` and
    `classify(texts) -> list[list[float] | None]`. An engine without `task` is a translation engine."""

    def count_tokens(self, texts: list[str]) -> list[int]: ...

    def info(self) -> dict[str, Any]: ...

    # Optional: attention_choices() -> the maps attention(...) can draw (serve/attention.py), or None;
    # an engine without the method draws no maps (POST /attention answers 400).


def branch_weights(model: Any) -> dict[str, dict[str, list[float]]]:
    """Learned branch weights read from the model: kappa/alpha per Weighted module, unit weights per
    MUTE module (the raw learned w), keyed by module name."""


    out: dict[str, dict[str, list[float]]] = {}
    for name, module in model.named_modules():
        if isinstance(module, BranchWeights):
            kappa, alpha = module()
            out[name] = {"kappa": kappa.detach().float().cpu().tolist(), "alpha": alpha.detach().float().cpu().tolist()}
        elif isinstance(getattr(module, "unit_weights", None), torch.nn.Parameter):
            out[name] = {"unit_weights": module.unit_weights.detach().float().cpu().tolist()}
    return out


def load_torch_engine(path: str | list[str], device: str = "cpu", precision: str = "fp32",
                      **overrides: Any) -> TorchEngine | ClassifierEngine:
    """The engine of a checkpoint, chosen by its task: TorchEngine for a translation model,
    ClassifierEngine for a classifier. Several paths: an ensemble, loaded as `multibranch translate`
    and `classify` load one (`LoadedModel`). `overrides` are decode settings (translation only). One model
    copy in `precision` (inference/precision.py) serves every request."""
    loaded = LoadedModel.load(path if isinstance(path, str) else list(path), device, precision,
                              tasks=("translation", "classification"), decode=overrides, ct2=False)
    return engine_of(loaded)


def engine_of(loaded: LoadedModel) -> TorchEngine | ClassifierEngine:
    """The engine that serves a loaded checkpoint or ensemble (not a CTranslate2 directory: `Ct2Engine`)."""
    assert loaded.config is not None and loaded.module is not None
    if loaded.task == "classification":
        return ClassifierEngine(loaded)
    summary = model_summary(loaded.config.model)
    if loaded.kind == "ensemble":
        summary["ensemble"] = loaded.paths
    return TorchEngine(loaded.module, loaded.tokenizer, loaded.decode_config(), loaded.device,
                       kind=loaded.config.model.encoder.kind, summary=summary, precision=loaded.precision)


def model_summary(model_cfg: Any) -> dict[str, Any]:
    """The sizes /info shows of a ModelConfig."""
    return {"d_model": model_cfg.d_model, "heads": model_cfg.heads, "ffn_dim": model_cfg.ffn_dim,
            "encoder_layers": model_cfg.encoder_layers, "decoder_layers": model_cfg.decoder_layers,
            "encoder_kind": model_cfg.encoder.kind, "decoder_kind": model_cfg.decoder.kind}


class TorchEngine:
    """Our Translator over a loaded model; one Translator per decode setting, all sharing the model."""

    task = "translation"

    def __init__(self, model: Any, tokenizer: Any, decode: Any, device: Any = "cpu", kind: str = "torch",
                 summary: dict[str, Any] | None = None, precision: str = "fp32"):
        self.model, self.tokenizer, self.decode, self.kind = model, tokenizer, decode, kind
        self.precision = precision  # the model is already the one to decode with (for_decoding)
        self.default_beam = decode.beam
        self.abandoned = threading.Event()  # set by `abandon`: the call under way stops before its next batch
        self._translators: dict[Any, Any] = {}
        self._device = device
        self._base = self._new_translator(decode)
        self._translators[decode.beam] = self._base
        self.summary = summary or {}

    @classmethod
    def from_checkpoint(cls, path: str, device: str = "cpu", precision: str = "fp32", **overrides: Any) -> TorchEngine:
        """The engine of a translation checkpoint (load_torch_engine; a classifier is refused)."""

        engine = load_torch_engine(path, device, precision, **overrides)
        if not isinstance(engine, cls):
            raise CheckpointError(f"{path} is a {engine.task} model, not a translation model")
        return engine

    def _new_translator(self, cfg: Any, aligned: bool = False) -> Translator:
        """A Translator over the engine's model with `cfg`, stopped by `abandon` (aligned: Pharaoh alignments of
        the last decoder layer)."""
        translator = Translator(self.model, self.tokenizer, cfg, self._device, alignment_layer=-1 if aligned else None)
        translator.stop = self.abandoned
        return translator

    def abandon(self) -> None:
        """Stop the engine call under way before its next batch (its callers have all gone: timed out)."""
        self.abandoned.set()

    def _translator(self, beam: int, aligned: bool = False) -> Any:
        """The Translator of a beam size (with attention-based alignments of the last decoder layer when
        `aligned`), made once and kept."""
        key = (beam, aligned) if aligned else beam
        if key not in self._translators:
            cfg = dataclasses.replace(self.decode, beam=beam, nbest=1)
            self._translators[key] = self._new_translator(cfg, aligned)
        return self._translators[key]

    @property
    def ensemble(self) -> bool:
        """Whether the model is an ensemble of several checkpoints."""
        return isinstance(self.model, Ensemble)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) + 1 for ids in self.tokenizer.encode_src(texts)]  # + EOS

    @property
    def input_limit(self) -> int | None:
        """The most source tokens (EOS included) a text may have: the model's and the decode settings' limit."""
        return self._base.max_input_tokens

    def translate(self, texts: list[str], beam: int, nbest: int) -> list[Hypotheses]:
        self.abandoned.clear()  # a new call: an abandon of the one before is spent
        return self._translator(beam).translate_nbest(texts, nbest)

    def decode_options(self, options: DecodeOptions) -> Any:
        """The DecodeConfig of `options`: this engine's, with the request's beam and decode fields (checked as
        `multibranch translate` checks them: ConfigError)."""
        beam = {} if options.sampling else {"beam": options.beam}
        cfg = dataclasses.replace(self.decode, nbest=1, **beam, **dict(options.fields))
        cfg.validate()
        return cfg

    def translate_with(self, items: list[Any], options: DecodeOptions) -> list[list[tuple[str, float, str | None]]]:
        """Per item (a text, or a (text, prefix) pair when `options.prefixed`) up to `options.nbest`
        (text, score, alignment) hypotheses, best first: the Translator of `multibranch translate`, with
        sampling and prefixes as it decodes them. A seeded request gets a Translator of its own, whose
        generator starts from the seed (the samples of `translate --seed` on the same texts)."""
        key = ("options", options)
        translator = None if options.seed is not None else self._translators.get(key)
        if translator is None:
            translator = self._new_translator(self.decode_options(options), options.aligned)
            if options.seed is None:
                self._translators[key] = translator
        self.abandoned.clear()
        texts = [item[0] for item in items] if options.prefixed else list(items)
        prefixes = [item[1] for item in items] if options.prefixed else None
        return [[(t.text, t.score, t.alignment) for t in entries]
                for entries in translator.translate_full(texts, options.nbest, prefixes=prefixes)]

    def check_prefixes(self, texts: list[str], prefixes: list[str]) -> None:
        """DataError when a prefix is longer than its text's translation may be (before it is queued)."""
        self._base.encode_prefixes(texts, prefixes)

    def translate_aligned(self, texts: list[str], beam: int, nbest: int) -> list[list[tuple[str, float, str]]]:
        """`translate` with each hypothesis' Pharaoh alignment (inference/alignment.py: attention-based)."""
        self.abandoned.clear()
        return [[(t.text, t.score, t.alignment or "") for t in entries]
                for entries in self._translator(beam, aligned=True).translate_full(texts, nbest)]

    def attention_choices(self) -> dict[str, dict[str, Any]] | None:
        """The maps `attention` draws; None for an ensemble (a map is of one model's attention)."""
        return None if self.ensemble else attention_choices(self.model)

    def attention(self, text: str, kind: str, layer: int, head: int | None = None, branch: int | None = None,
                  beam: int | None = None, target: str | None = None) -> dict[str, Any]:
        """One attention map of `text` with `target` as the translation (unset: the model's 1-best
        with `beam`, as POST /translate gives it): the source is encoded and truncated as for
        translation; a target longer than learned positions allow raises SelectionError."""

        self.abandoned.clear()
        translation, src_ids, tgt_ids = sentence_ids(self._translator(beam or self.default_beam), text, target)
        entry = sentence_map(self.model, self.tokenizer, src_ids, tgt_ids, kind, layer, head, branch)
        return {"text": text, "translation": translation, "kind": kind, "layer": layer, "head": head,
                "branch": branch, **entry}

    def info(self) -> dict[str, Any]:
        return {
            "engine": "torch",
            "task": self.task,
            "precision": self.precision,
            "kind": self.kind,
            "config": self.summary,
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "decode": dataclasses.asdict(self.decode),
            "branch_weights": branch_weights(self.model),
        }


def _blank(example: Example) -> bool:
    """A blank text, or a pair of blank texts: nothing to classify."""
    return not any(text.strip() for text in (example if isinstance(example, tuple) else (example,)))


class ClassifierEngine:
    """A classifier (or an ensemble of them) over a loaded model: label probabilities of texts as `multibranch
    classify` gives them (same tokenizer, truncation and softmax); an empty or blank text has no label (None)."""

    task = "classification"

    def __init__(self, loaded: LoadedModel):
        assert loaded.config is not None and loaded.module is not None
        self.loaded = loaded
        self.model, self.tokenizer, self.device, self.precision = loaded.module, loaded.tokenizer, loaded.device, \
            loaded.precision
        self.labels = loaded.labels
        self.pooling = loaded.config.classifier.pooling
        self.summary = model_summary(loaded.config.model)
        if loaded.kind == "ensemble":
            self.summary["ensemble"] = loaded.paths
        self.pairs = loaded.pairs  # reads sentence pairs (a, b)

    def count_tokens(self, texts: list[Example]) -> list[int]:
        """Tokens per text or pair as the (first) model reads it (BOS + ids + EOS, cut to its positions)."""
        kept = [text for text in texts if not _blank(text)]
        lengths = iter(encode_examples(self.model, self.tokenizer, kept))
        return [2 if _blank(text) else len(next(lengths)) + 2 for text in texts]  # + BOS, EOS

    def classify(self, texts: list[Example]) -> list[list[float] | None]:
        """Per text (or pair, for a pair classifier): the label probabilities in `labels` order (an ensemble: the
        mean of its members'), or None for a blank text."""
        kept = [i for i, text in enumerate(texts) if not _blank(text)]
        out: list[list[float] | None] = [None] * len(texts)
        if kept:
            probs = self.loaded.classify([texts[i] for i in kept])  # [n, C]
            for row, i in enumerate(kept):
                out[i] = probs[row].tolist()
        return out

    def info(self) -> dict[str, Any]:
        return {
            "engine": "torch",
            "task": self.task,
            "precision": self.precision,
            "kind": self.summary["encoder_kind"],
            "config": {k: v for k, v in self.summary.items() if not k.startswith("decoder")},
            "parameters": self.loaded.parameters_count,
            "labels": self.labels,
            "pooling": self.pooling,
            "pairs": self.pairs,
            "branch_weights": branch_weights(self.model),
        }


class Ct2Engine:
    """A CTranslate2 directory written by `multibranch convert ct2` (standard and folded MAT models),
    decoded as `multibranch translate --ckpt DIR` decodes it (`Ct2Translator`, whose options equal our
    beam search)."""

    task = "translation"

    def __init__(self, directory: str, device: str = "cpu", threads: int = 1, **overrides: Any):
        loaded = LoadedModel.load(directory, device, tasks=("translation",), decode=overrides, threads=threads)
        if loaded.kind != "ct2":
            raise UserError(f"{directory}: the ct2 engine serves a directory written by `multibranch convert ct2`")
        self.translator = loaded.translator(threads=threads)
        assert isinstance(self.translator, Ct2Translator)
        self.decode, self.settings = self.translator.cfg, self.translator.settings
        self.default_beam = self.decode.beam

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.translator.count_tokens(texts)

    @property
    def input_limit(self) -> int | None:
        """The most source tokens (EOS included) a text may have (the directory's position table, max_input_tokens)."""
        return self.translator.max_input_tokens

    def translate(self, texts: list[str], beam: int, nbest: int) -> list[Hypotheses]:
        return self.translator.translate_nbest(texts, nbest, beam=beam)

    def decode_options(self, options: DecodeOptions) -> Ct2Translator:
        """The translator of `options` (the same CTranslate2 model with the request's decode fields);
        UnsupportedError for prefixes, alignments or sampling, ConfigError for what CTranslate2 cannot do."""
        check_ct2_options(str(self.translator.root), {"sampling": options.sampling,
                                                      "prefix": "given" if options.prefixed else None,
                                                      "print_alignment": options.aligned},
                          lambda name, value: "alignment" if name == "print_alignment" else name)
        return self.translator.with_decode(beam=options.beam, nbest=1, **dict(options.fields))

    def translate_with(self, items: list[Any], options: DecodeOptions) -> list[list[tuple[str, float, str | None]]]:
        """Per text up to `options.nbest` (text, score, None) hypotheses with the request's decode fields."""
        translator = self.decode_options(options)
        return [[(text, score, None) for text, score in entries]
                for entries in translator.translate_nbest(list(items), options.nbest)]

    def attention_choices(self) -> None:
        return None

    def info(self) -> dict[str, Any]:
        return {"engine": "ct2", "task": self.task, "kind": self.settings.get("model_kind"), "config": {
                    "source": self.settings.get("source"), "quantization": self.settings.get("quantization")},
                "parameters": None, "decode": dataclasses.asdict(self.decode), "branch_weights": {}}
