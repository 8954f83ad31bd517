"""The Python API: what the CLI does, for notebooks and scripts, returning Python values.

    import multibranch
    model = multibranch.load("run/best.pt")             # a checkpoint, an export or CTranslate2 directory
    model.translate("ein Haus")                           # -> "a house"
    model.translate(["a", "b"], beam=4, nbest=2)          # -> [["..", ".."], ["..", ".."]]
    model.score(["ein Haus"], ["a house"])                # forced decoding, as translate --score-reference
    model.translate("ein Haus", prefixes="a", alignment=True)   # translate --prefix / --print-alignment
    model.attention("ein Haus").map("cross", layer=-1, head=0)  # serve's POST /attention: [T, S]
    multibranch.prepare("raw/train", "data", src="de", tgt="en", valid="raw/valid")
    multibranch.fit("mat-tiny", data="data", out="run", max_steps=20)

A thin layer over the library: loading is `loading.model.LoadedModel` (what the commands load), decoding the
`Translator` (or `Ct2Translator`; prefixes and alignments as `translate --prefix/--print-alignment`),
attention maps `serve.attention` (serve's POST /attention), labelling `tasks.classification.inference`,
training `tasks.train` with the config `experiment.train_config` builds. Whatever a user can get wrong raises a `UserError` subclass
with the CLI's message. Training is `fit`, not `train`: `multibranch.train` is the trainer's package.
docs/python-api.md shows it in use.
"""

from multibranch.api.data import prepare
from multibranch.api.model import (
           ExistingFileError,
           ForcedScore,
           MissingFileError,
           Model,
           UnsupportedError,
           WrongTaskError,
           load,
)
from multibranch.api.results import AlignedTranslation, AttentionMaps
from multibranch.api.tools import (
           AverageResult,
           Evaluation,
           ExportResult,
           PruneResult,
           ReportFolder,
           analyze,
           average,
           evaluate_translation,
           export,
           prune,
)
from multibranch.api.training import CheckpointEvent, TrainResult, ValidationEvent, build, fit, presets

__all__ = ["AlignedTranslation", "AttentionMaps", "AverageResult", "CheckpointEvent", "Evaluation",
           "ExistingFileError", "ExportResult", "ForcedScore", "MissingFileError", "Model", "PruneResult", "ReportFolder",
           "TrainResult", "UnsupportedError", "ValidationEvent", "WrongTaskError", "analyze", "average", "build",
           "evaluate_translation", "export", "fit", "load", "prepare", "presets", "prune"]
