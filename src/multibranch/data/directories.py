"""What an existing output holds, so that `--force` replaces only output of its own kind.

Directories, recognised by their marker files:
    prepared data         data.json of a prepared format                 (`prepare`)
    training run          config.yaml, last.pt, best.pt, checkpoints/    (`train`)
    analysis report       index.md + its numbers (heads.json, ...)       (`analyze ...`, `plot`)
    CTranslate2 model     model.bin + config.json                        (`convert ct2`)
    release export        config.json of format multibranch-export       (`convert export`)
    Hugging Face model    config.json with a model_type                  (`convert to-hf`)
Files:
    multibranch checkpoint  a torch.save archive of format multibranch-checkpoint (`average`, `convert ...`)

The one rule (`refuse_replacing`): an existing output may be replaced (with --force) only when it is
an empty directory or recognisably of the kind the command writes; anything else (another command's
output, a folder of notes, a text file) is refused with one line naming what it is, and nothing is
changed; and no checkpoint is written as a run's last.pt or best.pt, which belong to its training (with or
without --force). `refuse_other_kind` is the looser check of commands that write into a directory without
deleting what is there (`analyze` into a folder of notes): it refuses only another recognised kind.
`check_output_directory` is every check of a command that writes a whole directory (`prepare`, `convert`),
including that `--force` deletes no other command's output inside it (a training run kept in a data directory).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterable
from pathlib import Path

from multibranch.checkpoint.export import CONFIG_FILE, EXPORT_FORMAT
from multibranch.checkpoint.format import CT2_SETTINGS_FILE, HF_MARKER_FILE, RUN_DIR_MARKERS
from multibranch.checkpoint.payload import FORMAT as CHECKPOINT_FORMAT
from multibranch.data.meta import META_FILE
from multibranch.errors import UserError

REPORT_INDEX = "index.md"
# the numbers file each report writes beside its index.md (analyze heads/diversity/lengths/gates/attention/compare,
# plot): an index.md alone is any folder's (a documentation site's)
REPORT_DATA = ("heads.json", "diversity.json", "lengths.json", "gates.json", "attention.json", "compare.json",
               "curves.json")
RUN_CONFIG = "config.yaml"
CT2_WEIGHTS = "model.bin"
DATA_FORMATS = ("multibranch-data", "multibranch-classification-data")  # translation/code, classification

DATA, RUN, REPORT = "prepared data directory", "training run directory", "analysis report folder"
CT2, EXPORT, HF = "CTranslate2 model directory", "release export directory", "Hugging Face model folder"
CHECKPOINT = "multibranch checkpoint"
OTHER_DIRECTORY, OTHER_FILE = "directory of other files", "file"  # "PATH is a file, not a ..."
EMPTY = "empty directory"
# the checkpoints a run's training writes and reads again, which no other command may write over
RUN_CHECKPOINTS = {"last.pt": "which --resume continues from",
                   "best.pt": "the best validated weights, which its training compares against and replaces"}
DIRECTORY_KINDS = (DATA, RUN, REPORT, CT2, EXPORT, HF)
_JSON_LIMIT = 1 << 20  # marker JSON files are small; a larger one is not a marker


def _json_object(path: Path) -> dict:
    """The JSON object in `path`, or {} when it is missing, too large or not a JSON object."""
    try:
        if not path.is_file() or path.stat().st_size > _JSON_LIMIT:
            return {}
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def directory_kind(path: str | Path) -> str | None:
    """One of DIRECTORY_KINDS for a directory holding that kind's marker files; None otherwise."""
    path = Path(path)
    if not path.is_dir():
        return None
    if _json_object(path / META_FILE).get("format") in DATA_FORMATS:
        return DATA
    if any((path / name).exists() for name in (RUN_CONFIG, *RUN_DIR_MARKERS)):
        return RUN
    if (path / REPORT_INDEX).exists() and any((path / name).is_file() for name in REPORT_DATA):
        return REPORT
    config = path / CONFIG_FILE
    if ((path / CT2_WEIGHTS).is_file() and config.is_file()) or (path / CT2_SETTINGS_FILE).is_file():
        return CT2
    meta = _json_object(config)
    if meta.get("format") == EXPORT_FORMAT:
        return EXPORT
    if isinstance(meta.get("model_type"), str):
        return HF
    return None


