"""The papers' analyses of a finished reproduction run, made in the same call as its training.

A GPU machine keeps nothing after its call, checkpoints included, so `bench/reproduce.py` analyses each
run's averaged checkpoint as soon as it is scored. The numbers go into the results JSON, and
`bench/reproduce_report.py` draws the figures from them on a CPU afterwards.

Which analysis each system gets (the paper that makes the claim, docs/papers.md):
  pruning     `analyze heads`: head importance on valid, then the pruning curve (BLEU on the first
              --analysis-sentences of test as the least important heads are masked, 10% at a time), and with
              `dominant` the BLEU change when each head alone is masked (one translation per head), whose
              largest drop per attention is its dominant head's. Scheduled DropHead claims a flatter curve and a smaller drop (its Tables 3
              and 4) than the standard model's.
  importance  `analyze heads --no-curve`: head importance and entropy only. For MAT the report sums it per
              branch (head h belongs to branch h // M).
  lengths     `analyze lengths`: BLEU by source length on test (MUSE Fig. 3: standard vs MUSE vs MUSE-simple).
  gates       `analyze gates`: MUSE's kernel-gate ratio, the Weighted Transformer's final kappa/alpha (the
              trajectories come from the run's metrics.jsonl).
  replacement `analyze gates --data --per-module`: test BLEU of a Weighted Transformer with its learned
              kappa/alpha, with 1/M each and with REPLACEMENT_DRAWS random points of the simplex (its Table 3: the
              learned weights beat both), and with 1/M in one module at a time.
  diversity   `analyze diversity`: MUTE's unit diversity (Att Pos., Att Sub., FFN Sub.) and unit weights on valid.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multibranch.json_file import write_json

ANALYSES: dict[str, tuple[str, ...]] = {
    "standard": ("pruning", "lengths"),
    "drophead": ("pruning",),
    "mat2": ("importance",), "mat3": ("importance",), "mat2-narrow": ("importance",),
    "mat3-narrow": ("importance",), "mat3-narrow-drophead": ("pruning",),
    "weighted": ("gates", "replacement"),
    "mute": ("diversity",), "mute-bias": ("diversity",), "mute-bias-seq": ("diversity",),
    "muse": ("gates", "lengths"), "muse-simple": ("lengths",),
    # the CPU recipe's own systems
    # mat gets the pruning curve too: the baseline of mat-drophead's (8 heads per attention, drop-branch on)
    "mat": ("pruning",), "mat-proximal": ("importance",), "mat-drophead": ("pruning",),
    "drophead-constant": ("pruning",), "weighted-shared": ("gates", "replacement"),
}
REPORT_FILES = {"pruning": "heads.json", "importance": "heads.json", "lengths": "lengths.json",
                "gates": "gates.json", "replacement": "gates.json", "diversity": "diversity.json"}
LENGTH_BUCKETS = "8,12,16,20,25"  # inclusive upper edges in subword tokens: Multi30k sentences are short
REPLACEMENT_DRAWS = 3  # random kappa/alpha per run (the paper gives one number for "random")


@dataclass(frozen=True)
class AnalysisSettings:
    device: str = "cpu"
    examples: int | None = None  # valid examples for importance and diversity (None: all of val)
    score_sentences: int = 500  # test sentences translated per pruning-curve point
    step: float = 0.1  # pruning-curve step, as a fraction of all heads
    dominant: bool = False  # the pruning analysis also masks each attention's dominant head alone
    length_buckets: str = LENGTH_BUCKETS


def analyses_for(system: str) -> tuple[str, ...]:
    return ANALYSES.get(system, ())


def command(name: str, ckpt: Path, data: Path, out: Path, settings: AnalysisSettings) -> list[str]:
    """The `multibranch analyze ...` arguments of analysis `name` on `ckpt`, reported into `out`."""
    device = ["--device", settings.device]
    examples = ["--max-examples", str(settings.examples)] if settings.examples else []
    if name in ("pruning", "importance"):
        curve = (["--bleu-split", "test", "--bleu-max-sentences", str(settings.score_sentences),
                  "--step", f"{settings.step:g}"] if name == "pruning" else ["--no-curve"])
        return ["analyze", "heads", "--ckpt", str(ckpt), "--data", str(data), "--split", "valid", *examples, *curve,
                *([] if settings.dominant and name == "pruning" else ["--no-dominant"]), "--no-progress", *device,
                "--out", str(out), "--force"]
    if name == "lengths":
        return ["analyze", "lengths", "--ckpt", str(ckpt), "--data", str(data), "--split", "test",
                "--buckets", settings.length_buckets, *device, "--out", str(out), "--force"]
    if name == "gates":
        return ["analyze", "gates", "--ckpt", str(ckpt), "--out", str(out), "--force"]
    if name == "replacement":
        return ["analyze", "gates", "--ckpt", str(ckpt), "--data", str(data), "--split", "test", "--random-draws",
                str(REPLACEMENT_DRAWS), "--per-module", *device, "--out", str(out), "--force"]
    if name == "diversity":
        return ["analyze", "diversity", "--ckpt", str(ckpt), "--data", str(data), "--split", "valid", *examples,
                *device, "--out", str(out), "--force"]
    raise ValueError(f"unknown analysis {name!r}")


def condense(name: str, report: dict[str, Any]) -> dict[str, Any]:
    """What the results JSON keeps of a report: everything but paths and per-point head lists."""
    if name == "replacement":  # the gates analysis keeps the weights themselves
        return {k: v for k, v in report["replacement"].items() if k != "data"}
    kept = {k: v for k, v in report.items() if k not in ("checkpoint", "data")}
    if name in ("pruning", "importance") and kept.get("pruning_curve"):
        kept["pruning_curve"] = {**kept["pruning_curve"], "points": [
            {k: v for k, v in point.items() if k != "masked"} for point in kept["pruning_curve"]["points"]]}
    if name == "lengths":
        kept["models"] = [{k: v for k, v in model.items() if k != "checkpoint"} for model in kept["models"]]
    return kept


def run_analyses(system: str, ckpt: Path, data: Path, folder: Path, settings: AnalysisSettings,
                 cli: Callable[[list[str], Path], Any]) -> dict[str, Any]:
    """Run `system`'s analyses on `ckpt` into FOLDER/analysis/NAME/ and return {name: numbers or {"error"}}.

    An analysis already in FOLDER/analyses.json is not redone; one that fails is recorded with its error and
    does not stop the others (a run's scores never depend on its analyses)."""
    path = folder / "analyses.json"
    results: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    for name in analyses_for(system):
        if name in results and "error" not in results[name]:
            continue
        out = folder / "analysis" / name
        began = time.monotonic()
        try:
            cli(command(name, ckpt, data, out, settings), folder / "harness.log")
            report = json.loads((out / REPORT_FILES[name]).read_text(encoding="utf-8"))
            results[name] = {**condense(name, report), "wall_s": time.monotonic() - began}
        except Exception as error:  # recorded beside the scores; the run stays done
            results[name] = {"error": str(error).splitlines()[0]}
        write_json(path, results)  # after each analysis: a call killed later keeps what it finished
    return results
