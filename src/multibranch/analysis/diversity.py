"""MUTE unit diversity over a data split (MUTE eq. 21, docs/papers.md#mute-diversity) and the unit weights, as a report folder.

Per MUTE encoder layer and batch, `MuteEncoderLayer.diversity` (models/layers/mute.py) scores the three
variants (att_pos: head-averaged attention distributions; att_sub: attention outputs before the residual;
ffn_sub: unit outputs F_i) in eval mode, on the layer's real input; the analysis averages them over the
batches of the split, then over layers. It runs its own pass (models/layers/mute.py `encoder_diversity`),
so normal forwards are untouched.

diversity.json:
    {"checkpoint", "data", "split", "examples", "batches", "units": [I per MUTE layer],
     "layers": [{"layer", "att_pos", "att_sub", "ffn_sub"}], "mean": {"att_pos", "att_sub", "ffn_sub"},
     "unit_weights": [{"name", "side", "layer", "weights"}]}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from multibranch.analysis.batches import check_vocabulary, teacher_forced_batches
from multibranch.analysis.mixing import unit_weights
from multibranch.data.batching import Batch
from multibranch.figures import plots
from multibranch.figures.report import ReportFolder
from multibranch.loading.checkpoint import load_model
from multibranch.models.layers.mute import MuteEncoderLayer, encoder_diversity
from multibranch.tasks.translation.dataset import PreparedData

# the report's files beside index.md: in a folder of other files, ReportFolder.check refuses them up front
REPORT_FILES = ("diversity.json", "diversity.png", "unit_weights.png")

VARIANTS = ("att_pos", "att_sub", "ffn_sub")
TITLES = {"att_pos": "Att Pos.", "att_sub": "Att Sub.", "ffn_sub": "FFN Sub."}


class NotMuteError(ValueError):
    """The model has no MUTE encoder layer."""


def check_mute(model: nn.Module, what: str) -> None:
    """NotMuteError with the reason unless the encoder has at least one MUTE layer."""

    if not any(isinstance(layer, MuteEncoderLayer) for layer in getattr(model.encoder, "layers", [])):
        raise NotMuteError(f"{what} is not a MUTE model (no multi-unit encoder layer): unit diversity is defined only "
                         "for MUTE encoders")


@torch.no_grad()
def split_diversity(model: nn.Module, batches: list[Batch]) -> list[dict[str, float]]:
    """Per MUTE encoder layer: each variant's diversity averaged over `batches` (model in eval mode)."""

    if not batches:
        raise ValueError("no batches to score")
    was_training = model.training
    model.eval()
    try:
        per_batch = [encoder_diversity(model, batch.src) for batch in batches]  # [batches][layers]{variant}
    finally:
        model.train(was_training)
    indices = [i for i, layer in enumerate(model.encoder.layers) if isinstance(layer, MuteEncoderLayer)]
    return [{"layer": layer, **{v: sum(b[j][v] for b in per_batch) / len(per_batch) for v in VARIANTS}}
            for j, layer in enumerate(indices)]


def analyze_diversity(ckpt: str | Path, data_dir: str | Path, out: str | Path, split: str = "valid",
                      max_examples: int | None = None, max_tokens: int = 4096, device: str = "cpu",
                      force: bool = False) -> ReportFolder:
    """Score the split and write diversity.json, diversity.png, unit_weights.png and index.md."""

    ReportFolder.check(out, force, REPORT_FILES)
    loaded = load_model(ckpt, device)
    check_mute(loaded.model, str(ckpt))
    data = PreparedData.load(data_dir)
    check_vocabulary(data, loaded.config.model, str(ckpt))
    batches = teacher_forced_batches(data.split(split), loaded.config.model, max_tokens, max_examples, device)
    layers = split_diversity(loaded.model, batches)
    weights = unit_weights(loaded.model)
    report = {"checkpoint": str(ckpt), "data": str(data_dir), "split": split,
              "examples": int(sum(len(b) for b in batches)), "batches": len(batches),
              "units": [len(row["weights"]) for row in weights], "layers": layers,
              "mean": {v: sum(row[v] for row in layers) / len(layers) for v in VARIANTS},
              "unit_weights": weights}
    return write_report(report, out, force)


def write_report(report: dict[str, Any], out: str | Path, force: bool) -> ReportFolder:
    folder = ReportFolder.create(out, force, REPORT_FILES)
    folder.write_json("diversity.json", report)
    folder.write_png("diversity.png", plots.diversity_plot(report["layers"], TITLES))
    folder.write_png("unit_weights.png", plots.unit_weights_plot(report["unit_weights"]))
    lines = [f"# MUTE unit diversity of `{report['checkpoint']}`", "",
             f"Eq. 21 diversity exp(-mean cosine) over all I^2 unit pairs and non-pad positions, eval mode, "
             f"averaged over {report['batches']} batches ({report['examples']} examples) of split `{report['split']}`. "
             "Identical units give exp(-1) = 0.368. Numbers: [diversity.json](diversity.json).", "",
             "![diversity](diversity.png)", "", "| layer | " + " | ".join(TITLES.values()) + " |",
             "|---|" + "---:|" * len(VARIANTS)]
    lines += [f"| {row['layer']} | " + " | ".join(f"{row[v]:.3f}" for v in VARIANTS) + " |" for row in report["layers"]]
    lines += ["| mean | " + " | ".join(f"{report['mean'][v]:.3f}" for v in VARIANTS) + " |", "",
              "## Unit weights", "", "![unit weights](unit_weights.png)", ""]
    folder.write_text("index.md", "\n".join(lines))
    return folder
