"""`multibranch analyze heads`: importance, entropy, pruning curve and dominant heads of a checkpoint,
written as one report folder (heads.json, PNG plots, index.md).

heads.json:
    {"checkpoint", "data", "split", "examples", "target_tokens", "normalized",
     "modules": [{"name", "role", "layer", "heads", "importance": [H], "entropy": [H]}],
     "bleu": {"split", "sentences", "signature", "decode": {...}},
     "pruning_curve": {"step", "recompute", "keep_one", "points": [{"fraction", "masked_heads", "score", "masked"}]},
     "dominant_heads": {"baseline", "modules": [{"name", "role", "layer", "deltas", "dominant_head",
                        "dominant_delta"}], "mean_dominant_delta": {role: mean}}}
(pruning_curve / dominant_heads are null when switched off.)
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multibranch.analysis.batches import check_vocabulary, teacher_forced_batches
from multibranch.analysis.entropy import attention_entropy
from multibranch.analysis.heads import attention_sites
from multibranch.analysis.importance import head_importance
from multibranch.analysis.pruning import dominant_heads, pruning_curve
from multibranch.analysis.report import ReportFolder
from multibranch.analysis.scoring import BleuScorer

log = logging.getLogger(__name__)


@dataclass
class HeadAnalysisOptions:
    """split: importance/entropy set; max_examples: its first N examples (None = all);
    bleu_split / bleu_max_sentences: what the pruning curve and dominant heads translate (default: split);
    beam: decode override (None = the checkpoint's decode config)."""

    split: str = "valid"
    max_examples: int | None = None
    max_tokens: int = 4096
    normalize: bool = True
    bleu_split: str | None = None
    bleu_max_sentences: int | None = None
    beam: int | None = None
    curve: bool = True
    step: float = 0.1
    recompute: bool = False
    keep_one: bool = False
    dominant: bool = True
    device: str = "cpu"


def analyze_heads(ckpt: str | Path, data_dir: str | Path, out: str | Path, options: HeadAnalysisOptions,
                  force: bool = False) -> ReportFolder:
    """Run the head analyses and write the report folder; validates everything before writing."""
    from multibranch.checkpoint.model import load_model
    from multibranch.data.dataset import PreparedData

    ReportFolder.check(out, force)
    if not 0.0 < options.step <= 1.0:
        raise ValueError(f"pruning-curve step {options.step} must be in (0, 1]")
    loaded = load_model(ckpt, options.device, task="translation")
    model, cfg = loaded.model, loaded.config
    data = PreparedData.load(data_dir)
    check_vocabulary(data, cfg.model, str(ckpt))
    split = data.split(options.split)
    bleu_split = data.split(options.bleu_split or options.split) if (options.curve or options.dominant) else None
    sites = attention_sites(model)

    batches = teacher_forced_batches(split, cfg.model, options.max_tokens, options.max_examples, options.device)
    log.info("importance and entropy over %d batches of %s", len(batches), options.split)
    importance = head_importance(model, batches, sites, normalize=options.normalize)
    entropy = attention_entropy(model, batches, sites)
    report: dict[str, Any] = {
        "checkpoint": str(ckpt), "data": str(data_dir), "split": options.split,
        "examples": int(sum(len(b) for b in batches)), "target_tokens": int(sum(b.n_tgt_tokens for b in batches)),
        "normalized": options.normalize,
        "modules": [{"name": s.name, "role": s.role, "layer": s.layer, "heads": s.heads,
                     "importance": importance[s.name].tolist(), "entropy": entropy[s.name].tolist()} for s in sites],
        "bleu": None, "pruning_curve": None, "dominant_heads": None,
    }
    if bleu_split is not None:
        decode = cfg.decode if options.beam is None else dataclasses.replace(cfg.decode, beam=options.beam)
        n = len(bleu_split) if options.bleu_max_sentences is None else min(options.bleu_max_sentences, len(bleu_split))
        tokenizer = loaded.tokenizer or data.tokenizer()
        scorer = BleuScorer(model, tokenizer, bleu_split.raw_src_lines()[:n], bleu_split.raw_tgt_lines()[:n], decode,
                            options.device)
        baseline = None
        if options.curve:
            def importance_under(gates):  # the first ranking is the one already computed
                return head_importance(model, batches, sites, options.normalize, gates) if gates else importance

            points = pruning_curve(sites, importance_under, scorer, options.step, options.recompute, options.keep_one)
            baseline = points[0].score
            report["pruning_curve"] = {"step": options.step, "recompute": options.recompute,
                                       "keep_one": options.keep_one, "points": [p.to_dict() for p in points]}
        if options.dominant:
            log.info("dominant heads: %d translations of %d sentences", sum(s.heads for s in sites), n)
            report["dominant_heads"] = dominant_heads(sites, scorer, baseline)
        report["bleu"] = {"split": bleu_split.name, "sentences": n, "signature": scorer.signature,
                          "decode": dataclasses.asdict(decode)}
    return write_report(report, out, force)


def write_report(report: dict[str, Any], out: str | Path, force: bool) -> ReportFolder:
    """heads.json, importance.png, entropy.png, pruning_curve.png (if any) and index.md."""
    from multibranch.analysis import plots

    folder = ReportFolder.create(out, force)
    folder.write_json("heads.json", report)
    label = "l2-normalised per module" if report["normalized"] else "not normalised"
    folder.write_png("importance.png", plots.head_heatmaps(report["modules"], "importance", "head importance", label))
    folder.write_png("entropy.png", plots.head_heatmaps(report["modules"], "entropy", "attention entropy", "nats"))
    if report["pruning_curve"] is not None:
        folder.write_png("pruning_curve.png", plots.pruning_curve_plot(report["pruning_curve"]["points"]))
    folder.write_text("index.md", index_markdown(report))
    return folder


def index_markdown(report: dict[str, Any]) -> str:
    lines = [f"# Head analysis of `{report['checkpoint']}`", "",
             f"Importance and entropy over {report['examples']} examples ({report['target_tokens']} target tokens) "
             f"of split `{report['split']}` of `{report['data']}`. Numbers: [heads.json](heads.json).", ""]
    lines += ["## Head importance", "", "Importance = |dNLL/d gate| per head (Michel et al.), teacher-forced, no label smoothing"
              + (", l2-normalised per module." if report["normalized"] else "."), "", "![importance](importance.png)", "",
              "## Attention entropy", "", "Mean entropy (nats) of each head's attention over real query positions.", "",
              "![entropy](entropy.png)", ""]
    if report["pruning_curve"] is not None:
        bleu = report["bleu"]
        lines += ["## Pruning curve", "", f"BLEU on {bleu['sentences']} sentences of `{bleu['split']}` "
                  f"({bleu['signature']}) with the globally least important heads masked.", "",
                  "![pruning curve](pruning_curve.png)", "", "| heads masked | fraction | BLEU |", "|---:|---:|---:|"]
        lines += [f"| {p['masked_heads']} | {p['fraction']:.0%} | {p['score']:.2f} |"
                  for p in report["pruning_curve"]["points"]]
        lines.append("")
    if report["dominant_heads"] is not None:
        table = report["dominant_heads"]
        lines += ["## Dominant heads", "", f"BLEU without masking: {table['baseline']:.2f}. Change when the "
                  "dominant head (largest drop) of each module is masked, averaged over layers:", "",
                  "| attention | mean BLEU change |", "|---|---:|"]
        lines += [f"| {role} | {delta:+.2f} |" for role, delta in table["mean_dominant_delta"].items()]
        lines.append("")
    return "\n".join(lines)
