"""`LoadedModel`: a trained model ready to use, whatever it was saved as.

One checkpoint (an average written by `average` is one), a `convert export` directory, an ensemble of them, or a
`convert ct2` directory, loaded once with its task, tokenizer and decode settings, on a device in a precision.
Everything that depends on what was loaded lives here: the dispatch between those kinds, the device and precision
checks, the ensemble's checks, and every refusal (what a CTranslate2 directory or an ensemble cannot do).
`translate`, `classify`, `serve`, `analyze` and the Python API take a LoadedModel and add only their own input and
output.

    model = LoadedModel.load(["run/best.pt"], "cpu", tasks=TRANSLATION_TASKS)
    model.translator(beam=4).translate(["ein Haus"])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multibranch.checkpoint.tokenizer_state import missing_tokenizer
from multibranch.device import resolve_device
from multibranch.errors import CheckpointError, ConfigError, UserError
from multibranch.experiment import ExperimentConfig
from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference.ensemble import Ensemble
from multibranch.inference.precision import check_precision, for_decoding
from multibranch.loading.checkpoint import LoadedCheckpoint, load_model
from multibranch.tasks.classification.inference import (
    Example,
    check_examples,
    classify_lines,
    is_pair_model,
    label_names,
)
from multibranch.tasks.translation.ct2 import CT2_MAPPING, Ct2Translator, is_ct2_directory
from multibranch.tasks.translation.translator import Translator

__all__ = ["ALL_TASKS", "CT2_REFUSED", "TRANSLATION_TASKS", "LoadedModel", "UnsupportedError", "check_ct2_options",
           "check_paths", "typed_option"]

TRANSLATION_TASKS = ("translation", "code")
ALL_TASKS = ("translation", "code", "classification")
# what a model of each task does with raw text (the message for a checkpoint that kept no tokenizer)
USES = {"translation": "translate", "code": "translate", "classification": "label"}

# What a `convert ct2` directory cannot honour: option -> (the values it can, why not the others). The options
# are named as `translate` names its arguments; `typed_option` spells one for the command line.
CT2_REFUSED: dict[str, tuple[tuple[object, ...], str]] = {
    "ensemble_mean": ((None,), "a CTranslate2 directory is one model, not an ensemble"),
    "precision": (("fp32",), "a CTranslate2 directory decodes with the quantization it was converted with "
                             "(`multibranch convert ct2 --quantization int8`)"),
    "lenpen_kind": ((None, "fairseq"), "CTranslate2 only has the score / len^alpha (fairseq) length penalty"),
    "code_format": (("escaped",), "a CTranslate2 directory holds a translation model (`convert ct2` refuses "
                                  "code-generation models)"),
    "sampling": ((False,), CT2_MAPPING["sampling"].note),
    "prefix": ((None,), "target prefixes are not mapped onto CTranslate2's options yet; decode the checkpoint instead"),
    "print_alignment": ((False,), "a CTranslate2 directory gives no attention weights to align with"),
    "attention": ((False,), "a CTranslate2 directory gives no attention weights; load the checkpoint or its "
                            "`convert export` directory"),
}


class UnsupportedError(UserError):
    """What this kind of loaded model cannot do: attention maps of an ensemble or a CTranslate2 directory,
    prefixes or alignments with a CTranslate2 directory."""


def typed_option(name: str, value: object) -> str:
    """An option as a user types it on the command line: `--sampling` for a flag, `--precision int8` for a value."""
    option = f"--{name.replace('_', '-')}"
    return option if isinstance(value, bool) else f"{option} {value}"


def check_ct2_options(directory: str, options: Mapping[str, object],
                      spell: Callable[[str, object], str] = typed_option) -> None:
    """UnsupportedError for the first of `options` (CT2_REFUSED's names -> the values asked for) that the CTranslate2
    directory cannot honour; `spell` names the option in the message (the command line's spelling by default)."""
    for name, (allowed, why) in CT2_REFUSED.items():
        if name in options and options[name] not in allowed:
            raise UnsupportedError(f"{spell(name, options[name])}: not with a CTranslate2 directory ({directory}): {why}")


def check_paths(paths: Sequence[str]) -> bool:
    """Whether the paths are one CTranslate2 directory; UserError for one among several (an ensemble takes
    checkpoints or export directories). Nothing is read but the directory's settings file name."""
    ct2 = [path for path in paths if is_ct2_directory(path)]
    if ct2 and len(paths) > 1:
        raise UserError(f"{ct2[0]} is a CTranslate2 directory, which cannot be an ensemble member; an ensemble "
                        "takes checkpoints or `convert export` directories")
    return bool(ct2)


def _known_decode_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` when each names a DecodeConfig field; ConfigError naming the first that does not."""
    known = [f.name for f in dataclasses.fields(DecodeConfig)]
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise ConfigError(f"decode.{unknown[0]}: unknown key for DecodeConfig; allowed: {', '.join(known)}")
    return fields


def _same_tokenizer(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two checkpoint tokenizer entries hold the same tokenizer (equal keys and tensors)."""
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


class LoadedModel:
    """A model loaded for use (made by `LoadedModel.load`).

    `kind` is "checkpoint" (one checkpoint or export directory), "ensemble" or "ct2"; `task` "translation",
    "code" or "classification"; `config` the ExperimentConfig it was trained with (a CTranslate2 directory: None);
    `module` the nn.Module that decodes or labels (an ensemble of translation models: one `Ensemble` module; a
    classifier ensemble: its first member; CTranslate2: None); `tokenizer` what turns text into ids and back;
    `parameters_count` the number of weights as trained (all members together; CTranslate2: None).
    """

    def __init__(self, paths: list[str], device: torch.device, precision: str, task: str,
                 config: ExperimentConfig | None, tokenizer: Any, module: nn.Module | None,
                 members: list[LoadedCheckpoint], decode: dict[str, Any], parameters_count: int | None):
        self.paths, self.device, self.precision, self.task = paths, device, precision, task
        self.config, self.tokenizer, self.module = config, tokenizer, module
        self.members = members  # classifiers: every member, loaded
        self.decode_overrides = decode  # the decode fields given at load, over the config's (or the directory's)
        self.parameters_count = parameters_count
        self.name = " ".join(paths)
        self._ct2: Ct2Translator | None = None  # a CTranslate2 directory's translator with the load's settings
        self._ct2_threads = 0

    # ---- loading -----------------------------------------------------------------------------------

    @classmethod
    def load(cls, paths: str | Path | Sequence[str | Path], device: torch.device | str = "cpu",
             precision: str = "fp32", *, tasks: tuple[str, ...] = ALL_TASKS, ensemble_mean: str = "prob",
             decode: Mapping[str, Any] | None = None, threads: int = 0, ct2: bool = True) -> LoadedModel:
        """Load one path or several (an ensemble: the mean of the members' per-step distributions, `ensemble_mean`
        "prob" or "log-prob"; classifiers: the mean of their probabilities).

        `tasks`: the tasks the caller can use (the first names the kind in the message for another); `decode`:
        decode config fields replacing the model's for every use (translation only); `threads`: a CTranslate2
        directory's CPU threads (0: CTranslate2's choice). CheckpointError for files that do not fit together or
        lack what the task needs; UserError for a device, precision or option the model cannot use.
        """
        paths = [str(paths)] if isinstance(paths, (str, Path)) else [str(p) for p in paths]
        resolved = device if isinstance(device, torch.device) else resolve_device(device)
        decode = dict(decode or {})
        if check_paths(paths) and ct2:
            check_ct2_options(paths[0], {"precision": precision}, lambda name, value: f"precision {value!r}")
            if not set(tasks) & set(TRANSLATION_TASKS):
                raise CheckpointError(f"{paths[0]} is a CTranslate2 directory of a translation model, not a "
                                      f"{tasks[0]} model")
            translator = Ct2Translator(paths[0], resolved, threads=threads, **_known_decode_fields(decode))
            loaded = cls(paths, resolved, precision, "translation", None, translator.tokenizer, None, [], decode, None)
            loaded._ct2, loaded._ct2_threads = translator, threads
            return loaded
        check_precision(precision, resolved)
        first = load_model(paths[0], resolved, task=tasks)
        # every member is of the first one's task; an error names the first member that is not
        members = [first] + [load_model(path, resolved, task=(first.config.task,)) for path in paths[1:]]
        return cls.from_checkpoints(paths, members, resolved, precision, ensemble_mean=ensemble_mean, decode=decode)

    @classmethod
    def from_checkpoints(cls, paths: list[str], members: list[LoadedCheckpoint], device: torch.device,
                         precision: str = "fp32", *, ensemble_mean: str = "prob",
                         decode: Mapping[str, Any] | None = None) -> LoadedModel:
        """The LoadedModel of rebuilt checkpoints (`paths` name them in messages), checked as `load` checks them;
        their models become the decoding copies of `precision` in place."""
        first, task, decode = members[0], members[0].config.task, dict(decode or {})
        for path, member in zip(paths, members, strict=True):
            if member.tokenizer is None:
                raise missing_tokenizer(path, f"it needs to {USES.get(task, 'read')} raw text")
        parameters = sum(p.numel() for member in members for p in member.model.parameters())  # as trained
        for member in members:
            member.model = for_decoding(member.model, precision, in_place=True)  # loaded only to use: no copy
        if task == "classification":
            if decode:
                raise UserError(f"{paths[0]} is a classifier: decode settings ({', '.join(sorted(decode))}) apply to "
                                "translation models (a classifier decodes nothing)")
            cls._check_classifiers(paths, members)
            return cls(paths, device, precision, task, first.config, first.tokenizer, first.model, members, {},
                       parameters)
        for path, member in zip(paths[1:], members[1:], strict=True):
            if not _same_tokenizer(member.payload.get("tokenizer"), first.payload.get("tokenizer")):
                raise CheckpointError(f"ensemble members must share one vocabulary: {path} has a different tokenizer "
                                      f"than {paths[0]}")
        module = first.model if len(members) == 1 else Ensemble([m.model for m in members], mean=ensemble_mean,  # type: ignore[arg-type]
                                                                 names=paths)
        loaded = cls(paths, device, precision, task, first.config, first.tokenizer, module, [], decode, parameters)
        loaded.decode_config()  # the decode overrides checked now, not at the first use
        return loaded

    @staticmethod
    def _check_classifiers(paths: list[str], members: list[LoadedCheckpoint]) -> None:
        """CheckpointError unless every classifier has the first one's labels and reads what it reads."""
        first = members[0]
        labels = label_names(first.config)
        for path, member in zip(paths[1:], members[1:], strict=True):
            if label_names(member.config) != labels:
                raise CheckpointError(f"{path} has the labels {label_names(member.config)}, {paths[0]} has {labels}: "
                                      "an ensemble needs the same labels in the same order")
            if is_pair_model(member.model) != is_pair_model(first.model):
                raise CheckpointError(f"{path} and {paths[0]}: one classifies sentence pairs, the other single texts")

    def __repr__(self) -> str:
        return f"LoadedModel({self.name!r}, kind={self.kind!r}, task={self.task!r}, device={str(self.device)!r})"

    # ---- what it is --------------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        """"ct2", "ensemble" or "checkpoint"."""
        if self.config is None:
            return "ct2"
        return "ensemble" if len(self.paths) > 1 else "checkpoint"

    @property
    def labels(self) -> list[str]:
        """A classifier's label names, in the order of its probabilities."""
        assert self.task == "classification" and self.config is not None
        return label_names(self.config)

    @property
    def pairs(self) -> bool:
        """Whether a classifier reads sentence pairs (a, b)."""
        return self.task == "classification" and is_pair_model(self.members[0].model)

    def check_supported(self, options: Mapping[str, object],
                        spell: Callable[[str, object], str] = typed_option) -> None:
        """UnsupportedError for the first of `options` (CT2_REFUSED's names -> the values asked for) this model
        cannot honour: a CTranslate2 directory's refusals, and attention maps of an ensemble."""
        if self.kind == "ct2":
            check_ct2_options(self.paths[0], options, spell)
        if self.kind == "ensemble" and options.get("attention"):
            raise UnsupportedError(f"{spell('attention', True)}: maps are drawn from one model; this is an ensemble "
                                   f"of {len(self.paths)} ({self.name}): load one checkpoint to draw them")

    # ---- translation -------------------------------------------------------------------------------

    def decode_config(self, **fields: Any) -> DecodeConfig:
        """The decode config of a use: the model's (or the CTranslate2 directory's), the load's overrides, then
        `fields`; ConfigError for a value out of its range."""
        base = self.config.decode if self.config is not None else None
        if base is None:
            raise UserError(f"{self.name}: a CTranslate2 directory's decode config comes with its translator")
        cfg = dataclasses.replace(base, **_known_decode_fields({**self.decode_overrides, **fields}))
        cfg.validate()
        return cfg

    def translator(self, alignment_layer: int | None = None, threads: int = 0, **fields: Any) -> Translator | Ct2Translator:
        """A translator with the decode config of `fields` over the load's (`decode_config`), aligning with decoder
        layer `alignment_layer` (None: no alignments). A CTranslate2 directory gives a Ct2Translator (same
        interface) with `threads` CPU threads (0: CTranslate2's choice)."""
        if self.task not in TRANSLATION_TASKS:
            raise CheckpointError(f"{self.name} is a {self.task} model, not a translation model")
        if self.kind == "ct2":
            self.check_supported({"print_alignment": alignment_layer is not None})
            if self._ct2 is not None and threads == self._ct2_threads:
                return self._ct2.with_decode(**_known_decode_fields(fields)) if fields else self._ct2
            return Ct2Translator(self.paths[0], self.device, threads=threads,
                                 **_known_decode_fields({**self.decode_overrides, **fields}))
        assert self.module is not None
        cfg = self.decode_config(**fields)
        try:
            return Translator(self.module, self.tokenizer, cfg, self.device, alignment_layer=alignment_layer)
        except ValueError as err:  # an alignment layer the decoder lacks
            raise UserError(f"--alignment-layer: {err}") from None

    # ---- classification ----------------------------------------------------------------------------

    def classify(self, examples: list[Example], batch_size: int = 64) -> torch.Tensor:
        """[len(examples), labels] the mean of the members' label probabilities (each reads the text with its own
        tokenizer); DataError when single texts go to a pair classifier or pairs to a single-text one."""
        if self.task != "classification":
            raise CheckpointError(f"{self.name} is a {self.task} model, not a classifier")
        total = None
        for member in self.members:
            check_examples(member.model, examples, self.name)
            probs = classify_lines(member.model, member.tokenizer, examples, self.device, batch_size)  # [n, C]
            total = probs if total is None else total + probs
        assert total is not None
        return total / len(self.members)
