"""Checkpoint averaging (fairseq's average_checkpoints.py semantics, stricter checks).

`average_checkpoints(paths)`: the element-wise mean of the models' floating-point tensors,
accumulated in float64 and cast back to the newest checkpoint's dtype (a warning says so when the files
store different float dtypes, an fp16 export among fp32 checkpoints); integer and bool buffers
are copied from the newest checkpoint (highest meta step; the last path on ties). Every file must
have the same model config, tokenizer, keys, shapes and tie structure. Tied tensors (a shared
embedding stored under several keys) stay one tensor. The result carries no training state.

Checkpoints must share an origin (checkpoint/origin.py: the same run, or runs fine-tuned from the same
checkpoint); unrelated runs are refused unless force=True (a warning). Checkpoints written before
origins were recorded are averaged with a warning that this cannot be checked.

`select_checkpoints(run_dir, last=N | best=N | paths=[...], upper_bound=STEP)` picks files of a run
directory (`RUN/checkpoints/step_XXXXXXXX.pt`, as the trainer writes them).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from multibranch.checkpoint.format import (
    CheckpointError,
    config_differences,
    load_checkpoint,
    same_tokenizer,
    save_checkpoint,
    tied_groups,
)
from multibranch.checkpoint.origin import origin_of, shared_origin
from multibranch.config import ConfigError
from multibranch.convert.payload import refuse_overwrite
from multibranch.data.directories import CHECKPOINT, refuse_replacing
from multibranch.data.text import check_output_file
from multibranch.errors import UserError

log = logging.getLogger("multibranch.average")

STEP_FILE = re.compile(r"^step_(\d+)\.pt$")
# best=N ranks by the first of these that every candidate's validation scores have (1: higher is better)
BEST_METRICS = (("bleu", 1), ("accuracy", 1), ("loss", -1))


def average_checkpoints(paths: Sequence[str | Path], *, force: bool = False) -> dict[str, Any]:
    """Payload whose model is the mean of the given checkpoints' models (see module docstring)."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    sums: dict[str, Tensor] = {}
    reference: dict[str, Any] | None = None
    ref_path = ""
    aliases: dict[str, str] = {}
    newest: tuple[int, dict[str, Any], str] | None = None
    sources = []
    origins: dict[str, dict[str, str] | None] = {}
    dtypes: dict[str, str] = {}  # path -> the float dtypes its model stores
    for path in paths:
        payload = load_checkpoint(path)
        state = payload["model"]
        if reference is None:
            reference, ref_path, aliases = payload, str(path), tied_groups(state)
        else:
            _require_compatible(reference, ref_path, payload, str(path), aliases)
        for key, tensor in state.items():
            if key in aliases or not tensor.is_floating_point():
                continue
            value = tensor.detach().to(torch.float64)
            if key in sums:
                sums[key] += value
            else:
                sums[key] = value.clone()
        dtypes[str(path)] = _float_dtypes(state)
        meta = payload.get("meta") or {}
        origins[str(path)] = origin_of(meta)
        step = int(meta.get("step") or 0)
        sources.append({"path": str(path), "step": meta.get("step"), "valid": meta.get("valid")})
        if newest is None or step >= newest[0]:
            newest = (step, payload, str(path))
        del payload, state

    assert newest is not None
    _check_origins(origins, force)
    _, latest, latest_path = newest
    if len(set(dtypes.values())) > 1:
        other = next(path for path, kind in dtypes.items() if kind != dtypes[latest_path])
        log.warning("%s stores %s weights and %s %s: the average is stored in %s, as the newest checkpoint (%s)",
                    other, dtypes[other], latest_path, dtypes[latest_path], dtypes[latest_path], latest_path)
    out: dict[str, Tensor] = {}
    for key, tensor in latest["model"].items():
        if key in aliases:
            continue
        if tensor.is_floating_point():
            out[key] = (sums[key] / len(paths)).to(tensor.dtype)  # float64 mean, back to the stored dtype
        else:
            out[key] = tensor.clone()  # step counters, masks...: the newest checkpoint's
    for key, canonical in aliases.items():
        out[key] = out[canonical]  # tied stays tied
    state = {key: out[key] for key in latest["model"]}  # the original key order

    meta = {k: v for k, v in (latest.get("meta") or {}).items() if k != "valid"}  # scores do not carry over
    meta["averaged_from"] = sources
    meta["averaged_newest"] = latest_path
    return {"config": latest["config"], "model": state, "tokenizer": latest.get("tokenizer"), "meta": meta}


