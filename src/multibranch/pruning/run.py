"""`multibranch prune` as one library call: load a checkpoint, choose the heads (listed, a least-important
fraction, or a metric threshold), remove them physically, compare the two models on a prepared split and
write the pruned checkpoint and the JSON report.

    options = PruneOptions(fraction=0.3, data="data/")   # or max_drop=0.5, or heads=selection.read_heads(FILE)
    report = prune_checkpoint("best.pt", "pruned.pt", "pruned.json", options, force=False)
    print(summary(report))                                # pruning.report.summary

The report: {"checkpoint", "pruned", "selection", "removed", "parameters": {"before", "after", "change",
"change_percent"}} and, with data: "metric", "set", "before"/"after" ({"score"} and, unless speed is off,
"sentences_per_s" (fastest round), "sentences_per_s_median", "sentences_per_s_min", "seconds"), "score_change",
"speed" ({"rounds", "speedup_median", "speedup_min", "speedup_max"}: the after/before ratio of each
alternating round), "speedup" (the median ratio), "identical_outputs" (and "masked_score" for a threshold).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from multibranch.analysis.batches import check_vocabulary, load_task_data, teacher_forced_batches
from multibranch.analysis.heads import HeadId, attention_sites
from multibranch.atomic import atomic_write_text
from multibranch.checkpoint.format import load_checkpoint, load_state_strict, save_checkpoint
from multibranch.convert.payload import experiment_config, refuse_overwrite
from multibranch.data.directories import CHECKPOINT, refuse_replacing, refuse_replacing_file
from multibranch.data.text import check_output_file
from multibranch.device import resolve_device
from multibranch.errors import ConfigError, UserError
from multibranch.loading.checkpoint import load_model
from multibranch.pruning.importance import head_importance
from multibranch.pruning.removal import check_prunable, prune_heads
from multibranch.pruning.scoring import SCORED_TASKS, agreement, make_scorer
from multibranch.pruning.selection import heads_within_drop, least_important
from multibranch.pruning.speed import side_by_side, speed_spread
from multibranch.tasks import build_task_model


@dataclass
class PruneOptions:
    """Exactly one of fraction / max_drop / heads chooses the heads. data: the prepared directory that
    ranks them (split, its first max_examples) and scores both models (score_split, default split; its
    first max_sentences); speed: time both models over speed_rounds alternating rounds."""

    fraction: float | None = None
    max_drop: float | None = None
    heads: list[HeadId] | None = None
    heads_file: str | None = None  # where `heads` came from (recorded in the report)
    data: str | Path | None = None
    split: str = "valid"
    max_examples: int | None = None
    max_tokens: int = 4096
    per_example: bool = False  # importance's |gradient| per example (Michel et al.'s formula), not per batch
    score_split: str | None = None
    max_sentences: int | None = None
    beam: int | None = None
    step: float = 0.1
    recompute: bool = False
    speed: bool = True
    speed_rounds: int = 3
    device: str = "cpu"

    def validate(self) -> None:
        """UserError for values out of their range, before anything is loaded (messages name the CLI's options)."""
        chosen = [o for o in (self.fraction, self.max_drop, self.heads) if o is not None]
        if len(chosen) != 1:
            raise ConfigError("give exactly one of --fraction, --max-drop and --heads-json")
        if self.fraction is not None and not 0.0 < self.fraction < 1.0:
            raise ConfigError(f"--fraction {self.fraction} must be between 0 and 1 (exclusive)")
        if self.max_drop is not None and self.max_drop < 0:
            raise ConfigError(f"--max-drop {self.max_drop} must be >= 0 (points of BLEU or accuracy)")
        if not 0.0 < self.step <= 1.0:
            raise ConfigError(f"--step {self.step} must be in (0, 1]")
        if (self.fraction is not None or self.max_drop is not None) and not self.data:
            raise ConfigError("--fraction and --max-drop rank heads by importance on data: give --data PREPARED_DIR")
        resolve_device(self.device)


def report_path_of(out: str | Path, report: str | Path | None) -> Path:
    """Where the JSON report goes: `report`, or `out` with the suffix .json; UserError when that is `out` itself."""
    path = Path(report) if report else Path(out).with_suffix(".json")
    if path.resolve() == Path(out).resolve():
        raise UserError(f"--report {path} is the pruned checkpoint --out")
    return path


class PruneData:
    """The loaded model, its data, the importance set and the scored set."""

    def __init__(self, ckpt: str | Path, options: PruneOptions):
        o = self.options = options
        self.loaded = load_model(ckpt, o.device, task=SCORED_TASKS)
        cfg = self.loaded.config
        self.data = load_task_data(cfg.task, o.data, str(ckpt))
        check_vocabulary(self.data, cfg.model, str(ckpt))
        self.score_split = o.score_split or o.split
        self.data.split(self.score_split)  # DataError for a missing split before any work
        self.batches = teacher_forced_batches(self.data.split(o.split), cfg.model, o.max_tokens, o.max_examples,
                                              o.device)
        self.sites = attention_sites(self.loaded.model)
        self.decode = cfg.decode if o.beam is None else dataclasses.replace(cfg.decode, beam=o.beam)
        self.tokenizer = self.loaded.tokenizer or self.data.tokenizer()
        self.scorer = self.scorer_of(self.loaded.model)
        self._scores = None

    def scorer_of(self, model):
        o = self.options
        return make_scorer(model, self.tokenizer, self.data, self.score_split, o.max_sentences, self.decode,
                           o.device, o.max_tokens)

    def importance(self, gates: dict) -> dict:
        if gates:
            return head_importance(self.loaded.model, self.batches, self.sites, gates=gates,
                                   per_example=self.options.per_example)
        if self._scores is None:
            self._scores = head_importance(self.loaded.model, self.batches, self.sites,
                                           per_example=self.options.per_example)
        return self._scores

    def least_important(self, fraction: float) -> list[HeadId]:
        try:
            return least_important(self.sites, self.importance({}), fraction)
        except ValueError as error:
            raise ConfigError(f"--fraction: {error}") from None

    def within_drop(self, max_drop: float, step: float, recompute: bool):
        return heads_within_drop(self.sites, self.importance, self.scorer, max_drop, step, recompute)

    def compare(self, pruned, speed: bool, rounds: int) -> dict[str, Any]:
        """Score (and unless `speed` is off, time side by side) the original and the pruned model."""
        after = self.scorer_of(pruned)
        timed = side_by_side({"before": self.scorer, "after": after}, rounds if speed else 1)
        n = self.scorer.sentences
        out: dict[str, Any] = {
            "metric": self.scorer.metric,
            "set": {"split": self.score_split, "sentences": n, "signature": self.scorer.signature,
                    "decode": dataclasses.asdict(self.decode) if self.scorer.metric == "bleu" else None,
                    "rounds": rounds if speed else None},
        }
        for label, result in timed.items():
            out[label] = {"score": result["score"]}
        out["score_change"] = out["after"]["score"] - out["before"]["score"]
        if speed:
            spread = speed_spread(timed["before"]["seconds"], timed["after"]["seconds"], n)
            for label in ("before", "after"):
                out[label].update(spread[label])
            out["speed"] = spread["speed"]
            out["speedup"] = spread["speed"]["speedup_median"]
        out["identical_outputs"] = agreement(self.scorer, after)
        return out


def prune_checkpoint(ckpt: str | Path, out: str | Path, report_path: str | Path, options: PruneOptions,
                     force: bool = False) -> dict[str, Any]:
    """Prune `ckpt` as `options` say, write the pruned checkpoint `out` and the JSON report; the report.

    Everything that can be refused (existing outputs without `force`, a kind that cannot be pruned, listed
    heads the model does not have, the data of another task) is refused before the long work."""
    options.validate()
    report_path = Path(report_path)
    refuse_replacing(out, CHECKPOINT)  # a text file, a run's last.pt or best.pt: never, --force or not
    refuse_overwrite(out, force)
    refuse_replacing_file(report_path, "--report")  # another command's output: never, --force or not
    refuse_overwrite(report_path, force)
    inputs = [str(ckpt), *([options.heads_file] if options.heads_file else [])]
    check_output_file(str(out), inputs, parent_must_exist=False)
    check_output_file(str(report_path), [*inputs, str(out)], parent_must_exist=False)
    payload = load_checkpoint(ckpt)
    check_prunable(payload, str(ckpt))
    pruned = None
    if options.heads is not None:
        remove = list(options.heads)
        pruned = prune_heads(payload, remove, source=str(ckpt))  # unknown modules and heads: before any data work
    context = PruneData(ckpt, options) if options.data is not None else None
    selection: dict[str, Any] = {"mode": "heads_json", "file": options.heads_file}
    chosen_point = None
    if options.fraction is not None:
        remove = context.least_important(options.fraction)
        selection = {"mode": "fraction", "fraction": options.fraction, "split": options.split,
                     "per_example": options.per_example}
    elif options.max_drop is not None:
        chosen_point, walked = context.within_drop(options.max_drop, options.step, options.recompute)
        remove = chosen_point.masked
        selection = {"mode": "max_drop", "max_drop": options.max_drop, "step": options.step,
                     "recompute": options.recompute, "split": options.split, "per_example": options.per_example,
                     "chosen_fraction": chosen_point.fraction,
                     "walked": [{k: v for k, v in p.to_dict().items() if k != "masked"} for p in walked]}
    if pruned is None:
        pruned = prune_heads(payload, remove, source=str(ckpt))
    after_model = model_of(pruned, str(out), options.device)
    report: dict[str, Any] = {
        "checkpoint": str(ckpt), "pruned": str(out), "selection": selection,
        "removed": [[name, head] for name, head in sorted(remove)],
        "parameters": change(parameter_count(model_of(payload, str(ckpt))), parameter_count(after_model)),
    }
    if context is not None:
        report.update(context.compare(after_model, options.speed, options.speed_rounds))
        if chosen_point is not None:
            report["masked_score"] = chosen_point.score  # the pruned model must score exactly like the masked one
    save_checkpoint(out, pruned)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(report_path, json.dumps(report, indent=2, allow_nan=False) + "\n")
    return report


def change(before: int, after: int) -> dict[str, Any]:
    """Parameter counts before and after, their difference and its percentage."""
    return {"before": before, "after": after, "change": after - before,
            "change_percent": 100.0 * (after - before) / before}


def parameter_count(model: nn.Module) -> int:
    """Parameters of `model` (a tied parameter counted once)."""
    return sum(p.numel() for p in model.parameters())


def model_of(payload: dict[str, Any], where: str, device: str = "cpu") -> nn.Module:
    """The (eval-mode) model of an in-memory checkpoint payload."""
    model = build_task_model(experiment_config(payload))
    load_state_strict(model, payload["model"], where)
    return model.to(device).eval()
