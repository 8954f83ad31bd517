"""`multibranch info`: list presets; show a preset's or checkpoint's resolved config and parameter counts."""

from __future__ import annotations

import argparse

HELP = "list presets, or print the resolved config and parameter counts of a preset or checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--list", action="store_true", help="list the named presets")
    source.add_argument("--preset", help="a preset name or YAML file (see --list)")
    source.add_argument("--ckpt", help="a checkpoint file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override of the --preset, e.g. model.heads=4 (repeatable)")
    parser.add_argument("--vocab-size", type=int, default=8000,
                        help="vocabulary size used to count a preset's parameters")
    parser.add_argument("--num-labels", type=int, default=None, metavar="N",
                        help="number of labels used to count a classification preset's parameters "
                             "(default: the preset's classifier.num_labels, else 2)")
    parser.add_argument("--no-config", action="store_true", help="only the parameter table")


def parameter_table(model) -> list[tuple[str, int]]:
    """(component/part, count) rows: embeddings, then each encoder/decoder sublayer kind summed over layers,
    then (a classifier) its head's dense and label layers."""
    from multibranch.models.classifier import Classifier

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


def run(args: argparse.Namespace) -> int:
    import yaml

    from multibranch.errors import UserError
    from multibranch.experiment import list_presets, load_preset_dict, resolve_config
    from multibranch.tasks import build_task_model

    if args.list:
        for name in list_presets():
            description = load_preset_dict(name).get("description", "")
            print(f"{name:24s} {' '.join(description.split())}")
        return 0
    if args.ckpt:
        from multibranch.tasks.loading import load_model

        loaded = load_model(args.ckpt)
        cfg, model = loaded.config, loaded.model
        meta = loaded.payload.get("meta", {})
        print(f"# checkpoint {args.ckpt}: step {meta.get('step')}, valid {meta.get('valid')}")
    else:
        cfg = resolve_config(args.preset, None, args.overrides)
        if not cfg.model.src_vocab_size:
            cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = args.vocab_size
        counting = f"vocabulary {cfg.model.src_vocab_size}/{cfg.model.tgt_vocab_size}"
        if cfg.task == "classification":
            labels = args.num_labels or cfg.classifier.num_labels or 2
            if labels < 2:
                raise UserError(f"--num-labels {labels}: a classifier needs at least 2 labels")
            cfg.classifier.num_labels = labels
            counting = f"classification, vocabulary {cfg.model.src_vocab_size}, {labels} labels"
        elif args.num_labels is not None:
            raise UserError(f"--num-labels applies to classification presets; {args.preset} is a {cfg.task} preset")
        model = build_task_model(cfg)
        print(f"# preset {args.preset} ({counting} for counting)")
    if not args.no_config:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip())
    print("\n# parameters")
    rows = parameter_table(model)
    width = max(len(k) for k, _ in rows)
    for key, count in rows:
        print(f"{key:{width}s} {count:>12,d}")
    total = sum(c for _, c in rows)
    print(f"{'total':{width}s} {total:>12,d}  ({total / 1e6:.2f}M)")
    return 0