def _float_dtypes(state: dict[str, Tensor]) -> str:
    """The floating-point dtypes of a state dict's tensors, for messages: "float32", "float16", "bfloat16, float32"."""
    return ", ".join(sorted({str(t.dtype).removeprefix("torch.") for t in state.values() if t.is_floating_point()}))


def _require_compatible(
    ref: dict[str, Any], ref_path: str, other: dict[str, Any], path: str, aliases: dict[str, str]
) -> None:
    """CheckpointError naming `path` and the first offending key unless `other` can be averaged with `ref`."""
    a, b = ref["config"].get("model"), other["config"].get("model")
    if a != b:
        diff = config_differences(a, b, "model", *_labels(ref_path, path))[0]
        raise CheckpointError(f"{path}: model config differs from {ref_path} ({diff}); cannot average")
    if not same_tokenizer(ref.get("tokenizer"), other.get("tokenizer")):
        raise CheckpointError(f"{path}: tokenizer differs from {ref_path}; cannot average")
    s_ref, s_other = ref["model"], other["model"]
    missing = [k for k in s_ref if k not in s_other]
    extra = [k for k in s_other if k not in s_ref]
    if missing or extra:
        what = f"missing key {missing[0]!r}" if missing else f"unexpected key {extra[0]!r}"
        raise CheckpointError(f"{path}: {what} (compared with {ref_path}); cannot average")
    for key, tensor in s_ref.items():
        t = s_other[key]
        if tuple(t.shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{path}: {key} has shape {tuple(t.shape)}, {ref_path} has {tuple(tensor.shape)}; cannot average"
            )
        if t.is_floating_point() != tensor.is_floating_point():
            raise CheckpointError(f"{path}: {key} is {t.dtype}, {ref_path} has {tensor.dtype}; cannot average")
    if tied_groups(s_other) != aliases:
        raise CheckpointError(f"{path}: tied (shared) tensors differ from {ref_path}; cannot average")


def _labels(first: str, second: str) -> tuple[str, str]:
    """Names that tell two checkpoints apart: their file names, or their paths where the names agree (the best.pt
    of two runs)."""
    names = Path(first).name, Path(second).name
    return names if names[0] != names[1] else (first, second)


def _check_origins(origins: dict[str, dict[str, str] | None], force: bool) -> None:
    """CheckpointError (a warning with `force`) unless every checkpoint shares the first one's origin."""
    unknown = [path for path, origin in origins.items() if origin is None]
    if unknown:
        log.warning("cannot check that the checkpoints come from one run: %s record no origin (written by an older "
                    "multibranch)", ", ".join(unknown))
    known = [(path, origin) for path, origin in origins.items() if origin is not None]
    if not known:
        return
    ref_path, ref = known[0]
    strangers = [path for path, origin in known[1:] if not shared_origin(ref, origin)]
    if not strangers:
        return
    message = (f"{', '.join(strangers)} and {ref_path} come from unrelated runs (different run ids, not "
               "fine-tuned from the same checkpoint); their average is not a trained model")
    if not force:
        raise CheckpointError(f"{message}; pass --force to average them anyway")
    log.warning("--force: %s", message)


# ---- choosing checkpoints of a run ---------------------------------------------------------------


def run_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every `RUN/checkpoints/step_XXXXXXXX.pt`, by step."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        raise CheckpointError(f"{run_dir} is not a run directory (no checkpoints/ folder)")
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := STEP_FILE.match(p.name))]
    return sorted(found)