def is_checkpoint_file(path: str | Path) -> bool:
    """True for a file written by `save_checkpoint`: a torch.save zip archive whose pickle names the
    multibranch checkpoint format (read without unpickling or loading any tensor)."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [name for name in archive.namelist() if name.endswith("/data.pkl") or name == "data.pkl"]
            return bool(pickles) and CHECKPOINT_FORMAT.encode() in archive.read(pickles[0])
    except (OSError, zipfile.BadZipFile, KeyError, ValueError):
        return False


def output_kind(path: str | Path) -> str | None:
    """What `path` is: None when it does not exist, EMPTY for an empty directory, one of DIRECTORY_KINDS,
    CHECKPOINT, or OTHER_DIRECTORY / OTHER_FILE for anything unrecognised."""
    path = Path(path)
    if path.is_dir():
        if not any(path.iterdir()):
            return EMPTY
        return directory_kind(path) or OTHER_DIRECTORY
    if path.is_file():
        return CHECKPOINT if is_checkpoint_file(path) else OTHER_FILE
    return OTHER_FILE if path.exists() or path.is_symlink() else None


def _refusal(path: str | Path, found: str, kind: str, option: str, error: type[UserError] = UserError) -> UserError:
    return error(f"{option} {path} is a {found}, not a {kind}; --force replaces only output of its own kind; "
                     f"choose another {option}")


def refuse_replacing(path: str | Path, kind: str, option: str = "--out", error: type[UserError] = UserError) -> None:
    """`error` (a UserError: one CLI line) unless `path` is absent, an empty directory, or recognisably of
    `kind` (with or without --force: what `--force` may then replace is only output of its own kind). A
    checkpoint is never written as a run's last.pt or best.pt: those belong to the run's training."""
    found = output_kind(path)
    if found is not None and found not in (EMPTY, kind):
        raise _refusal(path, found, kind, option, error)
    if kind == CHECKPOINT:
        refuse_run_checkpoint(path, option, error)


def refuse_run_checkpoint(path: str | Path, option: str = "--out", error: type[UserError] = UserError) -> None:
    """`error` when `path` is (or will be) the last.pt or best.pt of a training run, as written or resolved."""
    for candidate in (Path(path), Path(path).resolve()):
        role = RUN_CHECKPOINTS.get(candidate.name)
        if role is not None and directory_kind(candidate.parent) == RUN:
            raise error(f"{option} {path}: is the {candidate.name} of a training run, {role}; write to another file")
    refuse_run_step_checkpoint(path, option, error)


RUN_OWN_FILES = frozenset({RUN_CONFIG, "metrics.jsonl", "train.log", *RUN_CHECKPOINTS})
RUN_OWN_FOLDERS = frozenset({"checkpoints", "tokenizer"})


def refuse_replacing_file(path: str | Path, option: str = "--output", error: type[UserError] = UserError) -> None:
    """`error` when the file output `path` (a translation, a JSON report) would replace another command's output or
    be lost with it, with or without --force: an existing checkpoint; any file inside a prepared data directory, an
    export, a CTranslate2 or Hugging Face model folder (each written, and replaced, whole by its command); a training
    run's own files (config.yaml, metrics.jsonl, train.log, last.pt, best.pt) or anything in its checkpoints/ or
    tokenizer/. A file beside a run's own, in the run directory, passes. Reads only."""
    path = Path(path)
    if str(path) == "-":
        return
    if (path.exists() or path.is_symlink()) and output_kind(path) == CHECKPOINT:
        raise error(f"{option} {path}: is a {CHECKPOINT}; write to another file")
    resolved = path.resolve()
    parent = directory_kind(resolved.parent)
    if parent in (DATA, EXPORT, CT2, HF):
        raise error(f"{option} {path}: is inside the {parent} {resolved.parent}, which its own command writes and "
                    "replaces whole; write to another folder")
    run = resolved.parent.parent if resolved.parent.name in RUN_OWN_FOLDERS else resolved.parent
    if directory_kind(run) == RUN and (resolved.parent != run or resolved.name in RUN_OWN_FILES):
        raise error(f"{option} {path}: is a file the training run {run} keeps; write to another file")


