"""`multibranch info`: list presets; show a preset's or checkpoint's resolved config and parameter counts."""

from __future__ import annotations

import argparse

from multibranch.arguments import positive_int

HELP = "list presets, or print the resolved config and parameter counts of a preset or checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--list", action="store_true", help="list the named presets")
    source.add_argument("--preset", help="a preset name or YAML file (see --list)")
    source.add_argument("--ckpt", help="a checkpoint file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override of the --preset, e.g. model.heads=4 (repeatable)")
    parser.add_argument("--vocab-size", type=positive_int, metavar="N",
                        help="vocabulary size used to count a preset's parameters (default: the vocabulary the paper "
                             "counted with, for a preset that records its paper's size; else 8000)")
    parser.add_argument("--tgt-vocab-size", type=positive_int, metavar="N",
                        help="target vocabulary size, when it differs from --vocab-size (unshared vocabularies)")
    parser.add_argument("--num-labels", type=int, default=None, metavar="N",
                        help="number of labels used to count a classification preset's parameters "
                             "(default: the preset's classifier.num_labels, else 2)")
    parser.add_argument("--no-config", action="store_true", help="only the parameter table")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead (source, config unless --no-config, parameters by "
                             "part, total; with --list: the presets' names and descriptions) for scripts")


def run(args: argparse.Namespace) -> int:
    import json

    import yaml

    from multibranch.errors import UserError
    from multibranch.experiment import list_presets, load_preset_dict, resolve_config
    from multibranch.experiment.paper_sizes import paper_size
    from multibranch.models.counting import parameter_table
    from multibranch.tasks import model_for_counting

    if args.list:
        presets = {name: " ".join(load_preset_dict(name).get("description", "").split()) for name in list_presets()}
        if args.json:
            print(json.dumps({"presets": [{"name": name, "description": text} for name, text in presets.items()]},
                             indent=1))
            return 0
        for name, description in presets.items():
            print(f"{name:24s} {description}")
        return 0
    published = None
    if args.ckpt:
        from multibranch.loading.checkpoint import load_model

        loaded = load_model(args.ckpt)
        cfg, model = loaded.config, loaded.model
        meta = loaded.payload.get("meta", {})
        source = {"checkpoint": args.ckpt, "step": meta.get("step"), "valid": meta.get("valid")}
        heading = f"# checkpoint {args.ckpt}: step {meta.get('step')}, valid {meta.get('valid')}"
    else:
        cfg = resolve_config(args.preset, None, args.overrides)
        if args.num_labels is not None and cfg.task != "classification":
            raise UserError(f"--num-labels applies to classification presets; {args.preset} is a {cfg.task} preset")
        published = paper_size(args.preset)
        if args.tgt_vocab_size and not args.vocab_size:
            raise UserError("--tgt-vocab-size needs --vocab-size (the source vocabulary)")
        if args.vocab_size:
            vocab, tgt_vocab = args.vocab_size, args.tgt_vocab_size
        elif published:
            vocab, tgt_vocab = published.src_vocab, published.tgt_vocab
        else:
            vocab, tgt_vocab = 8000, None
        model, counting = model_for_counting(cfg, vocab, args.num_labels, tgt_vocab)
        source = {"preset": args.preset, "counting": counting}
        heading = f"# preset {args.preset} ({counting} for counting)"
    rows = parameter_table(model)
    total = sum(c for _, c in rows)
    paper = published.describe(total) if published and not args.vocab_size and not args.overrides else None
    if args.json:
        report = {"source": source, **({} if args.no_config else {"config": cfg.to_dict()}),
                  "parameters": dict(rows), "total": total, **({"paper": paper} if paper else {})}
        print(json.dumps(report, indent=1))
        return 0
    print(heading)
    if not args.no_config:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip())
    print("\n# parameters")
    width = max(len(k) for k, _ in rows)
    for key, count in rows:
        print(f"{key:{width}s} {count:>12,d}")
    print(f"{'total':{width}s} {total:>12,d}  ({total / 1e6:.2f}M)")
    if paper:
        print(f"# {paper}")
    return 0
