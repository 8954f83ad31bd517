"""`multibranch prune`: physically remove attention heads from a standard or MAT checkpoint.

    multibranch prune --ckpt X.pt --out Y.pt --fraction 0.3 --data PREPARED_DIR [--split valid] [--max-examples N]
    multibranch prune --ckpt X.pt --out Y.pt --heads-json HEADS.json

--fraction removes that share of all heads, least important first (Michel et al. importance over the
split, l2-normalised per module; every module keeps at least one head). --heads-json names the heads:
a JSON list of [module name, head index] pairs, or an object with such a list under "masked" (a
point of `analyze heads`' pruning curve). The output is a normal weights-only checkpoint that
translates exactly like the input with those heads masked.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from multibranch.commands.analyze import positive_int

HELP = "remove attention heads (least important fraction, or listed) from a standard/MAT checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt", required=True, help="standard or MAT checkpoint")
    parser.add_argument("--out", required=True, help="pruned checkpoint to write")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--fraction", type=float, help="share of all heads to remove, least important first")
    which.add_argument("--heads-json", metavar="FILE", help="heads to remove: [[module, head], ...]")
    parser.add_argument("--data", help="prepared data for the importance (needed with --fraction)")
    parser.add_argument("--split", default="valid", help="importance set")
    parser.add_argument("--max-examples", type=positive_int, default=None, help="only the first N examples of --split")
    parser.add_argument("--max-tokens", type=positive_int, default=4096, help="padded tokens per batch")
    parser.add_argument("--force", action="store_true", help="overwrite --out")


def run(args: argparse.Namespace) -> int:
    from multibranch.checkpoint.format import load_checkpoint, save_checkpoint
    from multibranch.cli import UserError
    from multibranch.convert.payload import refuse_overwrite
    from multibranch.convert.prune import check_prunable, prune_heads
    from multibranch.data.text import check_output_file

    if args.fraction is not None and not 0.0 < args.fraction < 1.0:
        raise UserError(f"--fraction {args.fraction} must be between 0 and 1 (exclusive)")
    if args.fraction is not None and not args.data:
        raise UserError("--fraction ranks heads by importance on data: give --data PREPARED_DIR")
    refuse_overwrite(args.out, args.force)
    check_output_file(args.out, [args.ckpt], parent_must_exist=False)
    payload = load_checkpoint(args.ckpt)
    check_prunable(payload, str(args.ckpt))
    if args.heads_json:
        remove = _read_heads(args.heads_json)
    else:
        remove = _least_important(args)
    pruned = prune_heads(payload, remove, source=str(args.ckpt))
    before, after = _parameters(payload), _parameters(pruned)
    save_checkpoint(args.out, pruned)
    print(f"wrote {args.out}: removed {len(remove)} head(s); parameters {before:,} -> {after:,} "
          f"({after - before:+,}, {100 * (after - before) / before:+.1f}%)")
    return 0


def _read_heads(path: str) -> list[tuple[str, int]]:
    from multibranch.cli import UserError

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


def _least_important(args: argparse.Namespace) -> list[tuple[str, int]]:
    from multibranch.analysis.batches import check_vocabulary, teacher_forced_batches
    from multibranch.analysis.heads import attention_sites, total_heads
    from multibranch.analysis.importance import head_importance
    from multibranch.analysis.pruning import select_heads
    from multibranch.checkpoint.model import load_model
    from multibranch.cli import UserError
    from multibranch.data.dataset import PreparedData

    loaded = load_model(args.ckpt, task="translation")
    data = PreparedData.load(args.data)
    check_vocabulary(data, loaded.config.model, args.ckpt)
    batches = teacher_forced_batches(data.split(args.split), loaded.config.model, args.max_tokens, args.max_examples)
    sites = attention_sites(loaded.model)
    count = round(args.fraction * total_heads(sites))
    maskable = total_heads(sites) - len(sites)
    if count > maskable:
        raise UserError(f"--fraction {args.fraction} removes {count} heads but only {maskable} can go "
                        f"(every one of the {len(sites)} attention modules keeps one)")
    scores = head_importance(loaded.model, batches, sites)
    return select_heads(sites, scores, count, [], keep_one=True)


def _parameters(payload: dict[str, Any]) -> int:
    import torch

    from multibranch.convert.payload import experiment_config
    from multibranch.models import build_model

    with torch.device("meta"):
        return build_model(experiment_config(payload).model).parameter_counts()["total"]
