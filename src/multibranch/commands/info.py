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


def run(args: argparse.Namespace) -> int:
    import yaml

    from multibranch.errors import UserError
    from multibranch.experiment import list_presets, load_preset_dict, resolve_config
    from multibranch.models.counting import parameter_table
    from multibranch.tasks import model_for_counting

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
        if args.num_labels is not None and cfg.task != "classification":
            raise UserError(f"--num-labels applies to classification presets; {args.preset} is a {cfg.task} preset")
        model, counting = model_for_counting(cfg, args.vocab_size, args.num_labels)
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