def refuse_run_step_checkpoint(path: str | Path, option: str = "--out", error: type[UserError] = UserError) -> None:
    """`error` when `path` lies in a training run's checkpoints/ folder, whose step checkpoints the run's training
    writes, prunes and `average --last` reads."""
    folder = Path(path).resolve().parent
    if folder.name == "checkpoints" and directory_kind(folder.parent) == RUN:
        raise error(f"{option} {path}: is in the checkpoints/ folder of the training run {folder.parent}, which its "
                    "training keeps; write to another file")


# the file each command writes into a model folder of a kind other programs write too: --force replaces only those
OWN_MARKERS = {CT2: CT2_SETTINGS_FILE, HF: HF_MARKER_FILE}


def check_output_directory(out: str | Path, kind: str, *, force: bool, inputs: Iterable[str | Path] = (),
                           error: type[UserError] = UserError) -> None:
    """`error` (one CLI line naming `out`) when a command that writes the whole directory `out` must not: a
    file, a directory holding one of its `inputs`, another kind's output (`refuse_replacing`), or a
    non-empty directory without `force`. Reads only."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise error(f"{out}: exists and is not a directory; choose another --out")
    for path in inputs:
        if Path(path).resolve().is_relative_to(out.resolve()):
            raise error(f"{out}: holds the input {path}; choose another --out")
    refuse_replacing(out, kind, error=error)
    marker = OWN_MARKERS.get(kind)  # refusals --force cannot lift come before the advice to pass it
    if marker is not None and directory_kind(out) == kind and not (out / marker).is_file():
        raise error(f"{out}: is a {kind} without {marker}: written by another program (a downloaded model), or by "
                    "multibranch before it marked its folders; --force replaces only a folder it marked: delete it "
                    "yourself or choose another --out")
    held = outputs_inside(out)
    if held:
        shown = ", ".join(f"{path.relative_to(out)} ({what})" for path, what in held[:3])
        more = f" and {len(held) - 3} more" if len(held) > 3 else ""
        raise error(f"{out}: holds other commands' output, which replacing it would delete: {shown}{more}; move "
                    "it out first, or choose another --out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise error(f"{out}: exists and is not empty; pass --force to replace it")


def outputs_inside(directory: str | Path, depth: int = 2) -> list[tuple[Path, str]]:
    """(path, kind) of every recognised output inside `directory`, down to `depth` levels: directories of
    DIRECTORY_KINDS (a training run, an export...) and multibranch checkpoint files, the work a command that
    replaces `directory` whole must not delete. A recognised directory is listed, not searched."""
    found: list[tuple[Path, str]] = []
    try:
        children = sorted(Path(directory).iterdir())
    except OSError:  # absent or unreadable: nothing held
        return found
    for child in children:
        if child.is_symlink():
            continue
        if child.is_dir():
            kind = directory_kind(child)
            if kind is not None:
                found.append((child, kind))
            elif depth > 1:
                found += outputs_inside(child, depth - 1)
        elif child.suffix == ".pt" and is_checkpoint_file(child):
            found.append((child, CHECKPOINT))
    return found


def refuse_other_kind(path: str | Path, kind: str, option: str = "--out") -> None:
    """UserError if `path` is an existing directory of another recognised kind than `kind` (with or without
    --force); a directory of none of the kinds passes (for commands that only add files to it)."""
    found = directory_kind(path)
    if found is not None and found != kind:
        raise _refusal(path, found, kind, option)


