"""`evaluate_translation`, `average`, `export` and `prune`: `evaluate`, `average`, `convert` and `prune` for Python callers, each a call into
the library function the command calls, returning a typed result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multibranch.analysis.diversity import analyze_diversity
from multibranch.analysis.gate_report import analyze_gates
from multibranch.analysis.heads import HeadId
from multibranch.analysis.lengths import LengthOptions, analyze_lengths
from multibranch.api.checks import check_list, check_paths
from multibranch.api.model import user_errors
from multibranch.checkpoint.format import load_checkpoint
from multibranch.convert.average import AverageResult, average_to_file
from multibranch.convert.ct2 import export_ct2
from multibranch.convert.export import export_release
from multibranch.convert.hf_marian_export import export_marian
from multibranch.errors import UserError
from multibranch.evaluate.metrics import evaluate_translation as score_lines
from multibranch.figures.report import ReportFolder
from multibranch.pruning.head_report import HeadAnalysisOptions, analyze_heads
from multibranch.pruning.run import PruneOptions, prune_checkpoint, report_path_of

__all__ = ["ReportFolder", "analyze", "AverageResult", "Evaluation", "ExportResult", "PruneResult", "average", "evaluate_translation", "export", "prune"]

FORCE = {"--force": "force=True"}


@dataclass(frozen=True)
class Evaluation:
    """Corpus scores of hypotheses against references, as `multibranch evaluate` prints them: `scores` metric ->
    value (bleu, chrf, ter), `signatures` metric -> sacreBLEU's signature, `sentences` per-line BLEU and chrF (when
    asked), `comparison` the paired bootstrap of a second system (when given), `report` the whole JSON report."""

    scores: dict[str, float]
    signatures: dict[str, str]
    sentences: dict[str, list[float]] | None
    comparison: dict[str, Any] | None
    report: dict[str, Any] = field(repr=False)


def evaluate_translation(hypotheses: Sequence[str], references: Sequence[str] | Mapping[str, Sequence[str]], *,
             metrics: Sequence[str] = ("bleu", "chrf"), tokenize: str = "13a", lowercase: bool = False,
             sentence_level: bool = False, compare: Sequence[str] | None = None,
             bootstrap_samples: int = 1000) -> Evaluation:
    """Score `hypotheses` (one per line) against one reference list or several (a mapping name -> lines) with
    sacreBLEU, as `multibranch evaluate` does; `compare`: a second system's lines, tested against `hypotheses` (the
    baseline) by paired bootstrap. DataError when a line count differs."""
    metrics = [metrics] if isinstance(metrics, str) else metrics  # one metric by its name
    for name, value in (("hypotheses", hypotheses), ("compare", compare)):
        if (value is None and name == "hypotheses") or (value is not None and (
                isinstance(value, (str, bytes)) or not all(isinstance(x, str) for x in value))):
            raise UserError(f"evaluate: {name} must be a list of str (one per line)")
    if references is None:
        raise UserError("evaluate: references must be a list of str (one per line) or a mapping name -> lines")
    refs = dict(references) if isinstance(references, Mapping) else {"references": references}
    for name, lines in refs.items():
        if isinstance(lines, (str, bytes)) or not all(isinstance(x, str) for x in lines):
            raise UserError(f"evaluate: references {name!r} must be a list of str (one per line)")
    report = score_lines(list(hypotheses), {name: list(lines) for name, lines in refs.items()},
                                  hyp_name="hypotheses", metrics=metrics, tokenize=tokenize, lowercase=lowercase,
                                  sentence_level=sentence_level,
                                  compare=("compare", list(compare)) if compare is not None else None,
                                  bootstrap_samples=bootstrap_samples)
    scores = {name: report[name]["score"] for name in metrics if isinstance(report.get(name), dict)}
    signatures = {name: report[name]["signature"] for name in scores}
    return Evaluation(scores, signatures, report.get("sentences"), report.get("compare"), report)


def average(out: str | Path, checkpoints: Sequence[str | Path] | None = None, *, run: str | Path | None = None,
            last: int | None = None, best: int | None = None, upper_bound: int | None = None,
            force: bool = False) -> AverageResult:
    """Average `checkpoints`, or the `last` N / `best` N step checkpoints of the run directory `run`, into the
    weights-only checkpoint `out`, as `multibranch average` does; an AverageResult (path, sources)."""
    check_paths("average", out=out, run=run)
    check_list("average", "checkpoints", checkpoints, "checkpoint paths")
    with user_errors({**FORCE, "--ckpts CKPT": "checkpoints", "--run RUN": "run", "--last N": "last",
                      "--best N": "best", "--upper-bound": "upper_bound"}):
        return average_to_file(out, checkpoints=checkpoints, run=run, last=last, best=best, upper_bound=upper_bound,
                               force=force)


@dataclass(frozen=True)
class ExportResult:
    """An export written: its directory and the files in it."""

    directory: Path
    files: list[Path]


def export(ckpt: str | Path, out: str | Path, kind: str = "release", *, dtype: str = "fp32",
           quantization: str = "float32", force: bool = False) -> ExportResult:
    """Export a checkpoint as `multibranch convert` does: `kind` "release" (safetensors + config + tokenizer,
    weights in `dtype`), "ct2" (a CTranslate2 directory with `quantization`) or "marian" (a Hugging Face Marian
    folder). Never over the checkpoint itself; over an existing export of the same kind only with `force`."""
    if kind not in ("release", "ct2", "marian"):
        raise UserError(f"export: kind {kind!r}: choose 'release', 'ct2' or 'marian'")
    check_paths("export", ckpt=ckpt, out=out)
    if ckpt is None or out is None:
        raise UserError("export: give ckpt (a checkpoint) and out (the export directory)")
    with user_errors(FORCE):
        payload = load_checkpoint(ckpt)
        if kind == "release":
            files = export_release(payload, out, force=force, dtype=dtype, source=str(ckpt))
        elif kind == "ct2":
            export_ct2(payload, out, quantization=quantization, force=force, source=str(ckpt))
            files = []
        else:
            export_marian(payload, out, force=force, source=str(ckpt))
            files = []
    directory = Path(out)
    return ExportResult(directory, sorted(files) if files else sorted(p for p in directory.iterdir() if p.is_file()))


@dataclass(frozen=True)
class PruneResult:
    """A pruning written: the pruned checkpoint, its JSON report's path and the report (heads removed,
    parameters, speed and score before and after)."""

    checkpoint: Path
    report_path: Path
    report: dict[str, Any] = field(repr=False)

    @property
    def removed(self) -> list[HeadId]:
        """The heads removed: (attention name, head index) pairs."""
        return [(name, head) for name, head in self.report["removed"]]


def prune(ckpt: str | Path, out: str | Path, *, fraction: float | None = None, max_drop: float | None = None,
          heads: Sequence[HeadId] | None = None, data: str | Path | None = None, report: str | Path | None = None,
          force: bool = False, **options: Any) -> PruneResult:
    """Remove attention heads physically, as `multibranch prune` does: the `fraction` least important, as many as
    keep the score within `max_drop` points, or the listed `heads`; `data` (a prepared directory) ranks and scores
    them. `options`: the rest of PruneOptions (split, max_examples, score_split, max_sentences, beam, step, speed,
    speed_rounds, device, ...)."""
    check_paths("prune", ckpt=ckpt, out=out, data=data, report=report)
    if ckpt is None or out is None:
        raise UserError("prune: give ckpt (a checkpoint) and out (the pruned checkpoint)")
    check_list("prune", "heads", heads, "(attention name, head index) pairs")
    known = set(PruneOptions.__dataclass_fields__) - {"fraction", "max_drop", "heads", "data"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UserError(f"prune: unknown option {unknown[0]!r}; known: {', '.join(sorted(known))}")
    chosen = PruneOptions(fraction=fraction, max_drop=max_drop, heads=list(heads) if heads is not None else None,
                          data=data, **options)
    renames = {**FORCE, "--fraction": "fraction", "--max-drop": "max_drop", "--heads-json": "heads",
               "--data PREPARED_DIR": "data=", "--report": "report", "--out": "out", "--step": "step"}
    with user_errors(renames):
        chosen.validate()
        report_path = report_path_of(out, report)
        result = prune_checkpoint(ckpt, out, report_path, chosen, force=force)
    return PruneResult(Path(out), report_path, result)


ANALYSES = ("heads", "lengths", "gates", "diversity")


def analyze(kind: str, ckpt: str | Path | Sequence[str | Path], out: str | Path, *, data: str | Path | None = None,
            force: bool = False, **options: Any) -> ReportFolder:
    """One analysis of `multibranch analyze`, writing its report folder `out` (numbers as JSON, figures, index.md);
    the folder (`.path`, `.files`). `kind`: "heads" (importance, entropy, pruning curve, dominant heads; options of
    HeadAnalysisOptions), "lengths" (BLEU by source length of one or several checkpoints; `labels`, `split`,
    `max_sentences`, `edges`, `beam`, `device`), "gates" (MUSE kernel gates, kappa/alpha, MUTE unit weights;
    `ratio`) or "diversity" (MUTE units' output diversity; `split`, `max_examples`, `max_tokens`, `device`).
    Attention maps are `Model.attention`."""
    if kind not in ANALYSES:
        raise UserError(f"analyze: kind {kind!r}: choose one of {', '.join(map(repr, ANALYSES))}")
    check_paths("analyze", out=out, data=data)
    if out is None:
        raise UserError(f"analyze {kind}: give out (the report folder)")
    if not isinstance(ckpt, (str, Path)):
        check_list("analyze", "ckpt", ckpt, "checkpoint paths")
        check_paths("analyze", **{f"ckpt[{i}]": path for i, path in enumerate(ckpt)})
    paths = [str(ckpt)] if isinstance(ckpt, (str, Path)) else [str(p) for p in ckpt]
    if kind != "lengths" and len(paths) != 1:
        raise UserError(f"analyze {kind}: give one checkpoint ({len(paths)} given)")
    if kind != "gates" and data is None:
        raise UserError(f"analyze {kind}: give data= (a directory made by `multibranch prepare`)")
    with user_errors({**FORCE, "--step": "step"}):
        if kind == "heads":
            return analyze_heads(paths[0], data, out, _options(HeadAnalysisOptions, options), force=force)  # type: ignore[arg-type]
        if kind == "lengths":
            labels = options.pop("labels", None)
            return analyze_lengths(paths, labels, data, out, _options(LengthOptions, options), force=force)  # type: ignore[arg-type]
        if kind == "gates":
            unknown = sorted(set(options) - {"ratio"})
            if unknown:
                raise UserError(f"analyze gates: unknown option {unknown[0]!r}; known: ratio")
            try:
                return analyze_gates(paths[0], out, tuple(options.get("ratio", (3, 15))), force=force)  # type: ignore[arg-type]
            except ValueError as error:
                raise UserError(str(error)) from None
        known = ("split", "max_examples", "max_tokens", "device")
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise UserError(f"analyze diversity: unknown option {unknown[0]!r}; known: {', '.join(known)}")
        try:
            return analyze_diversity(paths[0], data, out, force=force, **options)  # type: ignore[arg-type]
        except ValueError as error:
            raise UserError(str(error)) from None


def _options(kind: type, options: dict[str, Any]) -> Any:
    """The options dataclass `kind` of keyword options; UserError naming an unknown one."""
    known = [f for f in kind.__dataclass_fields__]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UserError(f"analyze: unknown option {unknown[0]!r}; known: {', '.join(known)}")
    return kind(**options)
