"""The Python API: what the CLI does, for notebooks and scripts, returning Python values.

    import multibranch
    model = multibranch.load("run/best.pt")             # a checkpoint, an export or CTranslate2 directory
    model.translate("ein Haus")                           # -> "a house"
    model.translate(["a", "b"], beam=4, nbest=2)          # -> [["..", ".."], ["..", ".."]]
    model.score(["ein Haus"], ["a house"])                # forced decoding, as translate --score-reference
    multibranch.prepare("raw/train", "data", src="de", tgt="en", valid="raw/valid")
    multibranch.fit("mat-tiny", data="data", out="run", max_steps=20)

A thin layer over the library: loading is `tasks.translation.loading` / `tasks.loading`, decoding the
`Translator` (or `Ct2Translator`), labelling `tasks.classification.inference`, training `tasks.train` with
the config `experiment.train_config` builds. Whatever a user can get wrong raises a `UserError` subclass
with the CLI's message. Training is `fit`, not `train`: `multibranch.train` is the trainer's package.
docs/python-api.md shows it in use.
"""

from multibranch.api.data import prepare
from multibranch.api.model import (
           ExistingFileError,
           ForcedScore,
           MissingFileError,
           Model,
           WrongTaskError,
           load,
)
from multibranch.api.training import TrainResult, fit, presets

__all__ = ["ExistingFileError", "ForcedScore", "MissingFileError", "Model", "TrainResult", "WrongTaskError", "fit",
           "load", "prepare", "presets"]
