"""What a training run directory holds, and which start it allows: a new run, --resume, --force, --auto-resume.

A start writes config.yaml, tokenizer/ and train.log (and metrics.jsonl as it logs) before its first checkpoint;
the first validation writes last.pt, then checkpoints/step_*.pt and best.pt. A run stopped in between (killed,
preempted) holds no checkpoint: nothing to resume, and nothing a fresh start would not write again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: runs are not locked
    fcntl = None  # type: ignore[assignment]

from multibranch.checkpoint.format import CheckpointError
from multibranch.data.directories import RUN, directory_kind, refuse_other_kind
from multibranch.errors import UserError

LAST = "last.pt"
# what a training run writes at its top level (train/trainer.py, figures: --plots), besides dotted temporaries
RUN_ENTRIES = frozenset({"config.yaml", "metrics.jsonl", "train.log", LAST, "best.pt", "checkpoints", "tokenizer",
                         "plots"})
LOCK = ".train.lock"  # held (flock) by the process training the run; the kernel releases it however that ends


def saved_checkpoints(run: Path) -> list[Path]:
    """The checkpoints `run` holds: last.pt, best.pt and checkpoints/step_*.pt (those that exist)."""
    named = [run / name for name in (LAST, "best.pt") if (run / name).exists()]
    return named + sorted((run / "checkpoints").glob("step_*.pt"))


def stopped_before_first_checkpoint(run: Path) -> bool:
    """Whether `run` is a run directory (config.yaml) that holds no checkpoint yet."""
    return directory_kind(run) == RUN and not saved_checkpoints(run)


def auto_resume(run_dir: str | Path, *, resume: bool = False, force: bool = False) -> tuple[bool, bool]:
    """(resume, force) of `train --auto-resume`: resume where RUN/last.pt exists; start over a run stopped before
    its first checkpoint (force); else a plain start (a new or empty directory; anything else is refused there).
    UserError when `resume` or `force` is asked for as well."""
    if resume or force:
        raise UserError("--auto-resume decides by itself whether to resume; leave out --resume and --force")
    run = Path(run_dir)
    if (run / LAST).exists():
        return True, False
    return False, stopped_before_first_checkpoint(run)


def check_output_parents(path: Path, what: str) -> None:
    """Refuse a directory to be made at `path` whose nearest existing ancestor is a file (reads only)."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise FileExistsError(f"{what} {path}: {parent} is a file, not a directory")
            return


def check_run_directory(run: Path, *, resume: bool, force: bool, init_from: Path | None = None) -> None:
    """Refuse an existing run without --resume/--force, a --resume without last.pt, and a --force start whose
    --init-from lies in the run it would empty (reads only); each refusal names what the directory allows."""
    if run.exists() and not run.is_dir():
        raise FileExistsError(f"run directory {run} exists and is not a directory")
    check_output_parents(run, "run directory")
    refuse_other_kind(run, RUN)
    if force and not resume and init_from is not None and run.is_dir() \
            and init_from.resolve().is_relative_to(run.resolve()):
        raise UserError(f"--init-from {init_from} is inside the run directory {run}, whose checkpoints --force "
                        "deletes; copy it out of the run first, or train into another --out")
    if resume:
        if not (run / LAST).exists():
            early = (" (the run stopped before its first checkpoint; start it over with --auto-resume or --force "
                     "instead of --resume)") if stopped_before_first_checkpoint(run) else ""
            raise CheckpointError(f"--resume: no {run / LAST} to resume from{early}")
        return
    if run.is_dir() and directory_kind(run) is None:
        foreign = sorted(path.name for path in run.iterdir()
                         if path.name not in RUN_ENTRIES and not path.name.startswith("."))  # dotfiles: temporaries
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise UserError(f"run directory {run} holds files of no training run ({shown}); training starts only in "
                            "a new or empty directory or a run's own, --force or not: choose another --out")
    if force or not run.exists() or not any(run.iterdir()):
        return
    if (run / LAST).exists():
        raise FileExistsError(f"run directory {run} already exists; pass --resume to continue it or --force to "
                              "start over")
    if stopped_before_first_checkpoint(run):
        raise FileExistsError(f"run directory {run} holds a run stopped before its first checkpoint (no {LAST} to "
                              "resume from); pass --auto-resume or --force to start it over")
    raise FileExistsError(f"run directory {run} already exists and holds no {LAST} to resume from; pass --force to "
                          "start over in it")


def check_outside_the_data(run: Path, data: Path, tensorboard: Path | None = None) -> None:
    """Refuse a run directory or a --tensorboard directory that is, or lies inside, the prepared data directory
    `data`, which `prepare --force` replaces whole (the run would go with it). Reads only."""
    for option, path in (("--out", run), ("--tensorboard", tensorboard)):
        if path is None or not path.resolve().is_relative_to(data.resolve()):
            continue
        where = "is" if path.resolve() == data.resolve() else "is inside"
        raise UserError(f"{option} {path} {where} the prepared data directory {data}, which `prepare --force` "
                        "replaces whole; write it outside the data")


def check_tensorboard_directory(tensorboard: Path, run: Path, *, resume: bool, force: bool) -> None:
    """Refuse a --tensorboard path that is a file, sits under a file, or is a recognised directory of another kind
    than this run (prepared data, another run, an export...); and, for a new run without --force, a folder that holds
    TensorBoard events already (a new run's events hide those of every step it logs: another run's curves would
    vanish from the board). Reads only."""
    if tensorboard.exists() and not tensorboard.is_dir():
        raise FileExistsError(f"--tensorboard {tensorboard} exists and is not a directory")
    check_output_parents(tensorboard, "--tensorboard")
    found = directory_kind(tensorboard)
    if found is not None and tensorboard.resolve() != run.resolve():
        raise UserError(f"--tensorboard {tensorboard} is a {found}; give an empty or new directory (or one inside "
                        "the run directory)")
    if not resume and not force and tensorboard.is_dir() and any(tensorboard.glob("events.out.tfevents.*")):
        raise FileExistsError(f"--tensorboard {tensorboard} holds the events of an earlier run, which this run's "
                              "would hide; give each run its own folder, or pass --force to start over in it")


def lock_run(run: Path) -> IO[str] | None:
    """Hold RUN/.train.lock for this process (None where files cannot be locked); UserError naming the process
    that holds it already. Keep the returned file open while training: closing it, or the process ending in any
    way, releases the lock."""
    if fcntl is None:
        return None
    handle = open(run / LOCK, "a+", encoding="utf-8")  # noqa: SIM115 (held open for the run)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise UserError(f"run directory {run} is being trained by {holder}; wait for it to end or stop it "
                        "(two processes writing one run would mix their checkpoints and metrics)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"process {os.getpid()}\n")
    handle.flush()
    return handle
