"""Parameter counts of a model by component (`multibranch info`)."""

from __future__ import annotations

from torch import nn

from multibranch.models.classifier import Classifier


def parameter_table(model: nn.Module) -> list[tuple[str, int]]:
    """(component/part, count) rows: embeddings, then each encoder/decoder sublayer kind summed over layers,
    then (a classifier) its head's dense and label layers. A tied parameter is counted once."""
    head = ("dense", "out") if isinstance(model, Classifier) else ()
    seen: set[int] = set()
    rows: dict[str, int] = {}
    for name, param in model.named_parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        parts = name.split(".")
        if ".embed." in name or parts[0].startswith("output_"):
            key = "embeddings" + (" (positions)" if "positions" in name else "")
        elif parts[0] in head:
            key = f"head / {parts[0]}"
        elif len(parts) > 3 and parts[1] == "layers":
            key = f"{parts[0]} / {parts[3].removesuffix('_residual') + ' norm' if parts[3].endswith('_residual') else parts[3]}"
        else:
            key = f"{parts[0]} / {parts[1]}"
        rows[key] = rows.get(key, 0) + param.numel()
    return list(rows.items())
