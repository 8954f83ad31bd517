"""A training run's curves as a report folder (`multibranch plot RUN`, and `train --plots` at every
validation): curves.json, curves.png, modules.png (if the run logged module metrics), schedules.png
(if it has non-zero rate schedules) and index.md.

curves.json = {"run", "window", "train": {key: series}, "valid": {key: series}, "modules": {metric: series},
"schedules": {path: series}}
"""

from __future__ import annotations

from pathlib import Path

from multibranch.config import ConfigError, load_yaml
from multibranch.experiment import ExperimentConfig
from multibranch.figures import curves, plots
from multibranch.figures.report import ReportFolder

# the report's files beside index.md: in a folder of other files, ReportFolder.check refuses them up front
REPORT_FILES = ("curves.json", "curves.png", "modules.png", "schedules.png")


class EmptyRunError(ValueError):
    """The run has logged no metrics yet."""


def plot_run(run_dir: str | Path, out: str | Path | None = None, window: int = 10, points: int = 200,
             force: bool = False) -> ReportFolder:
    """Write the report folder of `run_dir` into `out` (default RUN/plots); validates before writing."""

    if window < 1 or points < 2:
        raise ValueError("the moving-average window must be >= 1 and the schedule points >= 2")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory")
    out = Path(out) if out else run_dir / "plots"
    ReportFolder.check(out, force, REPORT_FILES)
    records = curves.read_metrics(run_dir / "metrics.jsonl")
    if not records:
        raise EmptyRunError(f"{run_dir / 'metrics.jsonl'} has no records yet")
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: not a training run directory?")
    try:
        config = ExperimentConfig.from_dict(load_yaml(str(config_path)))
    except (ConfigError, ValueError, TypeError) as error:
        raise ConfigError(f"{config_path}: {error}") from None
    report = {"run": str(run_dir), "window": window, **curves.run_curves(records),
              "modules": curves.module_curves(records, window),
              "schedules": curves.schedule_curves(config, points)}

    folder = ReportFolder.create(out, force, REPORT_FILES)
    folder.write_json("curves.json", report)
    lines = [f"# Training run `{run_dir}`", "", "Numbers: [curves.json](curves.json).", ""]
    if report["train"] or report["valid"]:
        folder.write_png("curves.png", plots.run_curves_plot(report))
        lines += ["## Training and validation", "", "![curves](curves.png)", ""]
    if report["modules"]:
        folder.write_png("modules.png", plots.module_curves_plot(report["modules"]))
        lines += ["## Module metrics", "", f"Logged module metrics; solid: moving average over {window} "
                  "records, faint: raw.", "", "![module metrics](modules.png)", ""]
    if report["schedules"]:
        folder.write_png("schedules.png", plots.schedule_curves_plot(report["schedules"]))
        lines += ["## Rate schedules", "", "Rates over the planned updates (train.max_steps).", "",
                  "![schedules](schedules.png)", ""]
    folder.write_text("index.md", "\n".join(lines))
    return folder
