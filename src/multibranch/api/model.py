"""`load` and `Model`: a checkpoint, an ensemble or a CTranslate2 directory, used as the CLI's translate
(with --prefix and --print-alignment), `translate --score-reference`, classify and serve's POST /attention
use it, returning Python values."""


from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from multibranch.analysis.attention_maps import SelectionError
from multibranch.api.checks import check_device
from multibranch.api.results import AlignedTranslation, AttentionMaps
from multibranch.config import check_value
from multibranch.device import resolve_device
from multibranch.errors import CheckpointError, ConfigError, DataError, UserError
from multibranch.experiment import ExperimentConfig
from multibranch.experiment.decoding import SAMPLING_ONLY, DecodeConfig, check_sampling_only
from multibranch.loading.model import TRANSLATION_TASKS, LoadedModel, UnsupportedError
from multibranch.serve.attention import sentence_ids, sentence_maps
from multibranch.tasks.translation.ct2 import Ct2Translator
from multibranch.tasks.translation.translator import ForcedScore, Translator

__all__ = ["AlignedTranslation", "AttentionMaps", "ExistingFileError", "ForcedScore", "MissingFileError", "Model",
           "UnsupportedError", "WrongTaskError", "load", "user_errors"]

# the CLI's decoding flag names that differ from DecodeConfig's fields (translate --lenpen ...)
DECODE_ALIASES = {"lenpen": "length_penalty", "lenpen_kind": "length_penalty_kind"}
DECODE_FIELDS = tuple(f.name for f in dataclasses.fields(DecodeConfig))
# decode options that forced decoding (`score`) never reads
SEARCH_ONLY = frozenset({"beam", "nbest", "sampling", "temperature", "top_k", "top_p", "seed", "min_len", "max_len_a",
                         "max_len_b", "no_repeat_ngram_size"})
# the CLI's names in the library's messages -> the API's arguments
DECODE_RENAMES = {"--max-len-a/--max-len-b": "max_len_a/max_len_b", "--alignment-layer": "alignment_layer",
                  "--print-alignment": "alignment=True", "--long-inputs truncate": "long_inputs='truncate'",
                  "--long-inputs refuse": "long_inputs='refuse'"}
LOAD_RENAMES = {**DECODE_RENAMES, "--device": "device", "--precision": "precision"}


class WrongTaskError(CheckpointError):
    """A model asked for what its task does not do (a classifier asked to translate, and the reverse)."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or directory the call needs does not exist (`multibranch` reports it as a user error too)."""


class ExistingFileError(UserError, FileExistsError):
    """A file or directory is in the way: a run directory without resume/force, a file where one is made."""


@contextmanager
def user_errors(rename: Mapping[str, str] | None = None) -> Iterator[None]:
    """FileNotFoundError / FileExistsError raised inside, as the UserError subclasses above (still the same
    OSError types); `rename` replaces the CLI's flag names in their messages (and in UserErrors') with the
    API's arguments."""
    try:
        yield
    except (UserError, FileNotFoundError, FileExistsError) as err:
        message = str(err)
        for flag, argument in (rename or {}).items():
            message = message.replace(flag, argument)
        if isinstance(err, UserError):
            if message == str(err):
                raise
            raise type(err)(message) from None
        kind = MissingFileError if isinstance(err, FileNotFoundError) else ExistingFileError
        raise kind(message) from None


def _decode_fields(overrides: Mapping[str, Any], sampling: bool = False) -> dict[str, Any]:
    """The given (not None) decode overrides under DecodeConfig's field names, each checked as the CLI checks
    its options (type, range, finiteness: `config.check_value`), and the options that apply only to sampling
    refused without it (`sampling`: whether the decoder samples unless the overrides say); ConfigError naming
    an unknown or a bad one."""
    out = {}
    for name, value in overrides.items():
        field = DECODE_ALIASES.get(name, name)
        if field not in DECODE_FIELDS:
            raise ConfigError(f"unknown decoding option {name!r}; known: {', '.join(DECODE_FIELDS)}")
        if value is not None:
            out[field] = check_value(DecodeConfig, field, value)
    check_sampling_only([name for name in SAMPLING_ONLY if name in out], out.get("sampling", sampling),
                        "sampling=True")
    return out


def _as_list(texts: str | Sequence[str], what: str) -> tuple[list[str], bool]:
    """(the texts, whether one text was given on its own); a UserError for anything but a str or a list of
    str (bytes included: decode them first)."""
    if isinstance(texts, str):
        return [texts], True
    if isinstance(texts, Sequence) and not isinstance(texts, (bytes, bytearray)):
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise UserError(f"{what}: item {i} is {_kind(text)}; give a str or a list of str")
        return list(texts), False
    raise UserError(f"{what}: give a str or a list of str, not {_kind(texts)}")


