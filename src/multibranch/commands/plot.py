"""`multibranch plot RUN`: a run's curves as a report folder (default RUN/plots).

    multibranch plot RUN [--out DIR] [--window 10] [--points 200] [--force]

curves.json = {"run", "window", "train": {key: series}, "valid": {key: series}, "modules": {metric: series},
"schedules": {path: series}}; PNGs: curves.png, modules.png (if the run logged module metrics),
schedules.png (if it has non-zero rate schedules); index.md links them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "plot a training run: loss/ppl/lr/BLEU/tokens-per-s, logged module metrics (smoothed), rate schedules"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="training run directory (metrics.jsonl, config.yaml)")
    parser.add_argument("--out", default=None, help="report directory (default RUN/plots)")
    parser.add_argument("--window", type=int, default=10, help="moving-average window of the module metrics (records)")
    parser.add_argument("--points", type=int, default=200, help="points per schedule curve")
    parser.add_argument("--force", action="store_true", help="write into a non-empty --out")


def run(args: argparse.Namespace) -> int:
    from multibranch.analysis import curves, plots
    from multibranch.analysis.report import ReportFolder
    from multibranch.cli import UserError
    from multibranch.config import ConfigError, load_yaml
    from multibranch.experiment import ExperimentConfig

    if args.window < 1 or args.points < 2:
        raise UserError("--window must be >= 1 and --points >= 2")
    run_dir = Path(args.run)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory")
    out = Path(args.out) if args.out else run_dir / "plots"
    ReportFolder.check(out, args.force)
    records = curves.read_metrics(run_dir / "metrics.jsonl")
    if not records:
        raise UserError(f"{run_dir / 'metrics.jsonl'} has no records yet")
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: not a training run directory?")
    try:
        config = ExperimentConfig.from_dict(load_yaml(str(config_path)))
    except (ConfigError, ValueError, TypeError) as error:
        raise ConfigError(f"{config_path}: {error}") from None
    report = {"run": str(run_dir), "window": args.window, **curves.run_curves(records),
              "modules": curves.module_curves(records, args.window),
              "schedules": curves.schedule_curves(config, args.points)}

    folder = ReportFolder.create(out, args.force)
    folder.write_json("curves.json", report)
    lines = [f"# Training run `{run_dir}`", "", "Numbers: [curves.json](curves.json).", ""]
    if report["train"] or report["valid"]:
        folder.write_png("curves.png", plots.run_curves_plot(report))
        lines += ["## Training and validation", "", "![curves](curves.png)", ""]
    if report["modules"]:
        folder.write_png("modules.png", plots.module_curves_plot(report["modules"]))
        lines += ["## Module metrics", "", f"Logged module metrics; solid: moving average over {args.window} "
                  "records, faint: raw.", "", "![module metrics](modules.png)", ""]
    if report["schedules"]:
        folder.write_png("schedules.png", plots.schedule_curves_plot(report["schedules"]))
        lines += ["## Rate schedules", "", "Rates over the planned updates (train.max_steps).", "",
                  "![schedules](schedules.png)", ""]
    folder.write_text("index.md", "\n".join(lines))
    print(f"wrote {folder.path}: {', '.join(folder.files)}")
    return 0
