"""Shared helpers for the benchmarks: data location, a trainer with its first batches, the Hugging Face Marian
peer's training update, peak memory, checkpoint sizes, the results files' environment block.

Benchmarks are not part of the test suite. They write JSON into bench/results/ and print a table; the
numbers quoted in docs/benchmarks.md come from those files, with the command that made them. Every
results file starts with `environment(amp=...)`: the date, commit and command, and the CPU model and the
autocast setting the numbers were measured with.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def work_dir() -> Path:
    """Scratch space for prepared data and runs ($MULTIBRANCH_BENCH_DIR, default runs/bench; git-ignored)."""
    path = Path(os.environ.get("MULTIBRANCH_BENCH_DIR", ROOT / "runs" / "bench"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def multi30k_dir() -> Path:
    """Where raw Multi30k is: $MULTIBRANCH_MULTI30K, else $MULTIBRANCH_SHARED_DATA/multi30k, else
    ../shared/data/multi30k beside the clone (it may not exist)."""
    if os.environ.get("MULTIBRANCH_MULTI30K"):
        return Path(os.environ["MULTIBRANCH_MULTI30K"])
    return Path(os.environ.get("MULTIBRANCH_SHARED_DATA", ROOT.parent / "shared" / "data")) / "multi30k"


def multi30k_raw() -> Path:
    """multi30k_dir(), or exit with the reason when the corpus is not there."""
    path = multi30k_dir()
    if not (path / "train.en").is_file():
        sys.exit(f"Multi30k not found at {path}; set MULTIBRANCH_MULTI30K or MULTIBRANCH_SHARED_DATA")
    return path


def multi30k_data(vocab_size: int = 8000) -> Path:
    """Multi30k En-De prepared with a joint SentencePiece vocabulary (prepared once, then reused)."""
    out = work_dir() / f"m30k-data-{vocab_size}"
    if not (out / "data.json").exists():
        from multibranch.data.parallel_prepare import PrepareConfig
        from multibranch.tasks.translation.prepare import prepare

        raw = multi30k_raw()
        prepare(PrepareConfig(src_lang="en", tgt_lang="de", train=str(raw / "train"), valid=str(raw / "val"),
                              test=[str(raw / "test_2016_flickr")], out=str(out), vocab_size=vocab_size))
    return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@contextmanager
def trainer_and_batches(cfg: Any, count: int, *, data: Path | None = None,
                        device: str = "auto") -> Iterator[tuple[Any, list[Any]]]:
    """A Trainer of the resolved config `cfg` on `data` (the prepared Multi30k by default), in a temporary run
    folder removed afterwards, and its first `count` collated training batches in the order training takes them
    (over as many epochs as that needs)."""
    from multibranch.tasks import task_for_data
    from multibranch.train.trainer import RunOptions, Trainer

    with tempfile.TemporaryDirectory() as tmp:
        options = RunOptions(data_dir=data or multi30k_data(), run_dir=Path(tmp) / "run", progress=False, device=device)
        trainer = Trainer(cfg, options, task_for_data)
        indices, epoch = [], 1
        while len(indices) < count:  # large batches: an epoch may hold fewer than `count`
            batches = trainer._epoch_batches(epoch)
            if not batches:
                raise SystemExit(f"{options.data_dir}: no training batches")
            indices += batches
            epoch += 1
        yield trainer, [trainer._collate(ix) for ix in indices[:count]]


def checkpoint_parameters(ckpt: Path) -> int:
    """Parameters stored in a checkpoint's weights, a tied tensor counted once."""
    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.checkpoint.payload import tied_groups

    state = load_checkpoint(ckpt)["model"]
    aliases = tied_groups(state)
    return sum(tensor.numel() for key, tensor in state.items() if key not in aliases)


def run_metrics(run: Path) -> list[dict[str, Any]]:
    """The records of a training run's metrics.jsonl."""
    from multibranch.figures.curves import read_metrics

    return read_metrics(run / "metrics.jsonl")