def _argument(name: str, value: object) -> str:
    """An option of the library's refusals as this API's argument: `prefixes`, `alignment=True`."""
    return {"prefix": "prefixes", "print_alignment": "alignment=True"}.get(name, name)


def _kind(value: Any) -> str:
    """What a wrong value is, for a message: `None`, `an int (5)`, `bytes (decode them first)`."""
    if value is None:
        return "None"
    if isinstance(value, (bytes, bytearray)):
        return "bytes (decode them to a str first)"
    name, shown = type(value).__name__, repr(value)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}" + (f" ({shown})" if len(shown) <= 40 else "")


class Model:
    """A loaded model (one checkpoint, an ensemble, or a CTranslate2 directory); made by `load`.

    `task` is "translation", "code" or "classification"; `config` the ExperimentConfig it was trained with
    (None for a CTranslate2 directory, which keeps only its decode settings: `decode`); `parameters_count`
    the number of weights (all members of an ensemble together; None for a CTranslate2 directory);
    `module` the torch module (None for a CTranslate2 directory) and `tokenizer` the text <-> ids mapping
    (`encode_src(texts)`, `decode_tgt(ids)`); `loaded` the library's LoadedModel underneath.
    """

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.paths, self.device, self.precision = loaded.paths, loaded.device, loaded.precision
        self.config: ExperimentConfig | None = loaded.config
        self.task = loaded.task
        self.parameters_count = loaded.parameters_count
        self._name = loaded.name
        self._translator = loaded.translator() if loaded.task in TRANSLATION_TASKS else None

    @property
    def module(self) -> torch.nn.Module | None:
        """The torch module that decodes or labels (an ensemble: one module over its members; None for a
        CTranslate2 directory)."""
        return self.loaded.module

    @property
    def tokenizer(self) -> Any:
        """The tokenizer: `encode_src(texts) -> ids`, `decode_tgt(ids) -> text`."""
        return self.loaded.tokenizer

    def __repr__(self) -> str:
        return f"Model({self._name!r}, task={self.task!r}, device={str(self.device)!r})"

    # ---- translation -------------------------------------------------------------------------------

    @property
    def decode(self) -> DecodeConfig:
        """The decode config `translate` uses when called without options (a copy)."""
        return dataclasses.replace(self._decoder(None).cfg)

    def _decoder(self, method: str | None) -> Translator | Ct2Translator:
        decoder = self._translator
        if decoder is None:
            raise WrongTaskError(f"{method or 'decode'}: {self._name} is a {self.task} model, not a translation "
                                 f"model; use {'classify()' if self.task == 'classification' else 'translate()'}")
        return decoder

    def _with(self, method: str, options: Mapping[str, Any], alignment_layer: int | None = None
              ) -> Translator | Ct2Translator:
        """The decoder, or (per-call options given, or an alignment layer) one with those decode fields
        replaced that aligns with decoder layer `alignment_layer` (UserError when there is no such layer)."""
        decoder = self._decoder(method)
        fields = {k: v for k, v in _decode_fields(options, decoder.cfg.sampling).items() if v != getattr(decoder.cfg, k)}
        if not fields and alignment_layer is None:
            return decoder
        return self.loaded.translator(alignment_layer=alignment_layer, **fields)

    def translate(self, texts: str | Sequence[str], beam: int | None = None, nbest: int = 1, *,
                  prefixes: str | Sequence[str | None] | None = None, alignment: bool = False,
                  alignment_layer: int | None = None, **options: Any) -> Any:
        """Translate one text (-> its translation) or a list (-> one translation each, in order).

        `beam`: the beam size (None: the model's decode config); `nbest` > 1 gives each text a list of its
        `nbest` best translations instead (at most `beam`). `options`: any other decoding field, named as
        in DecodeConfig or as `multibranch translate`'s flags (lenpen=0.6, max_len_a=1.5, sampling=True,
        temperature=0.7, seed=1, ...). An empty text translates to "".

        `prefixes` (`translate --prefix FILE`): per text the target text its translation must start with
        (None or "": no prefix), as many as texts (one text: a str, or a list of one); the search goes on
        after it. A prefix longer than the text's output limit (`max_len_a`, `max_len_b`, the model's
        positions) is a DataError before anything is decoded.

        `alignment=True` (`translate --print-alignment`): each translation is an AlignedTranslation
        (text, score and the (source i, target j) pairs the CLI prints) instead of a str;
        `alignment_layer` (default -1, the last; `--alignment-layer`): the decoder layer whose
        cross-attention, mean over heads, aligns. Neither works with a CTranslate2 directory
        (UnsupportedError).
        """
        self._decoder("translate")  # a classifier: WrongTaskError before anything else
        lines, single = _as_list(texts, "translate")
        wanted = self._prefixes(prefixes, lines, single)
        if alignment_layer is not None and not alignment:
            raise UserError("alignment_layer chooses the layer of alignment=True; add alignment=True")
        self.loaded.check_supported({"prefix": wanted, "print_alignment": alignment}, _argument)
        layer = (-1 if alignment_layer is None else alignment_layer) if alignment else None
        with user_errors(DECODE_RENAMES):
            decoder = self._with("translate", {"beam": beam, "nbest": nbest, **options}, layer)
            nbest = decoder.cfg.nbest  # checked: an int within its bounds
            if not alignment and wanted is None:  # CTranslate2 too
                out: list[Any] = (decoder.translate(lines) if nbest == 1 else
                                  [[text for text, _ in entries] for entries in decoder.translate_nbest(lines, nbest)])
            else:
                assert isinstance(decoder, Translator)
                results = decoder.translate_full(lines, nbest, prefixes=wanted)
                if alignment:
                    out = [[AlignedTranslation.from_pharaoh(t.text, t.alignment, t.score) for t in entries]
                           for entries in results]
                else:
                    out = [[t.text for t in entries] for entries in results]
                if nbest == 1:
                    out = [entries[0] for entries in out]
        return out[0] if single else out

    @staticmethod
    def _prefixes(prefixes: str | Sequence[str | None] | None, lines: list[str], single: bool) -> list[str] | None:
        """The prefix of each line ("" for none), or None when no prefixes were given."""
        if prefixes is None:
            return None
        if isinstance(prefixes, str):
            if not single:
                raise UserError("prefixes: give a list of one prefix per text (None or \"\": no prefix), not a str")
            prefixes = [prefixes]
        if not isinstance(prefixes, Sequence) or not all(p is None or isinstance(p, str) for p in prefixes):
            raise UserError("prefixes: give a list of one str (or None) per text")
        if len(prefixes) != len(lines):  # the library's message (`translate --prefix`)
            raise DataError(f"line counts differ: {len(lines)} input lines but {len(prefixes)} prefixes")
        return ["" if p is None else p for p in prefixes]

    def score(self, texts: str | Sequence[str], references: str | Sequence[str], **options: Any) -> Any:
        """Forced decoding, as `translate --score-reference`: how likely the model finds `references[i]` as
        the translation of `texts[i]`. Per pair a ForcedScore (score = log_prob / length penalty, log_prob
        = natural-log probability of the reference tokens with EOS, tokens = their count), None for an empty
        text; one pair of strings gives one result."""
        unused = sorted(set(options) & SEARCH_ONLY)
        if unused:
            raise UserError(f"score: {', '.join(unused)} only shape a search or samples; forced decoding scores the "
                            "given references (drop them)")
        lines, single = _as_list(texts, "score")
        refs, _ = _as_list(references, "score")
        with user_errors(DECODE_RENAMES):
            out = self._with("score", options).score(lines, refs)
        return out[0] if single else out

    # ---- attention maps ----------------------------------------------------------------------------

    def attention(self, text: str, translation: str | None = None, beam: int | None = None,
                  **options: Any) -> AttentionMaps:
        """Every attention map of `text` with `translation` as its translation (None: the model's 1-best
        with `beam` and `options`, as `translate` gives it), as `serve`'s POST /attention draws them (one
        of them per request) and `analyze attention` writes them: an AttentionMaps with the source and
        target tokens and per attention type and layer the maps of every head [H, rows, columns] and
        branch [B, rows, columns]; `.map(kind, layer, head=, branch=)` picks one.

        The source is encoded and truncated as for translation. DataError for an empty text or a
        `translation` longer than the model's learned positions allow; UnsupportedError for an ensemble
        (a map is of one model's attention) or a CTranslate2 directory (no attention weights);
        WrongTaskError for a classifier.
        """
        if not isinstance(text, str) or not (translation is None or isinstance(translation, str)):
            raise UserError("attention: give one text (a str) and optionally its translation (a str)")
        self.loaded.check_supported({"attention": True}, _argument)
        decoder = self._with("attention", {"beam": beam, **options})
        assert isinstance(decoder, Translator)
        try:
            translated, src_ids, tgt_ids = sentence_ids(decoder, text, translation)
        except SelectionError as err:
            raise DataError(f"attention: {err}") from None
        entry = sentence_maps(decoder.model, decoder.tokenizer, src_ids, tgt_ids)
        return AttentionMaps.from_sentence(text, translated, entry)

    # ---- classification ----------------------------------------------------------------------------

    @property
    def labels(self) -> list[str]:
        """A classifier's label names, in the order of its probabilities."""
        if self.task != "classification" or self.config is None:
            raise WrongTaskError(f"labels: {self._name} is a {self.task} model, not a classifier")
        return self.loaded.labels

    def classify(self, texts: str | tuple[str, str] | Sequence[str | tuple[str, str]], probs: bool = False,
                 batch_size: int = 64) -> Any:
        """Label one text (or one (a, b) pair for a sentence-pair classifier) or a list of them, as
        `multibranch classify`: the label of each (an ensemble: argmax of the members' mean probabilities),
        or with `probs` a {label: probability} dict; None for an empty text."""
        if self.task != "classification":
            raise WrongTaskError(f"classify: {self._name} is a {self.task} model, not a classifier; use translate()")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UserError(f"batch_size {batch_size!r}: give an int >= 1")
        single = isinstance(texts, str) or (isinstance(texts, tuple) and len(texts) == 2
                                            and all(isinstance(t, str) for t in texts))
        if not single and (isinstance(texts, (str, bytes, bytearray)) or not isinstance(texts, Sequence)):
            raise UserError(f"classify: give a str, an (a, b) pair of str, or a list of them, not {_kind(texts)}")
        items = [texts] if single else list(texts)  # type: ignore[list-item]
        examples = [tuple(x) if isinstance(x, list) else x for x in items]  # a pair as a list too
        for i, example in enumerate(examples):
            pair = isinstance(example, tuple) and len(example) == 2 and all(isinstance(t, str) for t in example)
            if not (isinstance(example, str) or pair):
                raise UserError(f"classify: item {i} is {_kind(example)}; give a str or an (a, b) pair of str")
        keep = [i for i, x in enumerate(examples) if not (isinstance(x, str) and not x.strip())]
        labels = self.labels
        out: list[Any] = [None] * len(examples)
        if keep:
            mean = self.loaded.classify([examples[i] for i in keep], batch_size)  # [kept, labels]
            for row, i in enumerate(keep):
                values = mean[row].tolist()
                out[i] = (dict(zip(labels, values, strict=True)) if probs
                          else labels[max(range(len(values)), key=values.__getitem__)])
        return out[0] if single else out


