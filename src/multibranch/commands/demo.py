"""`multibranch demo`: the whole pipeline on the built-in synthetic task, offline, in a few minutes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multibranch.experiment import ExperimentConfig
    from multibranch.tasks.translation.heldout import SplitTranslation

HELP = "generate the built-in synthetic task, prepare it, train a small MAT for a fixed number of updates, report BLEU"

# The training budget, in updates so that every machine trains the same model and reports the same BLEU (a budget in
# minutes trained a busy machine's model for a fraction of the updates). The preset trains in fp32 on every CPU (the
# same numbers with or without native bf16): 300 updates took 1.1-1.3 minutes on 2 cores of an AVX2-only AMD EPYC
# (0.22-0.26 s an update), the whole demo (the task's generation and preparation, training, the test set's
# translation without a build of the CPU kernels) 1 min 20 s.
UPDATES = 300
UPDATES_MINUTES = 1.3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("multibranch-demo"),
                        help="working directory")
    parser.add_argument("--updates", type=int, default=UPDATES,
                        help=f"training budget in updates ({UPDATES}: about {UPDATES_MINUTES:g} minutes on 2 "
                             "CPU cores; the same model on any machine)")
    parser.add_argument("--preset", default="demo", help="model preset (demo: a small MAT)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the task generator, SentencePiece and training")
    parser.add_argument("--force", action="store_true", help="replace an existing --out directory")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="preset override, e.g. model.dropout=0.2 (repeatable)")


def demo_config(args: argparse.Namespace) -> ExperimentConfig:
    """The demo's experiment: the preset trained for `--updates` updates (never a wall-clock budget), then the
    `--set` overrides."""
    from multibranch.errors import UserError
    from multibranch.experiment import resolve_config

    if args.updates < 1:
        raise UserError(f"--updates {args.updates}: the demo needs at least one update")
    return resolve_config(args.preset, None, ["train.max_minutes=null", f"train.max_steps={args.updates}",
                                              f"train.seed={args.seed}", *args.overrides])


RAW_FILES = frozenset(f"{split}.{side}" for split in ("train", "valid", "test") for side in ("src", "tgt"))


def check_demo_directory(out: Path) -> None:
    """UserError unless `out` holds only what a demo writes: raw/ with the task's six files, data/ as prepared data
    and run/ as a training run, neither holding another command's output (an `average` checkpoint, a report, a
    run); dotfiles (temporaries) aside. `--force` replaces a demo's own directory, never a folder of other files."""
    from multibranch.data.directories import DATA, RUN, directory_kind, outputs_inside
    from multibranch.errors import UserError

    def refuse(what: str) -> UserError:
        return UserError(f"--out {out}: holds {what}; --force replaces only a demo's own directory (raw/, data/, "
                         "run/): choose another --out")

    for entry in sorted(path for path in out.iterdir() if not path.name.startswith(".")):
        if entry.is_symlink() or not entry.is_dir() or entry.name not in ("raw", "data", "run"):
            raise refuse(f"{entry.name}, which a demo does not write")
        if entry.name == "raw":
            extra = sorted(path.name for path in entry.iterdir()
                           if not path.name.startswith(".") and (path.name not in RAW_FILES or not path.is_file()))
            if extra:
                raise refuse(f"raw/{extra[0]}, which a demo does not write")
            continue
        expected = {"data": DATA, "run": RUN}[entry.name]
        if directory_kind(entry) != expected:
            raise refuse(f"{entry.name}/, which is not a {expected}")
        own = (entry / "last.pt", entry / "best.pt")
        kept = [path for path, _ in outputs_inside(entry) if not (path.parent == entry / "checkpoints" or path in own)]
        if kept:
            raise refuse(f"{entry.name}/{kept[0].relative_to(entry)}, another command's output")


def translate_test_set(checkpoint: Path, data: Path, hyp_file: Path) -> SplitTranslation:
    """The test set of `data` translated with `checkpoint` on the CPU and scored, loaded and decoded without
    building the CPU kernels where they are not built yet: loading packs the model for decoding, which would
    build them, so both happen inside `without_a_kernel_build`."""
    from multibranch.loading.model import TRANSLATION_TASKS, LoadedModel
    from multibranch.tasks.translation.heldout import translate_split, without_a_kernel_build
    from multibranch.tasks.translation.translator import show_progress

    with without_a_kernel_build():
        translator = LoadedModel.load(checkpoint, "cpu", tasks=TRANSLATION_TASKS).translator()
        return translate_split(translator, data, "test", hyp_file=hyp_file, progress=show_progress())


def run(args: argparse.Namespace) -> int:
    import shutil
    import time

    from multibranch.data.parallel_prepare import PrepareConfig
    from multibranch.errors import UserError
    from multibranch.tasks import train
    from multibranch.tasks.translation.prepare import prepare
    from multibranch.tasks.translation.synthetic import generate_synthetic_task
    from multibranch.train.trainer import RunOptions

    out: Path = args.out
    cfg = demo_config(args)  # a bad --updates or --set fails before anything is written
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a directory; choose another --out")
    if out.exists() and any(out.iterdir()):
        check_demo_directory(out)  # before the advice to pass --force, which it would refuse
        if not args.force:
            raise UserError(f"{out} already exists; pass --force to replace it or --out to choose another directory")
        shutil.rmtree(out)
    started = time.perf_counter()
    print(f"[1/4] generating the synthetic task in {out / 'raw'}", flush=True)
    task = generate_synthetic_task(out / "raw", seed=args.seed)
    print(f"      {task['sizes']['train']} training pairs, lexicon of {task['lexicon']['lemmas']} lemmas "
          f"({task['lexicon']['src_forms']} source / {task['lexicon']['tgt_forms']} target word forms)", flush=True)

    print("[2/4] preparing: SentencePiece + binarised data", flush=True)
    prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(out / "raw" / "train"),
                          valid=str(out / "raw" / "valid"), test=[str(out / "raw" / "test")],
                          out=str(out / "data"), vocab_size=1000, seed=args.seed))

    print(f"[3/4] training preset {args.preset!r} for {cfg.train.max_steps} updates"
          + (f" or {cfg.train.max_minutes} minutes, whichever comes first" if cfg.train.max_minutes else "")
          + f" (on a terminal a bar shows the ETA; log: {out / 'run' / 'train.log'})", flush=True)
    state = train(cfg, RunOptions(data_dir=out / "data", run_dir=out / "run", progress=None))

    print("[4/4] translating the test set with the best checkpoint (by validation loss; without building the CPU "
          "kernels, which the first `multibranch translate` builds once)", flush=True)
    result = translate_test_set(out / "run" / "best.pt", out / "data", out / "run" / "test.hyp.txt")
    scores = result.scores
    print()
    for src, hyp, ref in list(zip(result.sources, result.hypotheses, result.references))[:5]:
        print(f"  source:      {src}\n  translation: {hyp}\n  reference:   {ref}\n")
    print(f"test BLEU = {scores['bleu']['score']:.2f}   {scores['bleu']['signature']}")
    print(f"test chrF = {scores['chrf']['score']:.2f}   {scores['chrf']['signature']}")
    print(f"{state.step} updates in {state.elapsed / 60:.1f} min; everything took {(time.perf_counter() - started) / 60:.1f} min")
    print(f"run directory: {out / 'run'} (config.yaml, best.pt, last.pt, metrics.jsonl, train.log, test.hyp.txt)")
    return 0