def read_meta(path: Path) -> dict[str, Any]:
    """A checkpoint's meta without reading its tensors into memory (mmap)."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:
        raise CheckpointError(f"{path} is corrupted or not a checkpoint ({type(err).__name__}: {err})") from None
    return dict(payload.get("meta") or {}) if isinstance(payload, dict) else {}


def select_checkpoints(
    run_dir: str | Path | None = None,
    *,
    last: int | None = None,
    best: int | None = None,
    paths: Sequence[str | Path] | None = None,
    upper_bound: int | None = None,
) -> list[Path]:
    """Checkpoints to average, oldest first.

    last=N: the N newest step checkpoints; best=N: the N with the best validation BLEU (higher is
    better), else accuracy (a classifier's; higher), else loss (lower), whichever every candidate
    has (BEST_METRICS); ties go to the newer step. `upper_bound`
    ignores checkpoints after that step (fairseq's --checkpoint-upper-bound). `paths`: exactly these.
    """
    if sum(x is not None for x in (last, best, paths)) != 1:
        raise ConfigError("choose exactly one of last=N, best=N or an explicit list of checkpoints")
    if paths is not None:
        if upper_bound is not None:
            raise ConfigError("upper_bound applies to last=N / best=N selection only")
        missing = [str(p) for p in paths if not Path(p).exists()]
        if missing:
            raise CheckpointError(f"checkpoint not found: {', '.join(missing)}")
        return [Path(p) for p in paths]
    count = last if last is not None else best
    if count is None or count < 1:
        raise ConfigError("the number of checkpoints to average must be >= 1")
    if run_dir is None:
        raise ConfigError("last=N / best=N need a run directory")
    candidates = [(s, p) for s, p in run_checkpoints(run_dir) if upper_bound is None or s <= upper_bound]
    bound = f" at or before step {upper_bound}" if upper_bound is not None else ""
    if len(candidates) < count:
        raise CheckpointError(
            f"asked for {count} checkpoints but {run_dir} has {len(candidates)}{bound} "
            f"(steps: {[s for s, _ in candidates]})"
        )
    if last is not None:
        return [p for _, p in candidates[-count:]]

    scored = [(step, path, read_meta(path).get("valid") or {}) for step, path in candidates]
    for metric, sign in BEST_METRICS:
        if all(valid.get(metric) is not None for _, _, valid in scored):
            # a NaN score (a diverged validation) ranks below every number, never among the best
            ranked = sorted(scored, key=lambda r: (math.isnan(r[2][metric]), -sign * r[2][metric], -r[0]))
            return [p for _, p, _ in sorted(ranked[:count], key=lambda r: r[0])]
    bad = next(str(p) for _, p, valid in scored if valid.get("loss") is None)
    raise CheckpointError(f"best=N needs validation scores in every checkpoint; {bad} has none")


@dataclass(frozen=True)
class AverageResult:
    """An average written: the checkpoint file and the checkpoints it is the mean of (oldest first)."""

    path: Path
    sources: list[Path]


def average_to_file(out: str | Path, *, checkpoints: Sequence[str | Path] | None = None,
                    run: str | Path | None = None, last: int | None = None, best: int | None = None,
                    upper_bound: int | None = None, force: bool = False) -> AverageResult:
    """Average `checkpoints`, or the `last` N / `best` N step checkpoints of `run` (up to `upper_bound`), into the
    weights-only checkpoint `out` (atomically). Never over one of its inputs, a run's last.pt or best.pt, or a file
    of another kind; over an existing average only with `force` (which also averages unrelated runs)."""
    if (run is None) == (checkpoints is None):
        raise UserError("give either --run RUN (with --last N or --best N) or --ckpts CKPT ...")
    if run is not None and last is None and best is None:
        raise UserError("--run needs --last N or --best N")
    if last is not None and best is not None:
        raise UserError("--last and --best: give one of them")
    if checkpoints is not None and (last is not None or best is not None or upper_bound is not None):
        raise UserError("--last/--best/--upper-bound select from --run; they cannot be combined with --ckpts")
    if checkpoints is not None:
        paths = select_checkpoints(paths=checkpoints)
    else:
        paths = select_checkpoints(run, last=last, best=best, upper_bound=upper_bound)
    check_output_file(str(out), [str(p) for p in paths], parent_must_exist=False)
    refuse_replacing(out, CHECKPOINT)
    refuse_overwrite(out, force)
    save_checkpoint(out, average_checkpoints(paths, force=force))
    return AverageResult(Path(out), [Path(p) for p in paths])
