"""The training loop: token-batched, accumulated, validated, checkpointed, exactly resumable.

The trainer knows no task and no paper: data, model, batches, loss and validation come from the
task (multibranch.tasks, chosen by the prepared data's format and recorded as `cfg.task`); schedules,
projections, auxiliary losses and parameter groups come from the model's modules through
`ModuleHooks` (hooks.py).

Run directory:
    config.yaml            resolved experiment config
    tokenizer/             SentencePiece model(s) or HF tokenizer.json (also embedded in every checkpoint)
    checkpoints/step_*.pt  weights + meta at every validation (the last `keep_last`); not at a pause or interrupt
    best.pt, last.pt       best by `best_metric`; last also holds the full training state
                           (with train.ema_decay every checkpoint's weights are the weights' moving average, and
                           last.pt keeps the trained weights too: train/ema.py)
    metrics.jsonl          one record per log interval / validation
    train.log              the human log (every per-update line, even while a progress bar shows)

A start checks everything (config, data, device, --init-from, --resume compatibility) before it
creates or changes the run directory, then removes temporaries a killed save left behind. Every
checkpoint's meta carries the run's origin (checkpoint/origin.py) so `average` can refuse unrelated runs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
import yaml
from torch import Tensor, nn
from tqdm import tqdm

import multibranch
from multibranch import cpu_kernels
from multibranch.atomic import (
    atomic_write_bytes,
    atomic_write_text,
    full_disk_cause,
    full_disk_error,
    remove_stale_temporaries,
)
from multibranch.checkpoint.format import (
    CheckpointError,
    config_differences,
    load_checkpoint,
    load_state_strict,
    same_tokenizer,
    save_checkpoint,
    state_mismatch,
    unwrap,
)
from multibranch.checkpoint.origin import make_origin, new_run_id, origin_of, weights_fingerprint
from multibranch.config import ConfigError, config_hash
from multibranch.data.batching import shard_batches
from multibranch.device import resolve_amp, resolve_device
from multibranch.experiment import ExperimentConfig
from multibranch.experiment.training import RESUMABLE_CHANGES
from multibranch.figures import run_plots
from multibranch.hooks import ModuleHooks
from multibranch.interrupts import deferred_interrupt
from multibranch.malloc import keep_large_blocks
from multibranch.train import distributed as D
from multibranch.train.ema import WeightAverage
from multibranch.train.gradients import FlatGradients, broadcast_from_first_process
from multibranch.train.graphs import GraphedUpdates, upload
from multibranch.train.metrics_log import MetricsLog
from multibranch.train.optim import LRScheduler, build_optimizer, make_capturable, optimizer_state_to_save
from multibranch.train.rng import rng_state, seed_everything, set_rng_state
from multibranch.train.run_directory import (
    check_outside_the_data,
    check_run_directory,
    check_tensorboard_directory,
    lock_run,
)
from multibranch.train.task import Task
from multibranch.train.tensorboard import TensorBoardSink, check_tensorboard

log = logging.getLogger("multibranch.train")


class RunLogHandler(logging.FileHandler):
    """train.log; a full disk stops the run with one line (logging would print a traceback per record)."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        error = sys.exc_info()[1]
        cause = full_disk_cause(error) if error is not None else None
        if cause is not None:
            raise full_disk_error(self.baseFilename, cause) from error
        super().handleError(record)
# The per-update train lines: train.log always; the console only when no progress bar replaces them.
step_log = logging.getLogger("multibranch.train.steps")

# builds the task of a config and a prepared data directory (multibranch.tasks.task_for_data)
TaskFactory = Callable[[ExperimentConfig, Path], Task]

# Which training settings a resume may only change with which reset flag.
DATA_FIELDS = {"seed", "max_tokens", "max_sentences", "update_freq", "length_buckets", "length_multiple"}
DEFAULT_LENGTH_BUCKETS = 8  # with graphs: batch shapes per run (each shape one captured graph)
SCHEDULE_FIELDS = {"lr"}
DIVERGED_ADVICE = "lower the learning rate, raise the warm-up, or clip gradients harder"


@dataclass(frozen=True)
class ValidationEvent:
    """What a validation measured: the update, the epoch, the task's metrics and whether it is the best so far."""

    step: int
    epoch: int
    metrics: dict[str, Any]
    improved: bool


@dataclass(frozen=True)
class CheckpointEvent:
    """The checkpoints written at an update: last.pt (and the step's copy) always, best.pt when it improved."""

    step: int
    last: Path
    best: Path | None


# a callback of a run; returning True stops the run after this point (as a reached max_steps does)
RunCallback = Callable[[Any], "bool | None"]


@dataclass
class RunOptions:
    """Run-level choices that are not part of the experiment config."""

    data_dir: Path
    run_dir: Path
    resume: bool = False
    force: bool = False
    init_from: Path | None = None
    reset_optimizer: bool = False
    reset_schedule: bool = False
    reset_data: bool = False
    allow_new_tokenizer: bool = False  # with --resume: accept data prepared with another SentencePiece model
    device: str = "auto"
    progress: bool | None = None  # None: a bar only on a TTY
    stop_at_step: int | None = None  # pause after this update; schedules still plan for train.max_steps
    tensorboard: Path | None = None  # mirror metrics.jsonl into TensorBoard event files there (needs [tb])
    plots: bool = False  # redraw RUN/plots (as `multibranch plot RUN`) at every validation
    on_validation: RunCallback | None = None  # called with a ValidationEvent after each validation (main process)
    on_checkpoint: RunCallback | None = None  # called with a CheckpointEvent after each save (main process)


