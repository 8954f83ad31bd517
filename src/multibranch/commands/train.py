"""`multibranch train`: train a model on prepared data (exactly resumable)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "train a model (preset or config file) on data made by `prepare`; --resume continues a run exactly"

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, type=Path, help="directory written by `multibranch prepare`")
    parser.add_argument("--out", required=True, type=Path, help="run directory (checkpoints, metrics.jsonl, logs)")
    parser.add_argument("--preset", help="named preset, e.g. mat-tiny (see `multibranch info --list`)")
    parser.add_argument("--config", help="YAML config file (applied after the preset); without --preset and --config, "
                                         "--init-from CKPT uses the checkpoint's config (e.g. an imported BERT)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config value, e.g. --set model.encoder.attention_branches=3 (repeatable)")
    group = parser.add_argument_group("common settings (shortcuts for --set train.*)")
    group.add_argument("--max-steps", type=int, help="stop after N updates (also the length the schedules plan for)")
    group.add_argument("--max-epochs", type=int, help="stop after N passes over the training data")
    group.add_argument("--max-minutes", type=float, help="stop after this much training time (a resume counts on)")
    group.add_argument("--max-tokens", type=int, help="padded tokens per batch")
    group.add_argument("--update-freq", type=int, help="batches accumulated per update")
    group.add_argument("--lr", type=float, help="peak learning rate")
    group.add_argument("--warmup", type=int, help="warm-up updates")
    group.add_argument("--seed", type=int, help="seed of the weight init, data order and dropout")
    group.add_argument("--valid-every", type=int, help="validate and checkpoint every N updates")
    group.add_argument("--patience", type=int, help="stop after N validations without improvement")
    group.add_argument("--amp", choices=["none", "bf16", "fp16", "auto"],
                       help="autocast precision; auto = bf16 where native (AMX/AVX512-BF16 CPUs, CUDA), else fp32/fp16")
    group.add_argument("--threads", type=int, help="intra-op CPU threads")
    group.add_argument("--log-every", type=int, help="write a train line to metrics.jsonl and train.log every N updates")
    group.add_argument("--graphs", choices=["auto", "on", "off"],
                       help="one CUDA graph per batch shape for each update (auto: on a single CUDA device where "
                            "possible; off: eager)")
    group.add_argument("--length-buckets", type=int, metavar="N",
                       help="pad batches to at most N fixed shapes (default: 8 with graphs, else each batch its own)")
    group.add_argument("--ema-decay", type=float, metavar="D",
                       help="validate and save an exponential moving average of the weights with decay D (e.g. 0.999)")
    group.add_argument("--deterministic", action="store_true", help="torch.use_deterministic_algorithms(True)")
    run = parser.add_argument_group("run control")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in --out from last.pt (without --preset/--config: the run's config.yaml)")
    run.add_argument("--auto-resume", action="store_true",
                     help="--resume when OUT/last.pt exists, else start a new run (over a run stopped before its first "
                          "checkpoint, too): for launchers that rerun the same command after a failure (torchrun "
                          "--max-restarts, SLURM --requeue; docs/scale.md)")
    run.add_argument("--force", action="store_true", help="start over in an existing run directory")
    run.add_argument("--init-from", type=Path, metavar="CKPT", help="initialise weights from a checkpoint (e.g. proximal init)")
    run.add_argument("--reset-optimizer", action="store_true", help="resume with a fresh optimizer state")
    run.add_argument("--reset-schedule", action="store_true", help="resume with LR/rate schedules from update 0")
    run.add_argument("--reset-data", action="store_true", help="resume from the start of the data (new data allowed)")
    run.add_argument("--allow-new-tokenizer", action="store_true",
                     help="with --resume: accept data prepared with another SentencePiece model than the run's "
                     "(the embeddings then mean other pieces; the loss jumps)")
    run.add_argument("--stop-at-step", type=int, metavar="N",
                     help="pause after update N (last.pt is saved, nothing validated; --resume continues as if never "
                     "paused; schedules still plan for max_steps)")
    run.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available)")
    run.add_argument("--tensorboard", type=Path, metavar="DIR",
                     help="also write the training metrics as TensorBoard events into DIR (needs multibranch[tb])")
    run.add_argument("--plots", action="store_true",
                     help="redraw the run's curves into OUT/plots at every validation (as `multibranch plot OUT`)")
    run.add_argument("--no-progress", action="store_true",
                     help="no progress bar even on a terminal (the per-update lines then go to the console too)")


def run(args: argparse.Namespace) -> int:
    from multibranch.config import check_value, field_at
    from multibranch.experiment import TRAIN_SHORTCUTS, ExperimentConfig, train_config
    from multibranch.tasks import train
    from multibranch.train.distributed import exit_worker, is_worker_of_a_job
    from multibranch.train.run_directory import auto_resume
    from multibranch.train.trainer import RunOptions

    if args.auto_resume:
        args.resume, args.force = auto_resume(args.out, resume=args.resume, force=args.force)

    overrides = list(args.overrides)
    for flag, key in TRAIN_SHORTCUTS.items():
        value = getattr(args, flag)
        if value is not None:
            check_value(*field_at(ExperimentConfig, key), value, f"--{flag.replace('_', '-')}")  # names the option
            overrides.append(f"{key}={value}")
    if args.deterministic:
        overrides.append("train.deterministic=true")
    cfg = train_config(args.preset, args.config, overrides, args.out, resume=args.resume, init_from=args.init_from)
    opts = RunOptions(
        data_dir=args.data, run_dir=args.out, resume=args.resume, force=args.force, init_from=args.init_from,
        reset_optimizer=args.reset_optimizer, reset_schedule=args.reset_schedule, reset_data=args.reset_data,
        allow_new_tokenizer=args.allow_new_tokenizer, device=args.device, progress=False if args.no_progress else None, stop_at_step=args.stop_at_step,
        tensorboard=args.tensorboard, plots=args.plots,
    )
    state = train(cfg, opts)
    valid = state.last_valid
    summary = f"done: {state.step} updates, {state.epoch - (state.batch_in_epoch == 0)} epochs"
    if valid:
        summary += f", valid loss {valid['loss']:.3f}" + (f", BLEU {valid['bleu']:.2f}" if "bleu" in valid else "")
    best, last = args.out / "best.pt", args.out / "last.pt"
    where = (f"best checkpoint: {best}" if best.is_file() else
             f"no best checkpoint (no finite validation score yet); last: {last}" if last.is_file() else
             "no checkpoint written")
    print(f"{summary}; {where}")
    if is_worker_of_a_job():
        exit_worker(0)  # every file is written; see exit_worker for why a worker leaves this way
    return 0
