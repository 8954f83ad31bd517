"""Dominant heads (docs/papers.md#drophead-pruning-curve-and-dominant-heads): for every module and head, the
score change when only that head is masked; the module's dominant head is the one with the largest drop,
and the table averages that (negative) change over layers, per attention type.

`evaluate` is a function of no arguments returning the score of the model as it is (with the gates
installed around the call), e.g. `pruning.scoring.BleuScorer`.
"""

from __future__ import annotations

from collections.abc import Callable

from multibranch.analysis.heads import ROLES, AttentionSite, gates_installed, mask_gates


def dominant_heads(sites: list[AttentionSite], evaluate: Callable[[], float], baseline: float | None = None) -> dict:
    """Score change when each single head is masked; the dominant (largest-drop) head per module and
    the mean of its change over layers per attention type.

    Returns {"baseline", "modules": [{"name", "role", "layer", "deltas": [...], "dominant_head",
    "dominant_delta"}], "mean_dominant_delta": {role: mean}}.
    """
    if baseline is None:
        with gates_installed(sites, {}):
            baseline = evaluate()
    modules = []
    for site in sites:
        deltas = []
        for head in range(site.heads):
            with gates_installed(sites, mask_gates(sites, [(site.name, head)])):
                deltas.append(evaluate() - baseline)
        worst = min(range(site.heads), key=lambda h: deltas[h])
        modules.append({"name": site.name, "role": site.role, "layer": site.layer, "deltas": deltas,
                        "dominant_head": worst, "dominant_delta": deltas[worst]})
    by_role = {}
    for role in ROLES:
        values = [m["dominant_delta"] for m in modules if m["role"] == role]
        if values:
            by_role[role] = sum(values) / len(values)
    return {"baseline": baseline, "modules": modules, "mean_dominant_delta": by_role}
