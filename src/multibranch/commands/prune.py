"""`multibranch prune`: physically remove attention heads from a standard or MAT checkpoint
(translation model or classifier), and report parameters, speed and BLEU / accuracy before and after.

    multibranch prune --ckpt X.pt --out Y.pt --fraction 0.3 --data PREPARED_DIR [--split valid] [--max-examples N]
    multibranch prune --ckpt X.pt --out Y.pt --max-drop 0.5 --data PREPARED_DIR [--step 0.05] [--recompute]
        [--score-split valid] [--max-sentences N] [--beam K]
    multibranch prune --ckpt X.pt --out Y.pt --heads-json HEADS.json [--data PREPARED_DIR]
    (all: [--report Y.json] [--speed-rounds 3] [--device cpu] [--force])

--fraction removes that share of all heads, least important first (Michel et al. importance over
--split, l2-normalised per module; every module keeps at least one head). --max-drop walks the
pruning curve (steps of --step of all heads, least important first) and keeps the last step whose
BLEU (accuracy in % for a classifier) on --score-split is at most that many points below the
unpruned score, stopping at the first step that drops more. --heads-json names the heads: a JSON
list of [module name, head index] pairs, or an object with such a list under "masked" (a point of
`analyze heads`' pruning curve). The output is a normal weights-only checkpoint that translates
exactly like the input with those heads masked.

With --data, the report (printed, and written as JSON to --report, default Y.json) compares the
models on --score-split: parameters, sentences/s (decoding or classifying the set with the same
settings, timed side by side in alternating rounds) and the score. Without --data it has the
parameters only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from multibranch.arguments import positive_int

HELP = "remove attention heads (least important fraction, BLEU threshold, or listed) and report before/after"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt", required=True, help="standard or MAT checkpoint (translation or classification)")
    parser.add_argument("--out", required=True, help="pruned checkpoint to write")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--fraction", type=float, help="share of all heads to remove, least important first")
    which.add_argument("--max-drop", type=float, metavar="POINTS",
                       help="remove the least important heads while BLEU (accuracy %% for a classifier) on "
                       "--score-split stays within POINTS of the unpruned score")
    which.add_argument("--heads-json", metavar="FILE", help="heads to remove: [[module, head], ...]")
    parser.add_argument("--data", help="prepared data: importance set and report set (needed with --fraction, --max-drop)")
    parser.add_argument("--split", default="valid", help="importance set")
    parser.add_argument("--max-examples", type=positive_int, default=None, help="only the first N examples of --split")
    parser.add_argument("--max-tokens", type=positive_int, default=4096, help="padded tokens per batch")
    parser.add_argument("--score-split", default=None, help="split scored for --max-drop and the report (default: --split)")
    parser.add_argument("--max-sentences", type=positive_int, default=None,
                        help="score (and time) only the first N sentences of --score-split")
    parser.add_argument("--beam", type=positive_int, default=None, help="beam size (default: the checkpoint's)")
    parser.add_argument("--step", type=float, default=0.1, help="--max-drop: step of the walk, as a fraction of all heads")
    parser.add_argument("--recompute", action="store_true", help="--max-drop: recompute importance after every step")
    parser.add_argument("--speed-rounds", type=positive_int, default=3, help="timed passes per model (alternating)")
    parser.add_argument("--report", default=None, help="JSON report to write (default: --out with suffix .json)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--force", action="store_true", help="overwrite --out and --report")


def run(args: argparse.Namespace) -> int:
    from multibranch.analysis.prune_report import model_of, parameter_count
    from multibranch.atomic import atomic_write_text
    from multibranch.checkpoint.format import load_checkpoint, save_checkpoint
    from multibranch.convert.payload import refuse_overwrite
    from multibranch.convert.prune import check_prunable, prune_heads
    from multibranch.data.text import check_output_file

    report_path = _check_arguments(args)
    refuse_overwrite(args.out, args.force)
    refuse_overwrite(report_path, args.force)
    check_output_file(args.out, [args.ckpt], parent_must_exist=False)
    check_output_file(str(report_path), [args.ckpt, args.out], parent_must_exist=False)
    payload = load_checkpoint(args.ckpt)
    check_prunable(payload, str(args.ckpt))
    context = _Context(args) if args.data else None
    selection: dict[str, Any] = {"mode": "heads_json", "file": args.heads_json}
    if args.heads_json:
        remove = _read_heads(args.heads_json)
    elif args.fraction is not None:
        remove = context.least_important(args.fraction)
        selection = {"mode": "fraction", "fraction": args.fraction, "split": args.split}
    else:
        chosen, walked = context.within_drop(args.max_drop, args.step, args.recompute)
        remove = chosen.masked
        selection = {"mode": "max_drop", "max_drop": args.max_drop, "step": args.step, "recompute": args.recompute,
                     "split": args.split, "chosen_fraction": chosen.fraction,
                     "walked": [{k: v for k, v in p.to_dict().items() if k != "masked"} for p in walked]}
    pruned = prune_heads(payload, remove, source=str(args.ckpt))
    after_model = model_of(pruned, str(args.out), args.device)
    report: dict[str, Any] = {
        "checkpoint": str(args.ckpt), "pruned": str(args.out), "selection": selection,
        "removed": [[name, head] for name, head in sorted(remove)],
        "parameters": _change(parameter_count(model_of(payload, str(args.ckpt))), parameter_count(after_model)),
    }
    if context is not None:
        report.update(context.compare(after_model, args.speed_rounds))
        if selection["mode"] == "max_drop":
            report["masked_score"] = chosen.score  # the pruned model must score exactly like the masked one
    save_checkpoint(args.out, pruned)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(report_path, json.dumps(report, indent=2, allow_nan=False) + "\n")
    print(summary(report))
    print(f"wrote {args.out} and {report_path}")
    return 0


def _check_arguments(args: argparse.Namespace) -> Path:
    from multibranch.device import resolve_device
    from multibranch.errors import UserError

    if args.fraction is not None and not 0.0 < args.fraction < 1.0:
        raise UserError(f"--fraction {args.fraction} must be between 0 and 1 (exclusive)")
    if args.max_drop is not None and args.max_drop < 0:
        raise UserError(f"--max-drop {args.max_drop} must be >= 0 (points of BLEU or accuracy)")
    if not 0.0 < args.step <= 1.0:
        raise UserError(f"--step {args.step} must be in (0, 1]")
    if (args.fraction is not None or args.max_drop is not None) and not args.data:
        raise UserError("--fraction and --max-drop rank heads by importance on data: give --data PREPARED_DIR")
    resolve_device(args.device)
    report = Path(args.report) if args.report else Path(args.out).with_suffix(".json")
    if report.resolve() == Path(args.out).resolve():
        raise UserError(f"--report {report} is the pruned checkpoint --out")
    return report


class _Context:
    """The loaded model, its data, the importance set and the scored set."""

    def __init__(self, args: argparse.Namespace):
        import dataclasses

        from multibranch.analysis.batches import check_vocabulary, teacher_forced_batches
        from multibranch.analysis.heads import attention_sites
        from multibranch.analysis.scoring import make_scorer
        from multibranch.tasks import task_class
        from multibranch.tasks.loading import load_model

        self.args = args
        self.loaded = load_model(args.ckpt, args.device)
        cfg = self.loaded.config
        self.data = task_class(cfg.task).load_data(Path(args.data))
        check_vocabulary(self.data, cfg.model, args.ckpt)
        self.score_split = args.score_split or args.split
        self.data.split(self.score_split)  # DataError for a missing split before any work
        self.batches = teacher_forced_batches(self.data.split(args.split), cfg.model, args.max_tokens,
                                              args.max_examples, args.device)
        self.sites = attention_sites(self.loaded.model)
        self.decode = cfg.decode if args.beam is None else dataclasses.replace(cfg.decode, beam=args.beam)
        self.tokenizer = self.loaded.tokenizer or self.data.tokenizer()
        self.scorer = make_scorer(self.loaded.model, self.tokenizer, self.data, self.score_split, args.max_sentences,
                                  self.decode, args.device, args.max_tokens)
        self._scores = None

    def importance(self, gates: dict) -> dict:
        from multibranch.analysis.importance import head_importance

        if gates:
            return head_importance(self.loaded.model, self.batches, self.sites, gates=gates)
        if self._scores is None:
            self._scores = head_importance(self.loaded.model, self.batches, self.sites)
        return self._scores

    def least_important(self, fraction: float) -> list[tuple[str, int]]:
        from multibranch.analysis.prune_report import least_important
        from multibranch.errors import UserError

        try:
            return least_important(self.sites, self.importance({}), fraction)
        except ValueError as error:
            raise UserError(f"--fraction: {error}") from None

    def within_drop(self, max_drop: float, step: float, recompute: bool):
        from multibranch.analysis.prune_report import heads_within_drop

        return heads_within_drop(self.sites, self.importance, self.scorer, max_drop, step, recompute)

    def compare(self, pruned, rounds: int) -> dict[str, Any]:
        """Score and time the original and the pruned model side by side on the scored set."""
        import dataclasses

        from multibranch.analysis.prune_report import side_by_side
        from multibranch.analysis.scoring import agreement, make_scorer

        a = self.args
        after = make_scorer(pruned, self.tokenizer, self.data, self.score_split, a.max_sentences, self.decode,
                            a.device, a.max_tokens)
        timed = side_by_side({"before": self.scorer, "after": after}, rounds)
        n = self.scorer.sentences
        out: dict[str, Any] = {
            "metric": self.scorer.metric,
            "set": {"split": self.score_split, "sentences": n, "signature": self.scorer.signature,
                    "decode": dataclasses.asdict(self.decode) if self.scorer.metric == "bleu" else None, "rounds": rounds},
        }
        for label, result in timed.items():
            out[label] = {"score": result["score"], "sentences_per_s": n / min(result["seconds"]),
                          "seconds": result["seconds"]}
        out["score_change"] = out["after"]["score"] - out["before"]["score"]
        out["speedup"] = out["after"]["sentences_per_s"] / out["before"]["sentences_per_s"]
        out["identical_outputs"] = agreement(self.scorer, after)
        return out


def _change(before: int, after: int) -> dict[str, Any]:
    return {"before": before, "after": after, "change": after - before,
            "change_percent": 100.0 * (after - before) / before}


def summary(report: dict[str, Any]) -> str:
    """The report as a few human lines."""
    p = report["parameters"]
    lines = [f"removed {len(report['removed'])} head(s); parameters {p['before']:,} -> {p['after']:,} "
             f"({p['change']:+,}, {p['change_percent']:+.1f}%)"]
    if "before" in report:
        metric = "BLEU" if report["metric"] == "bleu" else "accuracy (%)"
        b, a = report["before"], report["after"]
        lines.append(f"{metric} on {report['set']['sentences']} sentences of {report['set']['split']}: "
                     f"{b['score']:.2f} -> {a['score']:.2f} ({report['score_change']:+.2f})")
        lines.append(f"speed: {b['sentences_per_s']:.1f} -> {a['sentences_per_s']:.1f} sentences/s "
                     f"(x{report['speedup']:.2f}, best of {report['set']['rounds']} alternating rounds)")
    return "\n".join(lines)


def _read_heads(path: str) -> list[tuple[str, int]]:
    from multibranch.errors import UserError

    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err})") from None
    if isinstance(data, dict):
        data = data.get("masked")
    ok = isinstance(data, list) and all(
        isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int)
        for item in data
    )
    if not ok:
        raise UserError(f"{path}: expected a list of [module name, head index] pairs (or {{\"masked\": [...]}})")
    return [(name, head) for name, head in data]