@dataclass
class TrainState:
    """Everything that moves during training (saved in last.pt for an exact resume)."""

    step: int = 0
    epoch: int = 1
    batch_in_epoch: int = 0
    best: float | None = None
    bad_validations: int = 0
    elapsed: float = 0.0
    last_valid: dict[str, Any] = field(default_factory=dict)
    length_buckets: int | None = None  # fixed batch shapes in use (kept so a resume batches the same way)
    validation_due: bool = False  # saved by an interrupt before this update's validation was recorded: it comes first


def _comparable_train(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k not in RESUMABLE_CHANGES}


def _pruned_heads(model: Any) -> list[str]:
    """"encoder.layer_heads [[3, ...]]" for each stack of a model config with per-layer head counts (pruned)."""
    if not isinstance(model, dict):
        return []
    return [f"{side}.layer_heads {model[side]['layer_heads']}" for side in ("encoder", "decoder")
            if isinstance(model.get(side), dict) and model[side].get("layer_heads") is not None]


class Trainer:
    """Everything is validated before the run directory is created or changed: config, data, device,
    the --init-from checkpoint and the --resume compatibility. Only then `_prepare_run_dir` writes."""

    def __init__(self, cfg: ExperimentConfig, opts: RunOptions, make_task: TaskFactory):
        self.cfg, self.opts = cfg, opts
        tcfg = cfg.train
        self.run_dir = Path(opts.run_dir)
        self.device = resolve_device(opts.device)
        self.dist = D.init_distributed(self.device.type)
        check_run_directory(self.run_dir, resume=opts.resume, force=opts.force, init_from=opts.init_from)
        check_outside_the_data(self.run_dir, Path(opts.data_dir), opts.tensorboard)
        if self.device.type == "cuda" and self.dist.enabled:
            self.device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(self.device)
        if tcfg.threads:
            torch.set_num_threads(tcfg.threads)
        # freed activations reused rather than unmapped each update (multibranch/malloc.py)
        self._malloc_note = keep_large_blocks() if self.device.type == "cpu" else None
        if tcfg.deterministic:
            torch.use_deterministic_algorithms(True)
        seed_everything(tcfg.seed + self.dist.rank)

        self.task = make_task(cfg, Path(opts.data_dir))
        if opts.resume:
            self.task.verify()  # files changed since `prepare` would silently change the data order
        self.tokenizer = self.task.tokenizer
        self.task.fill_config()

        self.model = self.task.build_model(cfg).to(self.device)
        if opts.init_from:
            self._init_from(opts.init_from)
        self.hooks = ModuleHooks(self.model)
        specs = self.hooks.parameter_groups()
        self.optimizer = build_optimizer(self.model, tcfg, specs)
        self.scheduler = LRScheduler(self.optimizer, tcfg.lr, cfg.model.d_model, specs, tcfg.max_steps)
        self.state = TrainState()
        self.amp = resolve_amp(tcfg.amp, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp == "fp16")
        self.config_hash = config_hash(self._model_sections(self.cfg.to_dict()))
        self.origin: dict[str, str] | None = None
        self._resumed_window: dict[str, Any] | None = None  # the log window last.pt saved (`_window_state`)
        self._resumed_average: dict[str, Any] | None = None  # the weights' moving average last.pt saved
        if opts.tensorboard is not None:
            check_tensorboard()
            check_tensorboard_directory(opts.tensorboard, self.run_dir, resume=opts.resume, force=opts.force)
        if opts.resume:
            self._resume()  # in memory only: refuses before anything on disk changes
        else:
            self.origin = make_origin(new_run_id(), weights_fingerprint(self.model.state_dict()),
                                      from_checkpoint=opts.init_from is not None)
        self._check_schedules()
        self.graphs = self._use_graphs()
        self._fix_shapes()

        # Everything checked: now the run directory may be created or changed.
        self._log_handler: logging.Handler | None = None
        self._lock: IO[str] | None = None  # RUN/.train.lock, held while this process may write the run
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", enabled=self.dist.is_main)
        self._prepare_run_dir()
        if opts.tensorboard is not None and self.dist.is_main:
            # events of steps this run will (re)write are dropped: after the resumed step, or all on a fresh start
            self.metrics.sinks.append(TensorBoardSink(opts.tensorboard, self.state.step + 1 if opts.resume else 0))
        if opts.resume:
            self.metrics.truncate_after(self.state.step)
        self._saved_at = self.state.step if opts.resume else -1
        self._stop_requested = False  # a callback asked the run to stop
        self._warned_divergence = False  # a non-finite training loss has been reported
        self.train_model: nn.Module = self.model
        # Data parallelism: fixed-shape runs (and so graphs) average the gradients themselves, in one collective
        # after the backward (train/gradients.py); other runs hand the model to DDP.
        self.own_gradient_mean = self.dist.enabled and self.state.length_buckets is not None
        if self.own_gradient_mean:
            broadcast_from_first_process(self.model)
        elif self.dist.enabled:
            self.train_model = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=self.hooks.may_skip_parameters,
            )
        # the weights' moving average, of every process's identical weights (a resume continues last.pt's, or starts
        # one from the weights where the run had none)
        self.ema = WeightAverage(self.model, tcfg.ema_decay, tcfg.ema_start) if tcfg.ema_decay else None
        if self.ema is not None and self._resumed_average is not None:
            self.ema.load(self._resumed_average)
        self._resumed_average = None
        # What an update reads or reports lives on the device: no update waits for the host or makes it wait.
        self._local_size = torch.zeros((), device=self.device)  # this process's target tokens of the update
        self._update_size = torch.zeros((), device=self.device)  # target tokens of the update, all processes
        self._scale = torch.zeros((), device=self.device)  # world size / target tokens of the update
        self._sums: dict[str, Tensor] = {}  # size, loss, nll, the task's counts: summed over the log window (fp64)
        self._last: dict[str, Tensor] = {}  # grad_norm, aux_*: the last update's
        self._window = self._empty_window()  # what the host sums over the log window (the update time)
        if self._resumed_window is not None:
            self._restore_window(self._resumed_window)
        # fixed shapes: the gradients stay in one buffer, zeroed in place (built after the first backward)
        self.gradients: FlatGradients | None = None
        self.graphed: GraphedUpdates | None = None
        if self.graphs:
            make_capturable(self.optimizer, self.device)
            self.graphed = GraphedUpdates(self.device, on_failure=self._after_failed_capture)

    # ---- set-up ----------------------------------------------------------------------------------

    @staticmethod
    def _model_sections(cfg: dict[str, Any]) -> dict[str, Any]:
        """The config sections that define the model (a translation run's are just "model", as before tasks)."""
        if cfg.get("task", "translation") == "translation":
            return {"model": cfg["model"]}
        return {k: cfg.get(k) for k in ("model", "task", "classifier")}

    def _init_from(self, path: Path) -> None:
        """Load --init-from weights; a mismatch names the differing config fields (else the tensors).
        Weights imported with a Hugging Face tokenizer need data prepared with that tokenizer."""
        payload = load_checkpoint(path)
        tokenizer = payload.get("tokenizer")
        if tokenizer and "hf_json" in tokenizer and not same_tokenizer(tokenizer, self.tokenizer.to_state()):
            raise CheckpointError(f"--init-from {path}: its weights expect the ids of its Hugging Face tokenizer, "
                                  f"but {self.opts.data_dir} was prepared with another tokenizer; prepare it with "
                                  "`multibranch prepare --task classify --hf-tokenizer DIR` (DIR: the imported model)")
        self.task.check_init_from(payload["config"], path)
        if state_mismatch(self.model.state_dict(), payload["model"]):
            pruned = _pruned_heads(payload["config"].get("model"))
            if pruned and pruned != _pruned_heads(self.cfg.to_dict()["model"]):
                raise CheckpointError(f"--init-from {path}: a pruned checkpoint ({'; '.join(pruned)}) has other "
                                      "head counts than this config's layers; without --preset and --config, train "
                                      "uses the checkpoint's own config")
            differences = config_differences(payload["config"].get("model"), self.cfg.to_dict()["model"], "model",
                                             "checkpoint", "config")
            if differences:
                more = f"; ... ({len(differences) - 8} more)" if len(differences) > 8 else ""
                raise CheckpointError(f"--init-from {path}: the checkpoint was trained with another model config "
                                      f"({'; '.join(differences[:8])}{more})")
        load_state_strict(self.model, payload["model"], str(path))
        log.info("initialised weights from %s", path)

    def _prepare_run_dir(self) -> None:
        """Create (or, with --force, clear) the run directory; remove temporaries of a killed save;
        write config.yaml and the tokenizer; attach train.log. Called only after every check passed."""
        run = self.run_dir
        D.barrier(self.dist)  # every rank has checked the run directory before rank 0 changes it
        if self.dist.is_main:
            run.mkdir(parents=True, exist_ok=True)
            self._lock = lock_run(run)  # before anything in it changes: another train may be writing it
            if self.opts.force and not self.opts.resume and run.exists():
                for name in ("metrics.jsonl", "last.pt", "best.pt", "train.log"):
                    (run / name).unlink(missing_ok=True)
                for old in (run / "checkpoints").glob("step_*.pt"):
                    old.unlink()
            (run / "checkpoints").mkdir(parents=True, exist_ok=True)
            (run / "tokenizer").mkdir(exist_ok=True)
            self._log_handler = RunLogHandler(run / "train.log", encoding="utf-8")
            self._log_handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(message)s"))
            logging.getLogger("multibranch").addHandler(self._log_handler)
            removed = [p for folder in (run, run / "checkpoints", run / "tokenizer")
                       for p in remove_stale_temporaries(folder)]
            if removed:
                log.warning("removed %d temporary file(s) left by an interrupted write: %s", len(removed),
                            ", ".join(str(p) for p in removed))
            atomic_write_text(run / "config.yaml", yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))
            for name, content in self.tokenizer.files().items():
                atomic_write_bytes(run / "tokenizer" / name, content)
        D.barrier(self.dist)

    def _close_log(self) -> None:
        if self._log_handler is not None:
            logging.getLogger("multibranch").removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None
        if self._lock is not None:  # the run is this process's no longer
            self._lock.close()
            self._lock = None

    def _check_schedules(self) -> None:
        """Fail before training if a rate schedule needs a number of updates nobody gave."""
        self.hooks.update_start(self.state.step, self.cfg.train.lr.warmup, self.cfg.train.max_steps)

    def _graphs_blocker(self) -> str | None:
        """Why this run cannot replay its updates as CUDA graphs (None: it can)."""
        if self.device.type != "cuda":
            return f"training runs on {self.device.type}, not CUDA"
        if self.amp == "fp16":
            return "fp16 autocast's loss scaler reads the device every update (bf16 needs none)"
        if not self.task.supports_fixed_shapes:
            return f"the {self.task.name} task has no fixed-shape batches"
        return None

    def _use_graphs(self) -> bool:
        """train.graphs resolved: "on" refuses (ConfigError) where graphs cannot run, "auto" falls back to eager."""
        mode = self.cfg.train.graphs
        if mode == "off":
            return False
        blocker = self._graphs_blocker()
        if blocker is not None and mode == "on":
            raise ConfigError(f"train.graphs=on (--graphs on) cannot run here: {blocker}; use --graphs auto or off")
        return blocker is None

    def _fix_shapes(self) -> None:
        """Fixed batch shapes: train.length_buckets, else the resumed run's, else 8 where graphs run."""
        count = self.cfg.train.length_buckets
        if count is None:
            count = self.state.length_buckets if self.opts.resume else None
        if count is None and self.graphs:
            count = DEFAULT_LENGTH_BUCKETS
        self.state.length_buckets = count
        if count is None:
            return
        shapes = self.task.use_length_buckets(count)  # refuses data it cannot bucket, before anything is written
        self._shapes_note = f"{len(shapes)} fixed batch shapes (rows x length): " + ", ".join(
            "x".join(map(str, shape[:2])) for shape in shapes)

    def _resume(self) -> None:
        """Check that last.pt can continue with this config and data, then load it (in memory only)."""
        path = self.run_dir / "last.pt"
        payload = load_checkpoint(path)
        training = payload.get("training")
        if training is None:
            raise CheckpointError(f"{path} holds no training state (was it averaged or converted?)")
        saved = ExperimentConfig.from_dict(payload["config"]).to_dict()  # fields added since: their defaults
        now = self.cfg.to_dict()
        if self._model_sections(saved) != self._model_sections(now):
            differences = config_differences(self._model_sections(saved), self._model_sections(now), "config",
                                             "run has", "now")
            raise CheckpointError(
                f"cannot resume {self.run_dir}: the model config differs from the saved one "
                f"({'; '.join(differences)}); start a new run (use --init-from to reuse weights)"
            )
        old_train, new_train = _comparable_train(saved["train"]), _comparable_train(now["train"])
        changed = {k for k in set(old_train) | set(new_train) if old_train.get(k) != new_train.get(k)}

        def describe(fields: set[str]) -> str:
            lines = [line for k in sorted(fields)
                     for line in config_differences(old_train.get(k), new_train.get(k), f"train.{k}", "run has", "now")]
            return "; ".join(lines)

        needs = []
        if changed & DATA_FIELDS and not self.opts.reset_data:
            needs.append(f"batching changed ({describe(changed & DATA_FIELDS)}): --reset-data")
        if changed & SCHEDULE_FIELDS and not self.opts.reset_schedule:
            needs.append(f"the LR schedule changed ({describe(changed & SCHEDULE_FIELDS)}): --reset-schedule")
        other = changed - DATA_FIELDS - SCHEDULE_FIELDS
        if other and not self.opts.reset_optimizer:
            needs.append(f"optimisation settings changed ({describe(other)}): --reset-optimizer")
        if payload["meta"].get("data_fingerprint") != self.task.fingerprint and not self.opts.reset_data:
            needs.append("the prepared data differs from the run's (fingerprint mismatch): --reset-data")
        saved_tokenizer = payload.get("tokenizer")
        new_tokenizer = saved_tokenizer is not None and not same_tokenizer(saved_tokenizer, self.tokenizer.to_state())
        if new_tokenizer and not self.opts.allow_new_tokenizer:
            needs.append("the data was prepared with another SentencePiece model than the run's (the same ids would "
                         "mean other pieces): --allow-new-tokenizer")
        if needs:
            raise CheckpointError(f"refusing to resume {self.run_dir}: " + "; ".join(needs) + " (flags accept the change)")
        if new_tokenizer:
            log.warning("--allow-new-tokenizer: the run continues with the data's SentencePiece model, not the one "
                        "it was trained with; expect the loss to jump")
        if saved["train"].get("max_steps") != now["train"].get("max_steps"):
            log.warning("train.max_steps: run has %s, now %s; schedules planned to the last update (a cosine LR, "
                        "DropHead's V, the Weighted Transformer's kappa/alpha freeze, rates without their own total) "
                        "now run to %s from here on", saved["train"].get("max_steps"), now["train"].get("max_steps"),
                        now["train"].get("max_steps"))
        # with a moving average, the checkpoint's weights are the average and the trained ones are kept beside it
        load_state_strict(self.model, training.get("raw_model", payload["model"]), str(path))
        if "raw_model" in training:
            self._resumed_average = payload["model"]
        st = training["state"]
        self.state = TrainState(**st)
        if not self.opts.reset_optimizer:
            self.optimizer.load_state_dict(training["optimizer"])
            if training.get("scaler"):
                self.scaler.load_state_dict(training["scaler"])
        if self.opts.reset_schedule:
            self.state.step = 0
        if self.opts.reset_data:
            self.state.epoch, self.state.batch_in_epoch = 1, 0
        self.origin = origin_of(payload["meta"])
        if self.origin is None:
            log.warning("%s was written before runs recorded their origin; its checkpoints cannot be checked by "
                        "`average`", path)
        rng = training["rng"]
        windows = training.get("log_window")  # absent in runs saved before the window was kept
        if windows and len(windows) == self.dist.world_size and not self.opts.reset_schedule:
            self._resumed_window = windows[self.dist.rank]
        if len(rng) != self.dist.world_size:
            log.warning("resuming with %d processes instead of %d: data order and dropout will not repeat exactly",
                        self.dist.world_size, len(rng))
        set_rng_state(rng[min(self.dist.rank, len(rng) - 1)])
        log.info("resuming %s at update %d (epoch %d, batch %d)", self.run_dir, self.state.step, self.state.epoch,
                 self.state.batch_in_epoch)

    # ---- batches ---------------------------------------------------------------------------------

    def _epoch_batches(self, epoch: int) -> list:
        return shard_batches(self.task.train_batches(epoch), self.dist.rank, self.dist.world_size)

    def _collate(self, indices):
        return upload(self.task.collate(indices, torch.device("cpu")), self.device)

    # ---- one update ------------------------------------------------------------------------------

    def _autocast(self):
        if self.amp == "none":
            return contextlib.nullcontext()
        # a captured graph must cast the weights it reads itself: no cast copies cached from an eager update
        return torch.autocast(self.device.type, dtype=torch.bfloat16 if self.amp == "bf16" else torch.float16,
                              cache_enabled=not self.graphs)

    def _update(self, batches: list) -> dict[str, float]:
        """One update over `batches`: the host sets what changes (schedules, learning rates, this process's
        sample count), the device does the rest (`_begin_update`, `_forward_backward` per batch, `_average_gradients`,
        `_step`; where graphs are on, the batches' and the step's pieces are replayed CUDA graphs).
        Returns what the host knows without reading the device: the learning rate."""
        t = self.cfg.train
        self.train_model.train()
        self.hooks.update_start(self.state.step, t.lr.warmup, t.max_steps)
        lrs = self.scheduler.set_step(self.state.step + 1)
        self._local_size.fill_(float(sum(self.task.sample_size(b) for b in batches)))
        self._begin_update()
        for i, batch in enumerate(batches):
            first, last = i == 0, i == len(batches) - 1
            if self.graphed is not None:
                self.graphed.run("first batch" if first else "batch",
                                 lambda b, first=first, last=last: self._forward_backward(b, first, last), batch)
            else:
                self._forward_backward(batch, first, last)
        self._average_gradients()
        if self.graphed is not None:
            self.graphed.run("step", lambda _: self._step())
        else:
            self._step()
        self.state.step += 1
        if self.ema is not None:
            self.ema.update(self.state.step)
        return {"lr": lrs["main"]}

    def _begin_update(self) -> None:
        """The update's size over every process and the loss normaliser world size / size, on the device."""
        self._update_size.copy_(self._local_size)
        D.all_reduce_(self._update_size, self.dist)
        torch.div(self.dist.world_size, self._update_size, out=self._scale)
        self._accumulate("size", self._local_size)

    def _forward_backward(self, batch: Any, first: bool, last: bool) -> None:
        """Loss of one batch, scaled by the update's normaliser, backward into the gradients (the update's first
        batch adds the modules' auxiliary losses); the logged sums grow on the device."""
        sync = contextlib.nullcontext() if (last or self.train_model is self.model) else self.train_model.no_sync()
        with sync:
            with self._autocast():
                loss, nll, batch_counts = self.task.loss(self.train_model, self.model, batch)
            objective = loss * self._scale
            if first:
                extras = self.hooks.extra_losses(update_tokens=self._update_size, world_size=self.dist.world_size)
                for name, value in extras.items():
                    objective = objective + value
                    self._keep_last(f"aux_{name}", value)
            self.scaler.scale(objective).backward()
        self._accumulate("loss", loss)
        self._accumulate("nll", nll)
        for name, value in batch_counts.items():
            self._accumulate(name, torch.as_tensor(value))

    def _average_gradients(self) -> None:
        """Fixed shapes: the gradients move into their buffer after the first backward; with several processes
        they are averaged there (DDP averaged them during the backward otherwise)."""
        if self.state.length_buckets is None:
            return
        if self.gradients is None:
            self.gradients = FlatGradients.adopt(self.model.parameters())
        if self.own_gradient_mean:
            self.gradients.average_over_processes(self.dist.world_size)

    def _step(self) -> None:
        """Clipping, one optimizer step, the modules' post-step projections, and the gradients back to zero."""
        t = self.cfg.train
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        if t.clip_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, t.clip_norm)
        else:
            grad_norm = total_grad_norm(params)
        self._keep_last("grad_norm", grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.gradients is not None:
            self.gradients.zero_()
        else:
            self.optimizer.zero_grad(set_to_none=True)
        self.hooks.after_optimizer_step()

    def _after_failed_capture(self) -> None:
        """A capture records and runs nothing, but its backward may have replaced gradients: point them back."""
        if self.gradients is not None and not self.gradients.attached():
            self.gradients.attach()

    def _accumulate(self, name: str, value: Tensor) -> None:
        """Add `value` to the log window's device sum `name` (in place: a captured graph keeps adding)."""
        if name not in self._sums:
            self._sums[name] = torch.zeros((), dtype=torch.float64, device=self.device)
        self._sums[name].add_(value.detach().reshape(()).to(self._sums[name].device, torch.float64))

    def _keep_last(self, name: str, value: Tensor) -> None:
        if name not in self._last:
            self._last[name] = torch.zeros((), dtype=torch.float64, device=self.device)
        self._last[name].copy_(value.detach().reshape(()))

    def _window_state(self) -> dict[str, Any]:
        """The log window so far (its device sums read back, exactly: fp64), for last.pt: a resume continues the
        window, so that the train lines after it log what an uninterrupted run logs."""
        names = list(self._sums)
        values = torch.stack(list(self._sums.values())).tolist() if names else []
        return {"sums": dict(zip(names, values)), **self._window}

    def _restore_window(self, saved: dict[str, Any]) -> None:
        """Continue the log window `_window_state` saved."""
        for name, value in saved["sums"].items():
            self._sums[name] = torch.tensor(value, dtype=torch.float64, device=self.device)
        self._window = {**self._empty_window(), **{k: v for k, v in saved.items() if k != "sums"}}

    def _read_window(self) -> dict[str, float]:
        """The log window's sums and last values, read back from the device at once; the sums restart at 0."""
        names = [*self._sums, *self._last]
        values = torch.stack([*self._sums.values(), *self._last.values()]).tolist() if names else []
        for total in self._sums.values():
            total.zero_()
        return dict(zip(names, values))

    # ---- validation ------------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """The task's validation metrics (loss, ...) on the main process: of the weights' moving average where the
        run keeps one."""
        with self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext():
            return self.task.validate(self.model.eval(), self.device, self._autocast, self.opts.progress)

    # ---- checkpoints -----------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        return {
            "step": self.state.step, "epoch": self.state.epoch, "valid": {
                k: v for k, v in self.state.last_valid.items() if k in ("loss", "nll", "ppl", "bleu", "accuracy", "macro_f1", "pov",
                                                                  "sentence_bleu")},
            "config_hash": self.config_hash, "data_fingerprint": self.task.fingerprint,
            **({"origin": self.origin} if self.origin else {}),
            "multibranch_version": multibranch.__version__, "torch_version": str(torch.__version__),
        }

    def save(self, improved: bool, numbered: bool = True) -> None:
        """last.pt (+ training state), step checkpoint (unless not `numbered`: a pause or an interrupt, which
        the uninterrupted run would not have checkpointed), best.pt; all atomic; rank 0 writes. A Ctrl-C while
        saving is held back until the files are written; a second one abandons the file being written
        (its temporary is removed, the previous file stays)."""
        rngs = D.all_gather_objects(rng_state(), self.dist)
        windows = D.all_gather_objects(self._window_state(), self.dist)
        if not self.dist.is_main:
            self._saved_at, self._saving = self.state.step, False
            return
        model = unwrap(self.model)
        weights = self.ema.model_state(model) if self.ema is not None else model.state_dict()
        base = {"config": self.cfg.to_dict(), "model": weights, "tokenizer": self.tokenizer.to_state(),
                "meta": self._meta()}
        training = {"state": self.state.__dict__.copy(), "optimizer": optimizer_state_to_save(self.optimizer),
                    "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None, "rng": rngs,
                    "log_window": windows}
        if self.ema is not None:  # the checkpoint's weights are the average; a resume continues from these
            training["raw_model"] = model.state_dict()
        self._saving = True  # stays set if a signal stops the save: `_stop_on_interrupt` then saves nothing more
        with deferred_interrupt():  # Ctrl-C/SIGTERM: the save finishes first, then the clean "interrupted" exit
            save_checkpoint(self.run_dir / "last.pt", {**base, "training": training})  # first: resume needs it
            if numbered:
                save_checkpoint(self.run_dir / "checkpoints" / f"step_{self.state.step:08d}.pt", base)
            if improved:
                save_checkpoint(self.run_dir / "best.pt", base)
            kept = sorted((self.run_dir / "checkpoints").glob("step_*.pt"))
            for old in kept[: max(len(kept) - self.cfg.train.keep_last, 0)]:
                old.unlink()
            self._saved_at = self.state.step
        self._saving = False

    # ---- the loop --------------------------------------------------------------------------------

    def _stop_reason(self, start: float) -> str | None:
        t, s = self.cfg.train, self.state
        if t.max_steps is not None and s.step >= t.max_steps:
            return f"reached max_steps={t.max_steps}"
        if self._stop_requested:
            return f"stopped by a callback at update {s.step}"
        if self.opts.stop_at_step is not None and s.step >= self.opts.stop_at_step:
            return f"paused at update {s.step} (--stop-at-step); continue with --resume"
        if t.max_minutes is not None and s.elapsed + time.perf_counter() - start >= 60 * t.max_minutes:
            return f"reached max_minutes={t.max_minutes}"
        if t.patience is not None and s.bad_validations >= t.patience:
            return f"no improvement of valid {t.best_metric} for {t.patience} validations"
        return None

    def _validate_and_save(self, start: float) -> None:
        self._validating = True  # until the save: an interrupt saves last.pt with the validation due
        result = self.validate() if (self.task.has_valid and self.dist.is_main) else {}
        result = D.broadcast_object(result, self.dist)
        with deferred_interrupt():  # the validation's record, the state and the save go together
            self._saving = True  # a second signal stops them part way: nothing more is saved then
            improved = self._record_validation(result)
            self.state.validation_due = self._validating = False
            self.state.elapsed += time.perf_counter() - start
            self.save(improved)
        self._run_callbacks(result, improved)
        if self.opts.plots and self.dist.is_main:
            self._plot()

    def _record_validation(self, result: dict[str, Any]) -> bool:
        """Log a validation's `result` (metrics.jsonl, train.log) and keep its best and patience in the state;
        whether it is the best so far."""
        t = self.cfg.train
        improved = False
        if result:
            name = next((n for n in (t.best_metric, self.task.best_metric) if n != "loss" and n in result), "loss")
            metric = -result["loss"] if name == "loss" else result[name]
            finite = math.isfinite(metric)
            if not finite:  # a diverged model (NaN or infinite loss) is never the best one
                log.warning("valid %s is %s at update %d: the training has diverged (%s)", name, metric,
                            self.state.step, DIVERGED_ADVICE)
            improved = finite and (self.state.best is None or metric > self.state.best)
            if improved:
                self.state.best, self.state.bad_validations = metric, 0
            else:
                self.state.bad_validations += 1
            samples = result.pop("samples", [])
            self.state.last_valid = result
            self.metrics.write({"type": "valid", "step": self.state.step, "epoch": self.state.epoch,
                                **{k: v for k, v in result.items()}, "best": self.state.best})
            log.info("valid | step %d | %s%s", self.state.step, self.task.describe_valid(result),
                     " | new best" if improved else "")
            for src, hyp, ref in samples:
                log.debug("  src: %s\n  hyp: %s\n  ref: %s", src, hyp, ref)
        return improved

    def _run_callbacks(self, result: dict[str, Any], improved: bool) -> None:
        """The run's callbacks (main process) after a validation and its save; True from any stops every process."""
        stop = False
        if self.dist.is_main:
            if result and self.opts.on_validation is not None:
                stop |= bool(self.opts.on_validation(ValidationEvent(self.state.step, self.state.epoch, dict(result),
                                                                     improved)))
            if self.opts.on_checkpoint is not None:
                best = self.run_dir / "best.pt" if improved else None
                stop |= bool(self.opts.on_checkpoint(CheckpointEvent(self.state.step, self.run_dir / "last.pt", best)))
        self._stop_requested = bool(D.broadcast_object(stop, self.dist))

    def _plot(self) -> None:
        """Redraw RUN/plots from metrics.jsonl; a failure is logged, never fatal to the training."""
        try:
            run_plots.plot_run(self.run_dir, force=True)
        except Exception as error:  # plots are a by-product: the run must go on
            log.warning("could not draw %s: %s", self.run_dir / "plots", error)

    def train(self) -> TrainState:
        try:
            return self._train()
        finally:
            self.metrics.close()
            self._close_log()

    def _train(self) -> TrainState:
        t, s = self.cfg.train, self.state
        if self.device.type == "cpu":
            cpu_kernels.kernels()  # dropout's: built now (the first time on a machine), not inside the first update
        n_params = sum(p.numel() for p in self.model.parameters())
        log.info("%s model: %s, %.2fM parameters | data: %d training examples | %d process(es) on %s, "
                 "%d thread(s), autocast %s", self.task.name, self.task.describe_model(), n_params / 1e6,
                 self.task.train_size, self.dist.world_size, self.device, torch.get_num_threads(), self.amp)
        log.info("batches: %s | CUDA graphs: %s", getattr(self, "_shapes_note", "each of its own shape"),
                 "on (one per batch shape)" if self.graphs else f"off ({self._graphs_blocker() or 'train.graphs=off'})")
        if self._malloc_note:
            log.info("%s", self._malloc_note)
        shown: dict[str, str] = {}
        start = time.perf_counter()
        self._saving = self._mid_update = self._validating = False
        try:
            if s.validation_due:  # an interrupt stopped this update's validation: it comes before the next update
                self._validate_and_save(start)
                start = time.perf_counter()
            stop = self._stop_reason(start)
            with self._progress_bar() as progress:
                while stop is None:
                    if t.max_epochs is not None and s.epoch > t.max_epochs:
                        stop = f"reached max_epochs={t.max_epochs}"
                        break
                    batches = self._epoch_batches(s.epoch)
                    while s.batch_in_epoch < len(batches) and stop is None:
                        group = batches[s.batch_in_epoch : s.batch_in_epoch + t.update_freq]
                        tick = time.perf_counter()
                        with deferred_interrupt():  # Ctrl-C/SIGTERM: the update (and its log) finishes, then
                            self._mid_update = True  # (set once the signals are held: one before is between updates)
                            stats = self._update([self._collate(ix) for ix in group])  # last.pt is saved
                            s.batch_in_epoch += len(group)
                            self._window["time"] += time.perf_counter() - tick
                            if s.step % t.log_every == 0:
                                record = self._log_train(self._window, stats["lr"], start)
                                self._window = self._empty_window()
                                shown = {"loss": f"{record['loss']:.3f}"}  # the bar shows the last interval's loss
                            self._mid_update = False
                        if progress is not None:
                            progress.update(1)
                            progress.set_postfix(**shown, lr=f"{stats['lr']:.2e}",
                                                 **self._budget_left(s.elapsed + time.perf_counter() - start))
                        if s.step % t.valid_every == 0:
                            self._validate_and_save(start)
                            start = time.perf_counter()
                        stop = self._stop_reason(start)
                    if s.batch_in_epoch >= len(batches):
                        s.epoch += 1
                        s.batch_in_epoch = 0
            if self._saved_at != s.step:
                if self._pausing():
                    self._save_to_resume(start)  # not an end: no validation, no step checkpoint
                else:
                    self._validate_and_save(start)
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM from the CLI (Terminated)
            self._stop_on_interrupt(interrupt, start)
            raise
        log.info("training stopped at update %d: %s", s.step, stop)
        D.shutdown(self.dist)
        return s

    def _stop_on_interrupt(self, interrupt: KeyboardInterrupt, start: float) -> None:
        """Ctrl-C or SIGTERM between updates or during a validation: save last.pt (unless it is current) and raise
        the interrupt again, saying where to resume. Where the update's validation was not recorded yet, last.pt
        says it is due, and the resumed run validates before its next update, as the uninterrupted run did.
        Nothing is saved where the state is not whole (a second signal during an update, or one that stopped a
        save: the previous last.pt stays), before the first update, nor with several processes (each would have
        to stop at the same update to save together)."""
        s = self.state
        if self._mid_update or self._saving or self.dist.world_size > 1 or s.step == 0:
            return
        if self._validating or (s.step % self.cfg.train.valid_every == 0 and self._saved_at != s.step):
            s.validation_due = True
        if self._saved_at != s.step:
            self._save_to_resume(start)
        log.info("training interrupted at update %d; last.pt saved", s.step)
        raise type(interrupt)(f"interrupted at update {s.step}; continue with --resume") from None

    def _pausing(self) -> bool:
        """Whether the run stops at --stop-at-step, a pause, rather than at one of its ends (checked first)."""
        t, s = self.cfg.train, self.state
        if (t.max_steps is not None and s.step >= t.max_steps) or self._stop_requested:
            return False
        return self.opts.stop_at_step is not None and s.step >= self.opts.stop_at_step

    def _save_to_resume(self, start: float) -> None:
        """last.pt alone, between two validations (a pause, an interrupt): the run resumed from it validates and
        keeps step checkpoints at the updates the uninterrupted run does, so `average --last N` averages the same."""
        self.state.elapsed += time.perf_counter() - start
        self.save(improved=False, numbered=False)

    @staticmethod
    def _empty_window() -> dict[str, float]:
        """What the host sums over one log interval: the update time; the size (sample_size units), loss,
        NLL and counts are summed on the device (`_sums`) and read at the interval's end."""
        return {"time": 0.0}

    def _log_train(self, window: dict[str, float], lr: float, start: float) -> dict[str, Any]:
        """One metrics.jsonl train record and train.log line for the log interval `window`.

        Keys: type, step, epoch, loss, nll (per sample_size unit), the task's fields (translation:
        ppl; classification: accuracy), lr, grad_norm, <unit> and <unit>_per_s (translation: tokens,
        tokens_per_s of target tokens; classification: sentences, sentences_per_s), elapsed_s, any
        aux_* loss and the modules' metrics."""
        s, task = self.state, self.task
        tick = time.perf_counter()
        read = self._read_window()  # the one read of the device in a log interval (waits for its updates)
        window = {**window, "time": window["time"] + time.perf_counter() - tick}
        summed = sorted(self._sums)  # size, loss, nll and the task's counts: the same names on every rank
        totals = D.all_reduce_sum([read[k] for k in summed], self.dist, self.device)
        window.update(zip(summed, totals))
        size = max(window["size"], 1.0)
        record = {"type": "train", "step": s.step, "epoch": s.epoch,
                  "loss": window["loss"] / size, "nll": window["nll"] / size, **task.train_fields(window),
                  "lr": lr, "grad_norm": read["grad_norm"], task.sample_unit: window["size"],
                  f"{task.sample_unit}_per_s": window["size"] / max(window["time"], 1e-9),
                  "elapsed_s": s.elapsed + time.perf_counter() - start}
        record.update({k: v for k, v in read.items() if k.startswith("aux_")})
        module_metrics = self.hooks.training_metrics()
        if module_metrics:
            record["modules"] = module_metrics
        self.metrics.write(record)
        if not math.isfinite(record["loss"]) and not self._warned_divergence:  # once: every line after says it too
            self._warned_divergence = True
            log.warning("the training loss is %s at update %d: the run has diverged (%s); it goes on, and no NaN "
                        "validation becomes best.pt", record["loss"], s.step, DIVERGED_ADVICE)
        fields = task.describe_train(record)
        step_log.info("train | step %d | epoch %d | loss %.3f | %slr %.2e | %.0f %s", s.step, s.epoch, record["loss"],
                      f"{fields} | " if fields else "", record["lr"], record[f"{task.sample_unit}_per_s"],
                      task.speed_unit)
        return record

    def _budget_left(self, elapsed: float) -> dict[str, str]:
        """What the stopping limits leave: updates (max_steps / --stop-at-step) and time (max_minutes)."""
        t, left = self.cfg.train, {}
        limits = [n for n in (t.max_steps, self.opts.stop_at_step) if n is not None]
        if limits:
            left["upd_left"] = str(max(min(limits) - self.state.step, 0))
        if t.max_minutes is not None:
            seconds = max(int(60 * t.max_minutes - elapsed), 0)
            left["time_left"] = f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        return left

    @contextlib.contextmanager
    def _progress_bar(self):
        """A tqdm bar (with ETA when the number of updates is known) on the main process of a TTY run.

        While it shows, the per-update train lines go to train.log only."""
        show = self.opts.progress if self.opts.progress is not None else sys.stderr.isatty()
        if not show or not self.dist.is_main:
            yield None
            return

        limits = [n for n in (self.cfg.train.max_steps, self.opts.stop_at_step) if n is not None]
        bar = tqdm(total=min(limits) if limits else None, initial=self.state.step, unit="upd", dynamic_ncols=True)
        step_log.propagate = False
        if self._log_handler is not None:
            step_log.addHandler(self._log_handler)
        try:
            yield bar
        finally:
            bar.close()
            step_log.propagate = True
            if self._log_handler is not None:
                step_log.removeHandler(self._log_handler)


def total_grad_norm(params: list[nn.Parameter]) -> Tensor:
    """The 2-norm of all gradients together, with multi-tensor kernels where this PyTorch has them (one norm
    per parameter would be one kernel each on a GPU: 182 a transformer-base update)."""
    if not params:
        return torch.zeros(())
    grads = [p.grad.detach() for p in params]
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        return torch.nn.utils.get_total_norm(grads, 2.0)
    return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
