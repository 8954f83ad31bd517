"""multibranch: multi-branch Transformers (MAT, Weighted Transformer, MUTE, MUSE, Scheduled DropHead).

The Python API (docs/python-api.md):

    import multibranch
    model = multibranch.load("run/best.pt")
    model.translate("ein Haus")
    multibranch.fit("mat-tiny", data="data", out="run", max_steps=20)
    from multibranch.layers import DropHead

The names below are imported on first use: `import multibranch` (and so the CLI, which starts here) stays
as fast as importing this file, and torch is loaded only when the API is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "load": "multibranch.api", "Model": "multibranch.api", "ForcedScore": "multibranch.api",
    "fit": "multibranch.api", "build": "multibranch.api", "TrainResult": "multibranch.api",
    "ValidationEvent": "multibranch.api", "CheckpointEvent": "multibranch.api", "evaluate_translation": "multibranch.api",
    "average": "multibranch.api", "export": "multibranch.api", "prune": "multibranch.api",
    "Evaluation": "multibranch.api", "AverageResult": "multibranch.api", "ExportResult": "multibranch.api",
    "PruneResult": "multibranch.api", "analyze": "multibranch.api", "ReportFolder": "multibranch.api", "presets": "multibranch.api", "prepare": "multibranch.api",
    "WrongTaskError": "multibranch.api", "MissingFileError": "multibranch.api", "ExistingFileError": "multibranch.api",
    "UnsupportedError": "multibranch.api", "AlignedTranslation": "multibranch.api", "AttentionMaps": "multibranch.api",
    "ExperimentConfig": "multibranch.experiment",
    "UserError": "multibranch.errors", "ConfigError": "multibranch.errors", "DataError": "multibranch.errors",
    "CheckpointError": "multibranch.errors",
}
_SUBMODULES = ("layers",)

__all__ = ["__version__", *sorted(_EXPORTS), *_SUBMODULES]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module when first asked for (then kept in this module)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