def hf_update(model: Any, optimizer: Any, loss_fn: Any, batch: Any, pad_id: int, *, clip_norm: float = 0.0,
              amp: str = "none") -> None:
    """One training update of an HF MarianMTModel as an HF user writes it: forward on the batch,
    label-smoothed CE (`loss_fn`, summed) on the fp32 logits divided by the target tokens, AdamW step."""
    import contextlib

    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    ctx = torch.autocast(batch.src.device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    with ctx:
        logits = model(input_ids=batch.src, attention_mask=batch.src.ne(pad_id), decoder_input_ids=batch.prev).logits
        loss = loss_fn(logits.float().view(-1, logits.shape[-1]), batch.tgt.view(-1))
    (loss / batch.n_tgt_tokens).backward()
    if clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def decoding_model(model: Any, precision: str) -> Any:
    """Our model to decode with in `precision` (inference/precision.py), or "fp32-unpacked": the model's own
    weights through F.linear (PyTorch's default GEMM), as every fp32 decode ran before the oneDNN packing;
    "<precision>-composed": the packed copy without its modules' fused kernels (the attention of
    modules/fused_attention.py, the residuals' add + LayerNorm), composed of PyTorch operations as before them."""
    if precision == "fp32-unpacked":
        return model.eval()
    from multibranch.inference.precision import for_decoding

    base, composed = precision.removesuffix("-composed"), precision.endswith("-composed")
    packed = for_decoding(model, base)
    if composed:  # the packed copy with its modules composed of PyTorch operations (no fused kernels)
        for module in packed.modules():
            if getattr(module, "fused", False):
                module.fused = False
    return packed


def run_isolated(module_args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `python bench/<script> ...` in a fresh process (its own peak RSS; `env` added to this one's) and parse
    its last JSON line."""
    code = os.pathsep.join([str(ROOT), str(ROOT / "src")])  # this checkout's code
    env = {**os.environ, **(env or {}), "PYTHONPATH": code}
    out = subprocess.run([sys.executable, *module_args], capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(module_args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def save_results(name: str, payload: dict[str, Any]) -> Path:
    """Write bench/results/NAME.json atomically (a temporary file renamed into place)."""
    from multibranch.atomic import atomic_write_text

    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")
    return path


CPUINFO = Path("/proc/cpuinfo")


def cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo's first "model name" line, else platform.processor(), else the
    architecture (platform.machine()), else "unknown"."""
    import platform

    try:
        for line in CPUINFO.read_text(encoding="utf-8", errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_native_bf16() -> bool:
    """Whether /proc/cpuinfo lists AVX512-BF16 or AMX-BF16: where a preset's `amp: auto` trains under bf16."""
    try:
        flags = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def preset_amp(preset: str, overrides: list[str] | None = None) -> str:
    """The autocast a `multibranch train --preset PRESET --set OVERRIDE ...` run uses on this machine's CPU:
    the setting, and for `auto` what it resolves to here ("auto: bf16" or "auto: none")."""
    import torch

    from multibranch.device import resolve_amp
    from multibranch.experiment import resolve_config

    setting = resolve_config(preset, None, list(overrides or [])).train.amp
    return setting if setting != "auto" else f"auto: {resolve_amp(setting, torch.device('cpu'))}"


def environment(*, amp: str | Mapping[str, str]) -> dict[str, Any]:
    """The environment block of a results file: the date (docs/benchmarks.md prints it under the table), commit,
    torch, threads, the CPU's architecture and model name, whether it computes bf16 natively, Python, the exact
    command, and the autocast setting of the run(s): `amp` is one setting for all ("none", "bf16", ...;
    inference runs without autocast, so "none") or one per system (`{"codegen-tiny": "auto: bf16", "tfidf-lr":
    "none"}`)."""
    import datetime
    import platform

    import torch

    if isinstance(amp, str):
        if not amp:
            raise ValueError("amp: give the autocast setting of the run(s), e.g. 'none'")
    elif not amp or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in amp.items()):
        raise ValueError(f"amp: a setting, or a non-empty mapping system -> setting; got {amp!r}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return {"date": datetime.date.today().isoformat(), "commit": commit, "torch": str(torch.__version__),
            "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
            "cpu_model": cpu_model(), "cpu_native_bf16": cpu_native_bf16(),
            "amp": amp if isinstance(amp, str) else dict(amp), "python": platform.python_version(),
            "command": " ".join([Path(sys.executable).name, *sys.argv])}