def load(path_or_paths: str | Path | Sequence[str | Path], device: str | torch.device = "cpu",
         precision: str = "fp32", ensemble_mean: str = "prob", **decode: Any) -> Model:
    """Load a checkpoint, a `convert export` directory or a `convert ct2` directory; several paths form an
    ensemble (translation: the mean of the members' per-step distributions, `ensemble_mean` "prob" or
    "log-prob"; classification: the mean of their probabilities). `device`: "cpu", "cuda", "cuda:N" or
    "auto"; `precision`: "fp32", "int8", "bf16" or "fp16" as `translate --precision`; `decode`: fields of
    the decode config to replace for every call (beam=4, lenpen=0.6, ...)."""
    paths = _paths(path_or_paths)
    if ensemble_mean not in ("prob", "log-prob"):
        raise UserError(f"ensemble_mean {ensemble_mean!r}: choose 'prob' or 'log-prob'")
    check_device("load", device)
    with user_errors(LOAD_RENAMES):
        resolved = resolve_device(str(device))  # a torch.device is checked as its name is
    with user_errors(LOAD_RENAMES):
        fields = _decode_fields(decode)
        if not isinstance(precision, str):
            raise UserError(f"precision: give a str (\"fp32\", \"int8\", \"bf16\", \"fp16\"), not {_kind(precision)}")
        return Model(LoadedModel.load(paths, resolved, precision, ensemble_mean=ensemble_mean, decode=fields))


def _paths(path_or_paths: Any) -> list[str]:
    """The checkpoint paths `load` was given (one path, or a list for an ensemble); UserError for anything else."""
    def is_path(value: Any) -> bool:
        return isinstance(value, (str, os.PathLike))

    if is_path(path_or_paths):
        return [os.fspath(path_or_paths)]
    if isinstance(path_or_paths, Sequence) and not isinstance(path_or_paths, (bytes, bytearray)):
        if not path_or_paths:
            raise UserError("load: give a checkpoint path (or several for an ensemble)")
        for i, path in enumerate(path_or_paths):
            if not is_path(path):
                raise UserError(f"load: path {i} is {_kind(path)}; give a str or Path per checkpoint")
        return [os.fspath(path) for path in path_or_paths]
    raise UserError(f"load: give a checkpoint path (a str or Path, or a list of them for an ensemble), not "
                    f"{_kind(path_or_paths)}")
