"""`multibranch analyze heads`: importance, entropy, pruning curve and dominant heads of a checkpoint,
written as one report folder (heads.json, PNG plots, index.md).

heads.json:
    {"checkpoint", "data", "task", "split", "examples", "target_tokens" (null for a classifier), "normalized",
     "per_example" (importance's absolute value taken per example, else per batch),
     "modules": [{"name", "role", "layer", "heads", "importance": [H], "entropy": [H]}],
     "metric": "bleu" | "accuracy",
     "score": {"metric", "split", "sentences", "signature", "decode": {...} | null},
     "bleu": the same as "score" for a translation model, else null,
     "pruning_curve": {"step", "recompute", "keep_one", "points": [{"fraction", "masked_heads", "score", "masked"}]},
     "dominant_heads": {"baseline", "modules": [{"name", "role", "layer", "deltas", "dominant_head",
                        "dominant_delta"}], "mean_dominant_delta": {role: mean}}}
(pruning_curve / dominant_heads / score are null when switched off.) A classifier (encoder self-attention
only) is scored by accuracy in percent and its importance comes from the summed classification loss.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from multibranch.analysis.batches import batch_units, check_vocabulary, load_task_data, teacher_forced_batches
from multibranch.analysis.entropy import attention_entropy
from multibranch.analysis.heads import attention_sites, total_heads
from multibranch.data.meta import require_examples
from multibranch.device import resolve_device
from multibranch.errors import UserError
from multibranch.figures import plots
from multibranch.figures.report import ReportFolder
from multibranch.loading.checkpoint import load_model
from multibranch.pruning.curve import planned_counts, pruning_steps
from multibranch.pruning.dominant import dominant_heads
from multibranch.pruning.importance import head_importance
from multibranch.pruning.scoring import SCORED_TASKS, make_scorer
from multibranch.tasks.translation.translator import progress_bar, show_progress

# the report's files beside index.md: in a folder of other files, ReportFolder.check refuses them up front
REPORT_FILES = ("heads.json", "importance.png", "entropy.png", "pruning_curve.png")

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class HeadAnalysisOptions:
    """split: importance/entropy set; max_examples: its first N examples (None = all);
    bleu_split / bleu_max_sentences: what the pruning curve and dominant heads translate (default: split);
    beam: decode override (None = the checkpoint's decode config); progress: bars for the importance,
    entropy, pruning-curve and dominant-head phases (None: when stderr is a terminal)."""

    split: str = "valid"
    max_examples: int | None = None
    max_tokens: int = 4096
    normalize: bool = True
    per_example: bool = False  # importance's |gradient| per example (Michel et al.'s formula), not per batch
    bleu_split: str | None = None
    bleu_max_sentences: int | None = None
    beam: int | None = None
    curve: bool = True
    step: float = 0.1
    recompute: bool = False
    keep_one: bool = False
    dominant: bool = True
    device: str = "cpu"
    progress: bool | None = None  # a progress bar per phase on stderr; None: only when stderr is a terminal

    def validate(self) -> None:
        """UserError for a value out of its range, before anything is loaded (messages name the CLI's options)."""
        if not 0.0 < self.step <= 1.0:
            raise UserError(f"--step {self.step} must be in (0, 1]")
        resolve_device(self.device)  # ConfigError for a device this machine cannot use


def analyze_heads(ckpt: str | Path, data_dir: str | Path, out: str | Path, options: HeadAnalysisOptions,
                  force: bool = False) -> ReportFolder:
    """Run the head analyses and write the report folder; validates everything before writing.

    A translation model is scored by BLEU, a classifier by accuracy (%) and its importance comes from
    the classification loss."""

    options.validate()
    ReportFolder.check(out, force, REPORT_FILES)
    loaded = load_model(ckpt, options.device, task=SCORED_TASKS)
    model, cfg = loaded.model, loaded.config
    data = load_task_data(cfg.task, data_dir, str(ckpt))
    check_vocabulary(data, cfg.model, str(ckpt))
    split = data.split(options.split)
    require_examples(data_dir, options.split, len(split))
    score_split = options.bleu_split or options.split
    if options.curve or options.dominant:  # DataError for a missing or empty split before the long part
        require_examples(data_dir, score_split, len(data.split(score_split)))
    sites = attention_sites(model)

    batches = teacher_forced_batches(split, cfg.model, options.max_tokens, options.max_examples, options.device)
    show = show_progress(options.progress)
    log.info("importance and entropy over %d batches of %s", len(batches), options.split)
    importance = head_importance(model, with_bar(batches, show, "importance", "batch"), sites,
                                 normalize=options.normalize, per_example=options.per_example)
    entropy = attention_entropy(model, with_bar(batches, show, "entropy", "batch"), sites)
    report: dict[str, Any] = {
        "checkpoint": str(ckpt), "data": str(data_dir), "task": cfg.task, "split": options.split,
        "examples": int(sum(len(b) for b in batches)),
        "target_tokens": int(sum(batch_units(b) for b in batches)) if cfg.task == "translation" else None,
        "normalized": options.normalize, "per_example": options.per_example,
        "modules": [{"name": s.name, "role": s.role, "layer": s.layer, "heads": s.heads,
                     "importance": importance[s.name].tolist(), "entropy": entropy[s.name].tolist()} for s in sites],
        "metric": "bleu" if cfg.task == "translation" else "accuracy",
        "bleu": None, "score": None, "pruning_curve": None, "dominant_heads": None,
    }
    if options.curve or options.dominant:
        decode = cfg.decode if options.beam is None else dataclasses.replace(cfg.decode, beam=options.beam)
        scorer = make_scorer(model, loaded.tokenizer or data.tokenizer(), data, score_split,
                             options.bleu_max_sentences, decode, options.device, options.max_tokens)
        baseline = None
        if options.curve:
            def importance_under(gates):  # the first ranking is the one already computed
                if not gates:
                    return importance
                return head_importance(model, batches, sites, options.normalize, gates, options.per_example)

            maskable = total_heads(sites) - len(sites) if options.keep_one else None
            steps = pruning_steps(sites, importance_under, scorer, options.step, options.recompute, options.keep_one)
            points = list(with_bar(steps, show, "pruning curve", "step",
                                   len(planned_counts(total_heads(sites), options.step, maskable))))
            baseline = points[0].score
            report["pruning_curve"] = {"step": options.step, "recompute": options.recompute,
                                       "keep_one": options.keep_one, "points": [p.to_dict() for p in points]}
        if options.dominant:
            log.info("dominant heads: %d scorings of %d sentences", sum(s.heads for s in sites), scorer.sentences)
            heads = sum(s.heads for s in sites) + (baseline is None)
            with progress_bar(heads, show, unit="scoring", desc="dominant heads") as bar:
                report["dominant_heads"] = dominant_heads(sites, counted(scorer, bar), baseline)
        report["score"] = {"metric": scorer.metric, "split": score_split, "sentences": scorer.sentences,
                           "signature": scorer.signature,
                           "decode": dataclasses.asdict(decode) if scorer.metric == "bleu" else None}
        if scorer.metric == "bleu":
            report["bleu"] = report["score"]
    return write_report(report, out, force)


def with_bar(items: Iterable[T], show: bool, desc: str, unit: str, total: int | None = None) -> Iterator[T]:
    """The items, advancing a progress bar (on stderr, when `show`) as each one is done."""
    with progress_bar(len(items) if total is None else total, show, unit=unit, desc=desc) as bar:
        for item in items:
            yield item
            bar.update(1)


def counted(evaluate: Callable[[], float], bar: Any) -> Callable[[], float]:
    """`evaluate`, advancing `bar` after each call."""
    def call() -> float:
        score = evaluate()
        bar.update(1)
        return score
    return call


def write_report(report: dict[str, Any], out: str | Path, force: bool) -> ReportFolder:
    """heads.json, importance.png, entropy.png, pruning_curve.png (if any) and index.md."""

    folder = ReportFolder.create(out, force, REPORT_FILES)
    folder.write_json("heads.json", report)
    label = "l2-normalised per module" if report["normalized"] else "not normalised"
    folder.write_png("importance.png", plots.head_heatmaps(report["modules"], "importance", "head importance", label))
    folder.write_png("entropy.png", plots.head_heatmaps(report["modules"], "entropy", "attention entropy", "nats"))
    if report["pruning_curve"] is not None:
        folder.write_png("pruning_curve.png", plots.pruning_curve_plot(report["pruning_curve"]["points"],
                                                                       metric_title(report["metric"])))
    folder.write_text("index.md", index_markdown(report))
    return folder


def metric_title(metric: str) -> str:
    return "BLEU" if metric == "bleu" else "accuracy (%)"


def index_markdown(report: dict[str, Any]) -> str:
    metric = metric_title(report.get("metric", "bleu"))
    units = f" ({report['target_tokens']} target tokens)" if report.get("target_tokens") is not None else ""
    loss = "teacher-forced token NLL" if report.get("task", "translation") == "translation" else "classification NLL"
    lines = [f"# Head analysis of `{report['checkpoint']}`", "",
             f"Importance and entropy over {report['examples']} examples{units} "
             f"of split `{report['split']}` of `{report['data']}`. Numbers: [heads.json](heads.json).", ""]
    lines += ["## Head importance", "", f"Importance = |d loss/d gate| per head (Michel et al.), {loss}, no label smoothing"
              + (", l2-normalised per module." if report["normalized"] else "."), "", "![importance](importance.png)", "",
              "## Attention entropy", "", "Mean entropy (nats) of each head's attention over real query positions.", "",
              "![entropy](entropy.png)", ""]
    if report["pruning_curve"] is not None:
        score = report["score"]
        lines += ["## Pruning curve", "", f"{metric} on {score['sentences']} sentences of `{score['split']}` "
                  f"({score['signature']}) with the globally least important heads masked.", "",
                  "![pruning curve](pruning_curve.png)", "", f"| heads masked | fraction | {metric} |", "|---:|---:|---:|"]
        lines += [f"| {p['masked_heads']} | {p['fraction']:.0%} | {p['score']:.2f} |"
                  for p in report["pruning_curve"]["points"]]
        lines.append("")
    if report["dominant_heads"] is not None:
        table = report["dominant_heads"]
        lines += ["## Dominant heads", "", f"{metric} without masking: {table['baseline']:.2f}. Change when the "
                  "dominant head (largest drop) of each module is masked, averaged over layers:", "",
                  f"| attention | mean {metric} change |", "|---|---:|"]
        lines += [f"| {role} | {delta:+.2f} |" for role, delta in table["mean_dominant_delta"].items()]
        lines.append("")
    return "\n".join(lines)
