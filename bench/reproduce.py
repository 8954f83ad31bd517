"""The five papers' effects on Multi30k En->De, converged, several seeds, one command.

Trains the standard Transformer and every seed system at the papers' IWSLT shape (fairseq
transformer_iwslt_de_en: 6+6 layers, d=512, FFN 1024, 4 heads, dropout 0.3; docs/papers.md#mat-headline-settings-and-preset) until
validation BLEU stops improving (`train --patience`, `best_metric: bleu`) or an update cap
(`--max-updates`), averages the last checkpoints (`average --last`), translates test_2016_flickr and
scores it with sacreBLEU (signatures kept), and compares every system to the standard model of the
same seed with sacreBLEU's paired bootstrap (`evaluate --compare`). Every choice is made on `val`:
MAT's drop-branch rate rho is the one of the best validation BLEU over --rho-grid at --grid-seed.

Systems (--systems; each a model delta on the standard recipe, written to the run's config.json):
  standard        the `transformer` preset (IWSLT recipe: lr 5e-4, inverse-sqrt warm-up 4000, 4096 tokens)
  mat2, mat3      MAT with N_a = 2 / 3 attention branches by proximal initialisation (`convert proximal`)
                  from the converged standard model of the same seed (its best.pt), rho from --rho-grid
  standard-narrow the MAT paper's IWSLT width for MAT: half d, twice the FFN (1/256/2048), rho = 0
  mat2-narrow, mat3-narrow   the MAT paper's IWSLT setting N_a/256/2048, proximal from standard-narrow
                  (MAT §3.3, docs/papers.md#mat-proximal-initialisation: the source has the MAT's width), compared with `standard` as the paper does
  weighted        Weighted Transformer (M = 4 branches = heads, split FFNs: equal parameters), kappa/alpha
                  frozen for the last sixth of --max-updates (the paper's 10k of 60k)
  mute, mute-bias, mute-bias-seq   MUTE (4 encoder units), + bias modules, + AutoShuffle sequential fusion
                  (pre-norm, relative positions 16: the model side of the `mute` presets)
  muse, muse-simple   MUSE (parallel attention + gated {3,15} dynamic convolution + FFN), without the conv
  drophead        Scheduled DropHead, V schedule, p = 0.2 on every attention, residual dropout 0.3 -> 0.2
  mat3-narrow-drophead   beyond the papers: mat3-narrow (its rho, no grid of its own) with drophead's DropHead
Training and decoding settings are the standard recipe's for every system (bench/reproduce_systems.py). Each
finished run's averaged checkpoint gets its paper's analyses in the same call (bench/reproduce_analyses.py:
pruning curve, BLEU by length, gates, MUTE diversity, MAT head importance; --no-analyses skips them), and
bench/reproduce_report.py builds docs/reproduction.md's table and figures from several calls' results.

It drives the toolkit only through its command line (`python -m multibranch ...`, this checkout's
src/ first on PYTHONPATH) and tolerates being run in parts: every run lives in its own stable folder
WORK/runs/SYSTEM/seedK/ (train/ is `multibranch train --out`); a run with done.json is skipped, an
unfinished one resumes from train/last.pt (`train --resume`: exactly the same updates as one long run).
--budget MINUTES stops every training in time (`--max-minutes`, counted on across resumes) so that
the call ends inside a time limit; --segment-updates N pauses each run after N more updates
(`--stop-at-step`). The results JSON (--out/--name.json) is rewritten after every run, so a call
killed from outside still leaves what it finished. --tiny is the same pipeline at a CPU size (a
tiny model, a few hundred sentences, a few dozen updates): tests/bench/test_reproduce.py runs it.

    python bench/reproduce.py --tiny --systems standard mat2 drophead --seeds 1 --out /tmp/r   # CPU, ~1 min
    python bench/reproduce.py --device cuda --amp bf16 --jobs 3 --budget 8 --out $OUT            # a GPU call
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]  # bench.* and this checkout's multibranch (json_file needs no torch)

from bench.common import cpu_model, multi30k_dir  # noqa: E402
from bench.reproduce_analyses import AnalysisSettings, analyses_for, run_analyses  # noqa: E402
from bench.reproduce_cost import cpu_flags, cpu_precision, estimate_minutes, this_cpu  # noqa: E402
from bench.reproduce_report import markdown_table  # noqa: E402
from bench.reproduce_results import ENGINE_SETTINGS, mean_sd, reported_run_keys, run_key, system_summary  # noqa: E402
from bench.reproduce_systems import (  # noqa: E402
    CURVE_FILE,
    DEFAULT_RHO_GRID,
    MAT_SYSTEMS,
    PAPER_CLAIMS,
    RECIPES,
    SOURCES,
    SYSTEMS,
    TINY,
    deep_merge,
    grid_of,
    system_delta,
)
from multibranch.evaluate.metrics import sufficient_statistics  # noqa: E402
from multibranch.json_file import write_json  # noqa: E402

RESULTS = ROOT / "bench" / "results"

SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
TINY_DEFAULTS = {"train_lines": 300, "valid_lines": 40, "test_lines": 40, "vocab_size": 300, "max_updates": 30,
                 "valid_every": 10, "patience": 3, "average_last": 3, "log_every": 5, "analysis_sentences": 40}

FINISHED_REASONS = ("reached max_steps", "no improvement", "reached max_epochs")

_print_lock = threading.Lock()


def say(message: str) -> None:
    with _print_lock:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- the runs ------------------------------------------------------------------------------------------


@dataclass
class Run:
    system: str  # "standard", "mat2", ... (the row it belongs to)
    seed: int
    rho: float | None = None  # MAT only
    grid: bool = False  # a MAT run of the rho grid (at --grid-seed)
    needs: list[Run] = field(default_factory=list)  # runs that must have finished training first
    status: str = "pending"
    error: str | None = None

    @property
    def name(self) -> str:
        return f"{self.system}-rho{self.rho:g}" if self.rho is not None else self.system

    @property
    def key(self) -> str:
        return f"{self.name}/seed{self.seed}"


# ---- small helpers ---------------------------------------------------------------------------------


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill
                continue
    return records


class Harness:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.work: Path = args.work
        self.start = time.monotonic()
        self.deadline = self.start + 60 * args.budget if args.budget else None
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)}
        if args.threads:
            self.env.update({"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)})
        self.data: Path = args.data or self.work / "data"
        self.actions: list[dict[str, Any]] = []  # what this call did, per run
        self.lock = threading.Lock()

    # ---- commands ----------------------------------------------------------------------------------

    def cli(self, args: list[str], log: Path, *, check: bool = True) -> subprocess.CompletedProcess:
        """`python -m multibranch ARGS`, its output appended to `log`."""
        command = [sys.executable, "-m", "multibranch", *args]
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf-8") as handle:
            handle.write(f"$ multibranch {' '.join(args)}\n")
            handle.flush()
            result = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT)
        if check and result.returncode != 0:
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            raise RuntimeError(f"`multibranch {' '.join(args[:2])} ...` failed ({result.returncode}); "
                               f"end of {log}:\n" + "\n".join(tail))
        return result

    # ---- data --------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Prepare Multi30k once (joint SentencePiece BPE) into WORK/data; --data uses a prepared folder."""
        a = self.args
        settings = {"raw": str(a.multi30k), "vocab_size": a.vocab_size, "train_lines": a.train_lines,
                    "valid_lines": a.valid_lines, "test_lines": a.test_lines}
        if a.data is not None:
            if not (a.data / "data.json").is_file():
                sys.exit(f"--data {a.data}: no data.json (not a folder written by `multibranch prepare`)")
            return
        marker = self.work / "data.settings.json"
        if (self.data / "data.json").is_file():
            old = read_json(marker)
            if old is not None and old != settings:
                sys.exit(f"{self.data} was prepared with {old}, not {settings}: use another --work")
            return
        raw = a.multi30k
        if not all((raw / f"{SPLITS[s]}.{lang}").is_file() for s in SPLITS for lang in ("en", "de")):
            sys.exit(f"Multi30k not found at {raw} (train/val/test_2016_flickr .en/.de): set MULTIBRANCH_MULTI30K "
                     "or MULTIBRANCH_SHARED_DATA, or give --multi30k / --data")
        prefixes = {s: raw / SPLITS[s] for s in SPLITS}
        limits = {"train": a.train_lines, "valid": a.valid_lines, "test": a.test_lines}
        if any(limits.values()):  # the first N lines of each split (--tiny), in the work folder, never the repo
            subset = self.work / "raw-subset"
            subset.mkdir(parents=True, exist_ok=True)
            for split, limit in limits.items():
                for lang in ("en", "de"):
                    lines = (raw / f"{SPLITS[split]}.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
                    (subset / f"{SPLITS[split]}.{lang}").write_text("".join(lines[:limit] if limit else lines),
                                                                     encoding="utf-8")
                prefixes[split] = subset / SPLITS[split]
        say(f"prepare Multi30k en->de into {self.data}")
        self.cli(["prepare", "--src", "en", "--tgt", "de", "--train", str(prefixes["train"]),
                  "--valid", str(prefixes["valid"]), "--test", str(prefixes["test"]), "--out", str(self.data),
                  "--vocab-size", str(a.vocab_size), "--force"], self.work / "prepare.log")
        write_json(marker, settings)

    # ---- the plan ----------------------------------------------------------------------------------

    def run_dir(self, run: Run) -> Path:
        return self.work / "runs" / run.name / f"seed{run.seed}"

    def plan(self) -> list[Run]:
        """Every run the selected systems and seeds need, dependencies first (standard models of the
        seeds MAT needs, the rho grid at --grid-seed)."""
        a = self.args
        runs: dict[str, Run] = {}

        def add(run: Run) -> Run:
            return runs.setdefault(run.key, run)

        for system in a.systems:
            if system not in MAT_SYSTEMS:
                for seed in a.seeds:
                    add(Run(system, seed))
                continue
            source = MAT_SYSTEMS[system][0]  # its standard models are added even when not asked for
            if a.rho is not None:  # a fixed rho: no grid
                for seed in a.seeds:
                    add(Run(system, seed, rho=a.rho, needs=[add(Run(source, seed))]))
                continue
            grid_system = grid_of(system)
            grid = [add(Run(grid_system, a.grid_seed, rho=rho, grid=True, needs=[add(Run(source, a.grid_seed))]))
                    for rho in a.rho_grid]
            for seed in a.seeds:
                if seed != a.grid_seed or grid_system != system:  # the grid holds its own system's grid seed
                    # rho is chosen once the grid has finished (resolve); None until then
                    add(Run(system, seed, rho=None, needs=[add(Run(source, seed)), *grid]))
        recipe = RECIPES[a.recipe]
        if recipe.seed_major:  # the main rows seed by seed, then the others, each in the recipe's order (a source
            # comes before the MAT it initialises)
            return sorted(runs.values(), key=lambda r: (r.system not in recipe.main, r.seed,
                                                        recipe.systems.index(r.system), r.rho or 0.0))
        # standard models first (MAT starts from them), then the rho grid, then seed by seed
        return sorted(runs.values(), key=lambda r: (r.system not in SOURCES, not r.grid, r.seed,
                                                    SYSTEMS.index(r.system), r.rho or 0.0))

    def chosen_rho(self, system: str) -> tuple[float | None, dict[str, Any]]:
        """rho of the best validation BLEU among the finished grid runs of `system` (a combination: of the
        MAT system it extends; ties: the smaller); None while a grid run has not finished training."""
        if self.args.rho is not None:
            return self.args.rho, {}
        scores: dict[str, Any] = {}
        for rho in self.args.rho_grid:
            run = Run(grid_of(system), self.args.grid_seed, rho=rho, grid=True)
            if not self.trained(run):
                return None, scores
            valid = [r for r in self.metrics(run) if r.get("type") == "valid" and "bleu" in r]
            scores[f"{rho:g}"] = max(r["bleu"] for r in valid) if valid else None
        best = max(self.args.rho_grid, key=lambda rho: (-1.0 if scores[f"{rho:g}"] is None else scores[f"{rho:g}"], -rho))
        return best, scores

    # ---- one run -------------------------------------------------------------------------------------

    def trained(self, run: Run) -> dict[str, Any] | None:
        return read_json(self.run_dir(run) / "trained.json")

    def metrics(self, run: Run) -> list[dict[str, Any]]:
        return read_jsonl(self.run_dir(run) / "train" / "metrics.jsonl")

    def run_config(self, run: Run) -> dict[str, Any]:
        """Everything that decides the run's training (compared on every resume)."""
        a = self.args
        config = {"train": {"max_steps": a.max_updates, "patience": a.patience, "valid_every": a.valid_every,
                            "keep_last": max(a.average_last, 1), "log_every": a.log_every, "amp": a.amp,
                            "seed": run.seed, "best_metric": "bleu", "max_epochs": a.max_epochs,
                            "max_minutes": None}}
        if a.valid_sentences:
            config["train"]["valid_max_sentences"] = a.valid_sentences
        if a.warmup is not None:
            config["train"]["lr"] = {"warmup": a.warmup}
        if a.lr is not None:
            config["train"]["lr"] = {**config["train"].get("lr", {}), "lr": a.lr}
        if a.tiny:
            config = deep_merge(TINY, config)
        # the CPU recipe's MAT systems (from scratch, outside MAT_SYSTEMS' grid) take the fixed --rho
        rho = run.rho if run.rho is not None or a.recipe != "cpu" else a.rho
        config = deep_merge(config, system_delta(run.system, a.max_updates, rho, tiny=a.tiny, recipe=a.recipe))
        sets = [s.split(":", 1)[1] if ":" in s.split("=", 1)[0] else s for s in a.overrides
                if ":" not in s.split("=", 1)[0] or s.split(":", 1)[0] in (run.system, run.name)]
        return {"preset": RECIPES[a.recipe].base_preset, "config": config, "sets": sets}

    def execute(self, run: Run) -> str:
        """Train (or resume) one run, then evaluate it once its training has finished; returns its status."""
        folder = self.run_dir(run)
        if (folder / "done.json").is_file():
            analysed_before = self.analyse(run, folder)
            if analysed_before and (not self.args.results_per_run or self.reported(run)):
                return "skipped (done before)"  # its results file stays as it was written, commit and all
            if not analysed_before and self.add_analyses(run, folder):
                return "done (analyses added to its results file)"
            self.report_run(run)
            return "done (reported now)" if analysed_before else "done (analysed now)"
        if self.reported(run):
            return "reported before"
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / "harness.log"
        if self.trained(run) is None:
            status = self.train(run, folder, log)
            if status != "trained":
                return status
        self.evaluate(run, folder, log)
        self.analyse(run, folder)
        self.report_run(run)
        return "done"

    # ---- one results file per finished run (--results-per-run) ------------------------------------------

    def run_results_name(self, run: Run) -> str:
        return f"{self.args.name}_{run.name}_seed{run.seed}"

    def reported(self, run: Run) -> bool:
        """--results-per-run or --skip-reported: whether a results file in OUT or bench/results holds this run
        finished, trained to the same settings (a run that an earlier call reported, on this machine or another,
        whose work folder has gone with its machine, is not trained again)."""
        if not (self.args.results_per_run or self.args.skip_reported) or run.key in self.args.again:
            return False
        if self._reported is None:
            self._reported = self.reported_runs()
        return run.key in self._reported

    _reported: set[str] | None = None

    def reported_runs(self) -> set[str]:
        """The keys (RUN/seedK) of the finished runs in OUT's and bench/results' results files of this recipe and
        settings (the engine choices train.graphs and decode.fixed_shapes aside: they train the same model)."""
        return reported_run_keys([self.args.out, RESULTS], self.settings())

    def report_run(self, run: Run) -> None:
        """--results-per-run: write OUT/NAME_RUN_seedK.json (and its _hyps.json) for a finished run."""
        if not self.args.results_per_run:
            return
        comparison = None
        if run.system != "standard":
            try:
                comparison = self.compare(run)
            except Exception as error:  # the report computes it from the saved translations instead
                say(f"{run.key}: comparison FAILED: {error}")
        path = self.write_results([run], {run.key: comparison} if comparison else None,
                                  name=self.run_results_name(run), save_hyps=False)
        say(f"{run.key}: wrote {path}")

    def add_analyses(self, run: Run, folder: Path) -> bool:
        """--results-per-run: put the analyses of a run reported before (made now, by an analysis it did not have
        then) into its results file in OUT, which keeps the rest as it was: the commit, machine and minutes of the
        call that trained and scored it. Each analysis records this call's commit. False where OUT has no
        results file holding the run, finished."""
        path = self.args.out / f"{self.run_results_name(run)}.json"
        data = read_json(path) if self.args.results_per_run else None
        records = [r for r in (data or {}).get("runs") or []
                   if r.get("dir") and run_key(r) == run.key and r.get("status") == "done"]
        analyses = read_json(folder / "analyses.json")
        if len(records) != 1 or not isinstance(analyses, dict):
            return False
        commit = self.run_environment().get("commit")
        known = records[0].get("analyses") or {}
        records[0]["analyses"] = {name: value if known.get(name) == value else {**value, "commit": commit}
                                  for name, value in analyses.items()}
        write_json(path, data)
        say(f"{run.key}: added its analyses to {path}")
        return True

    def analyse(self, run: Run, folder: Path) -> bool:
        """The system's analyses on the averaged checkpoint (bench/reproduce_analyses.py), unless they are
        there already or switched off; True when nothing was left to do."""
        a = self.args
        wanted = analyses_for(run.system) if a.analyses else ()
        have = read_json(folder / "analyses.json") or {}
        if all(name in have and "error" not in have[name] for name in wanted):
            return True
        ckpt = next(iter(sorted(folder.glob("avg_last*.pt"))), None)
        if ckpt is None:
            return True  # scored by an older call whose average is gone: nothing to analyse
        device = a.device if a.device != "auto" else ("cuda" if self.run_environment().get("gpu") else "cpu")
        settings = AnalysisSettings(device=device, examples=a.analysis_examples, score_sentences=a.analysis_sentences,
                                    dominant=a.recipe == "cpu")
        began = time.time()
        results = run_analyses(run.system, ckpt, self.data, folder, settings, self.cli)
        failed = [name for name, value in results.items() if "error" in value]
        say(f"{run.key}: analyses {', '.join(results)} ({time.time() - began:.0f} s)"
            + (f"; FAILED: {', '.join(failed)}" if failed else ""))
        return False

    def train(self, run: Run, folder: Path, log: Path) -> str:
        a = self.args
        spec = self.run_config(run)
        saved = read_json(folder / "config.json")
        if saved is not None and saved != spec:
            raise RuntimeError(f"{folder}: the run was started with other settings ({saved}); now {spec}. "
                               "Use another --work, or remove the run's folder to start it over")
        write_json(folder / "config.json", spec)
        config_file = folder / "config.yaml"  # JSON is YAML
        config_file.write_text(json.dumps(spec["config"], indent=1) + "\n", encoding="utf-8")
        train_dir = folder / "train"
        if not (train_dir / "last.pt").is_file() and self.adopt_curve_run(run, spec, train_dir):
            return "trained"
        args = ["train", "--preset", spec["preset"], "--config", str(config_file), "--data", str(self.data),
                "--out", str(train_dir), "--device", a.device, "--no-progress"]
        for text in spec["sets"]:
            args += ["--set", text]
        if a.threads:
            args += ["--threads", str(a.threads)]
        if self.deadline is not None:  # checked first: nothing is converted or started without time left
            left = (self.deadline - time.monotonic()) / 60 - a.reserve
            if left < a.min_segment:
                return "not started (budget)"
            need = self.estimate_minutes(run, self.current_step(train_dir)) if a.whole_runs else None
            if need is not None and need > left + a.reserve:
                return f"not started (needs about {need:.0f} minutes, {left + a.reserve:.0f} left)"
            args += ["--max-minutes", f"{self.elapsed_minutes(train_dir) + left:.3f}"]
        step = self.current_step(train_dir)
        resume = (train_dir / "last.pt").is_file()
        if resume:
            args.append("--resume")
        else:
            if train_dir.exists() and any(train_dir.iterdir()):
                args.append("--force")  # started, but killed before its first checkpoint
            if run.system in MAT_SYSTEMS:
                args += ["--init-from", str(self.proximal_init(run, folder, log))]
        if a.segment_updates:
            args += ["--stop-at-step", str(step + a.segment_updates)]
        say(f"{run.key}: {'resume' if resume else 'train'} from update {step}")
        began = time.time()
        ended = False
        try:
            self.cli(args, log)
            ended = True
        finally:  # a training stopped by a signal or an error is a segment too, up to the last.pt it saved
            reason = self.stop_reason(train_dir) if ended else "interrupted or failed"
            segment = {"started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(began)),
                       "wall_s": time.time() - began, "from_step": step, "to_step": self.current_step(train_dir),
                       "resume": resume, "stop": reason, "jobs": a.jobs, "threads": a.threads, "device": a.device}
            with (folder / "segments.jsonl").open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(segment) + "\n")
        say(f"{run.key}: update {segment['to_step']}, {reason} ({segment['wall_s']:.0f} s)")
        if reason is None or not reason.startswith(FINISHED_REASONS):
            return "unfinished"
        write_json(folder / "trained.json", {"stop": reason, "step": segment["to_step"]})
        return "trained"

    def adopt_curve_run(self, run: Run, spec: dict[str, Any], train_dir: Path) -> bool:
        """Take the CPU recipe's validation-curve run (WORK/curve, bench/reproduce_curve.py) as this run when it is
        the same training: the standard model of the same seed and settings, whose schedule does not read the update
        cap, stopped at exactly --max-updates with its last --average-last step checkpoints at validations. Its files
        are hard-linked into `train_dir` and it is not trained again; False (nothing done) otherwise."""
        a = self.args
        curve = self.work / "curve"
        curve_train = curve / "train"
        config = read_json(curve / "config.yaml")  # the curve writes its config as JSON
        trains = [text for text in spec["sets"] if not text.startswith(ENGINE_SETTINGS)]  # what changes the model
        if a.recipe != "cpu" or a.tiny or run.system != "standard" or trains or config is None:
            return False
        caps = ("max_steps", "max_epochs", "max_minutes")
        mine = {k: v for k, v in spec["config"]["train"].items() if k not in caps}
        theirs = {k: v for k, v in config.get("train", {}).items() if k not in caps}
        if mine != theirs or any(spec["config"].get(k) for k in spec["config"] if k != "train"):
            return False
        steps = sorted(int(p.stem.split("_")[1]) for p in (curve_train / "checkpoints").glob("step_*.pt"))
        logged = max((r.get("step", 0) for r in read_jsonl(curve_train / "metrics.jsonl")), default=0)
        last = steps[-a.average_last:]
        if not steps or steps[-1] != a.max_updates or logged != a.max_updates or len(last) < a.average_last \
                or any(step % a.valid_every for step in last) or not (curve_train / "last.pt").is_file():
            return False
        if train_dir.exists():
            if any(train_dir.iterdir()):
                return False
            train_dir.rmdir()
        shutil.copytree(curve_train, train_dir, copy_function=os.link,
                        ignore=lambda _, names: [n for n in names if n.startswith(".")])  # no temporaries
        curve_results = read_json(a.out / CURVE_FILE.name) or read_json(CURVE_FILE) or {}
        train = [r for r in read_jsonl(train_dir / "metrics.jsonl") if r.get("type") == "train"]
        adopted = {"trained_by": "bench/reproduce_curve.py (the standard model's validation curve)",
                   "train_threads": (curve_results.get("environment") or {}).get("threads"), "from": str(curve_train)}
        segment = {"started": None, "wall_s": train[-1]["elapsed_s"] if train else 0.0, "from_step": 0,
                   "to_step": a.max_updates, "resume": False, "stop": "the validation curve's run",
                   "jobs": 1, "device": "cpu", **adopted}
        (train_dir.parent / "segments.jsonl").write_text(json.dumps(segment) + "\n", encoding="utf-8")
        write_json(train_dir.parent / "trained.json", {
            "stop": f"the validation curve's run, stopped at update {a.max_updates}", "step": a.max_updates,
            **adopted})
        say(f"{run.key}: the validation curve's run, trained to update {a.max_updates}: taken over, not trained again")
        return True

    def proximal_init(self, run: Run, folder: Path, log: Path) -> Path:
        """MAT from the converged standard model of the same seed (its best.pt, by validation BLEU)."""
        system, branches = MAT_SYSTEMS[run.system]
        source = self.run_dir(Run(system, run.seed)) / "train" / "best.pt"
        out = folder / "init.pt"
        self.cli(["convert", "proximal", "--ckpt", str(source), "--branches", str(branches),
                  "--drop-branch", f"{run.rho:g}", "--out", str(out), "--force"], log)
        return out

    def estimate_minutes(self, run: Run, step: int) -> float | None:
        """Wall minutes `run` still needs on this CPU at --threads (bench/reproduce_cost.py; at one thread where
        --threads is unset, which trains at more), None where unknown (a GPU)."""
        a = self.args
        if a.recipe != "cpu" or self.run_environment().get("gpu"):
            return None
        return estimate_minutes(run.system, a.max_updates - step, cpu_precision(a.amp), a.max_updates, cpu=this_cpu(),
                                threads=a.threads or 1)

    @staticmethod
    def current_step(train_dir: Path) -> int:
        """The update last.pt holds, without loading it: the last step checkpoint (every validation writes one) or a
        later pause or interrupt, which write last.pt alone and say so in train.log."""
        steps = [int(p.stem.split("_")[1]) for p in (train_dir / "checkpoints").glob("step_*.pt")]
        log = train_dir / "train.log"
        if log.is_file():
            saved = r"training (?:stopped at update (\d+): paused|interrupted at update (\d+); last.pt saved)"
            steps += [int(a or b) for a, b in re.findall(saved, log.read_text(encoding="utf-8", errors="replace"))]
        return max(steps, default=0)

    @staticmethod
    def elapsed_minutes(train_dir: Path) -> float:
        """Training minutes so far (what `--max-minutes` counts on a resume), from metrics.jsonl."""
        records = [r for r in read_jsonl(train_dir / "metrics.jsonl") if r.get("type") == "train"]
        return records[-1]["elapsed_s"] / 60 if records else 0.0

    @staticmethod
    def stop_reason(train_dir: Path) -> str | None:
        """The reason of the last `training stopped at update N: REASON` line of train.log."""
        log = train_dir / "train.log"
        found = re.findall(r"training stopped at update \d+: (.*)", log.read_text(encoding="utf-8")) if log.is_file() else []
        return found[-1].strip() if found else None

    def evaluate(self, run: Run, folder: Path, log: Path) -> None:
        """Average the last checkpoints, translate test with it and with best.pt, score both; done.json."""
        a = self.args
        train_dir = folder / "train"
        data = self.data
        began = time.time()
        kept = sorted((train_dir / "checkpoints").glob("step_*.pt"))[-a.average_last:]
        avg = folder / f"avg_last{len(kept)}.pt"
        self.cli(["average", "--ckpts", *map(str, kept), "--out", str(avg), "--force"], log)
        scores = {}
        for label, ckpt in (("avg", avg), ("best", train_dir / "best.pt")):
            hyp = folder / f"test.{label}.hyp"
            self.cli(["translate", "--ckpt", str(ckpt), "-i", str(data / "test.src.txt"), "-o", str(hyp),
                      "--device", a.device, "--no-progress", *(["--threads", str(a.threads)] if a.threads else [])],
                     log)
            out = folder / f"test.{label}.json"
            self.cli(["evaluate", "--hyp", str(hyp), "--ref", str(data / "test.tgt.txt"), "--json", str(out),
                      "--force"], log)
            result = read_json(out)
            scores[label] = {"bleu": result["bleu"]["score"], "chrf": result["chrf"]["score"],
                             "bleu_signature": result["bleu"]["signature"],
                             "chrf_signature": result["chrf"]["signature"], "bleu_text": result["bleu"]["text"]}
        scores["avg"]["checkpoints"] = [p.name for p in kept]
        # per-line BLEU statistics: the report's paired bootstrap against a standard model of another call,
        # without keeping the translations
        scores["avg"]["bleu_sentence_stats"] = sufficient_statistics(
            (folder / "test.avg.hyp").read_text(encoding="utf-8").splitlines(),
            (data / "test.tgt.txt").read_text(encoding="utf-8").splitlines())
        record = {"test": scores, "eval_wall_s": time.time() - began, **(self.trained(run) or {})}
        write_json(folder / "done.json", record)
        if not a.keep_checkpoints:  # finished: best.pt and the average stay; resume state and step checkpoints go
            for path in [train_dir / "last.pt", folder / "init.pt", *(train_dir / "checkpoints").glob("step_*.pt")]:
                path.unlink(missing_ok=True)
        say(f"{run.key}: test BLEU {scores['avg']['bleu']:.2f} (average of {len(kept)}), "
            f"{scores['best']['bleu']:.2f} (best.pt)")

    # ---- comparisons -------------------------------------------------------------------------------------

    def compare(self, run: Run) -> dict[str, Any] | None:
        """Paired bootstrap of `run` against the standard model of its seed (averaged checkpoints)."""
        base = self.run_dir(Run("standard", run.seed))
        mine = self.run_dir(run)
        if not ((base / "done.json").is_file() and (mine / "done.json").is_file()):
            return None
        out = self.work / "compare" / f"{run.name}-seed{run.seed}.json"
        if not out.is_file():
            self.cli(["evaluate", "--hyp", str(base / "test.avg.hyp"), "--compare", str(mine / "test.avg.hyp"),
                      "--ref", str(self.data / "test.tgt.txt"), "--bootstrap-samples", str(self.args.bootstrap),
                      "--json", str(out), "--force"], out.with_suffix(".log"))
        result = read_json(out)["compare"]
        return {metric: {"baseline": result[metric]["baseline"]["score"], "system": result[metric]["system"]["score"],
                         "delta": result[metric]["system"]["score"] - result[metric]["baseline"]["score"],
                         "p_value": result[metric]["p_value"], "system_ci95": result[metric]["system"]["ci95"],
                         "baseline_ci95": result[metric]["baseline"]["ci95"], "signature": result[metric]["signature"]}
                for metric in ("bleu", "chrf")} | {"samples": result["samples"], "lines": result["lines"]}

    # ---- the loop --------------------------------------------------------------------------------------

    def resolve(self, run: Run) -> str | None:
        """Whether `run` can start now: None = ready; else why not ('wait' while its inputs may still come)."""
        if run.system in MAT_SYSTEMS and run.rho is None:
            rho, _ = self.chosen_rho(run.system)
            if rho is None:
                return "wait"
            run.rho = rho
        for need in run.needs:
            if self.trained(need) is None:
                return "wait"
        return None

    def run_all(self, runs: list[Run]) -> None:
        pending = list(runs)
        running: dict[Future, Run] = {}
        with ThreadPoolExecutor(max_workers=max(1, self.args.jobs)) as pool:
            while pending or running:
                for run in list(pending):
                    if len(running) >= max(1, self.args.jobs):
                        break
                    blocked = [n for n in run.needs if n.status not in ("pending", "running", "done", "trained",
                                                                        "skipped (done before)")]
                    if blocked and self.resolve(run) is not None:
                        pending.remove(run)
                        run.status = "blocked"
                        run.error = "needs " + ", ".join(f"{n.key} ({n.status})" for n in blocked)
                        self.note(run, run.status, run.error)
                        continue
                    if self.resolve(run) is None:
                        pending.remove(run)
                        run.status = "running"
                        running[pool.submit(self.execute, run)] = run
                if not running:
                    for run in pending:  # nothing runs and nothing can start: their inputs are not coming
                        run.status, run.error = "blocked", "inputs not finished in this call"
                        self.note(run, run.status, run.error)
                    break
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in done:
                    run = running.pop(future)
                    try:
                        run.status = future.result()
                    except Exception as error:  # one failed run must not stop the others
                        run.status, run.error = "failed", str(error)
                        say(f"{run.key}: FAILED: {error}")
                    self.note(run, run.status, run.error)
                if not self.args.results_per_run:  # (each finished run has written its own file)
                    self.write_results(runs)

    def note(self, run: Run, status: str, error: str | None) -> None:
        with self.lock:
            self.actions.append({"run": run.key, "status": status, **({"error": error} if error else {})})

    # ---- results ---------------------------------------------------------------------------------------

    def run_record(self, run: Run) -> dict[str, Any]:
        folder = self.run_dir(run)
        records = self.metrics(run)
        valid = [r for r in records if r.get("type") == "valid"]
        train = [r for r in records if r.get("type") == "train"]
        done = read_json(folder / "done.json")
        segments = read_jsonl(folder / "segments.jsonl")
        bleus = [(r["bleu"], r["step"]) for r in valid if "bleu" in r]
        best_bleu, best_step = max(bleus, key=lambda x: (x[0], -x[1])) if bleus else (None, None)
        if done is not None:
            status = "done"
        elif segments:
            status = "unfinished" if self.trained(run) is None else "trained (not evaluated)"
        else:
            status = "not started"
        autocast = self.autocast(run)
        record = {
            "system": run.system, "seed": run.seed, "rho": run.rho, "grid": run.grid, "dir": str(folder),
            "autocast": autocast, "precision": {"none": "fp32"}.get(autocast, autocast),
            "status": status, "stop": (self.trained(run) or {}).get("stop") or (segments[-1]["stop"] if segments else None),
            "updates": max((r["step"] for r in records), default=0), "best_valid_bleu": best_bleu,
            "best_valid_step": best_step,
            "train_minutes": train[-1]["elapsed_s"] / 60 if train else None,
            # training as the trainer counts it (across resumes, what an interruption lost not included), else the
            # segments' sum; then scoring and the analyses
            "wall_minutes": (train[-1]["elapsed_s"] if train else sum(s["wall_s"] for s in segments)) / 60
            + (done or {}).get("eval_wall_s", 0) / 60
            + sum(v.get("wall_s", 0) for v in (read_json(folder / "analyses.json") or {}).values()) / 60,
            "segments": segments,
            **{k: v for k, v in (self.trained(run) or {}).items() if k in ("trained_by", "train_threads")},
            "curve": {"valid": [{k: r.get(k) for k in ("step", "epoch", "loss", "nll", "ppl", "bleu")} for r in valid],
                      "train": [{k: r.get(k) for k in ("step", "loss", "nll", "lr", "tokens_per_s", "elapsed_s")}
                                for r in train]},
        }
        mixing = [{"step": r["step"], **{k: round(v, 5) for k, v in r["modules"].items() if ".weights." in k}}
                  for r in train if r.get("modules")]
        if any(len(m) > 1 for m in mixing):  # the Weighted Transformer's kappa/alpha as they were logged
            record["curve"]["kappa_alpha"] = mixing
        if done is not None:
            record["test"] = done["test"]
        analyses = read_json(folder / "analyses.json")
        if analyses:
            record["analyses"] = analyses
        return record

    def autocast(self, run: Run) -> str | None:
        """The autocast the run trained under ("none", "bf16", "fp16"), as its train.log says."""
        log = self.run_dir(run) / "train" / "train.log"
        found = re.findall(r"autocast (\w+)", log.read_text(encoding="utf-8")) if log.is_file() else []
        return found[-1] if found else None

    def parameters(self, run: Run) -> int | None:
        """Parameter count of the run's model (`multibranch info --ckpt best.pt --json`), once per system."""
        cache = self.work / "parameters.json"
        with self.lock:
            known = read_json(cache) or {}
        if run.name in known:
            return known[run.name]
        ckpt = self.run_dir(run) / "train" / "best.pt"
        if not ckpt.is_file():
            return None
        result = subprocess.run([sys.executable, "-m", "multibranch", "info", "--ckpt", str(ckpt), "--no-config",
                                 "--json"], capture_output=True, text=True, env=self.env, cwd=ROOT)
        if result.returncode != 0:
            return None
        with self.lock:
            known = read_json(cache) or {}
            known[run.name] = int(json.loads(result.stdout)["total"])
            write_json(cache, known)
        return known[run.name]

    def settings(self) -> dict[str, Any]:
        """The settings block of a results file: the recipe and what this call was asked."""
        a = self.args
        return {"recipe": a.recipe, "tiny": a.tiny, "base_preset": RECIPES[a.recipe].base_preset,
                "shape_override": TINY if a.tiny else None,
                "systems": a.systems, "seeds": a.seeds, "grid_seed": a.grid_seed,
                "rho_grid": None if a.rho is not None else a.rho_grid, "rho": a.rho,
                "max_updates": a.max_updates, "patience": a.patience, "valid_every": a.valid_every,
                "valid_sentences": a.valid_sentences, "average_last": a.average_last, "warmup": a.warmup,
                "lr": a.lr, "overrides": a.overrides, "budget_minutes": a.budget,
                "segment_updates": a.segment_updates, "jobs": a.jobs, "work": str(self.work),
                "analyses": a.analyses, "analysis_sentences": a.analysis_sentences,
                "analysis_examples": a.analysis_examples,
                "data": self.data_summary(), "bootstrap_samples": a.bootstrap}

    def write_results(self, runs: list[Run], comparisons: dict[str, Any] | None = None, *, name: str | None = None,
                      save_hyps: bool | None = None) -> Path:
        a = self.args
        runs = [run for run in runs if run.status != "reported before"]  # their own files hold them
        records = {run.key: self.run_record(run) for run in runs}
        for run in runs:
            if run.key in (comparisons or {}):
                records[run.key]["compare_to_standard"] = comparisons[run.key]
        rows = []
        standard = {r["seed"]: r for r in records.values() if r["system"] == "standard" and r["status"] == "done"}
        for system in [s for s in SYSTEMS if s in a.systems or (name and any(r.system == s for r in runs))]:
            mine = [run for run in runs if run.system == system]
            if name and not mine:  # a one-run file has its own system's row only
                continue
            row: dict[str, Any] = {"system": system, "paper_claim": PAPER_CLAIMS.get(system)}
            if system in MAT_SYSTEMS:
                rho, scores = self.chosen_rho(system)
                row.update({"rho": rho, "rho_grid_valid_bleu": scores,
                            "init": f"proximal from {MAT_SYSTEMS[system][0]} best.pt (same seed)"})
                mine = [run for run in mine if (not run.grid or run.rho == rho) and run.seed in a.seeds]
            else:
                mine = [run for run in mine if run.seed in a.seeds]
            finished = [run for run in mine if records[run.key]["status"] == "done"]
            row["parameters"] = self.parameters(finished[0]) if finished else None
            done = [records[run.key] for run in finished]
            rows.append({**system_summary(system, done, standard, row), **row, "planned_runs": [run.key for run in mine],
                         "config": system_delta(system, a.max_updates, row.get("rho"), tiny=a.tiny,
                                                recipe=a.recipe),
                         "wall_minutes": mean_sd([r["wall_minutes"] for r in done])})
        signatures = sorted({r["test"]["avg"]["bleu_signature"] for r in records.values() if "test" in r})
        payload = {
            "environment": self.run_environment(),
            "settings": self.settings(),
            "bleu_signatures": signatures, "paper_claims_source": "docs/papers.md", "rows": rows, "runs": list(records.values()),
            "this_call": {"actions": list(self.actions), "wall_minutes": (time.monotonic() - self.start) / 60},
        }
        path = a.out / f"{name or a.name}.json"
        write_json(path, payload)
        if a.save_hyps if save_hyps is None else save_hyps:  # the test translations, for the report's bootstrap
            hyps = {}
            for run in runs:
                folder = self.run_dir(run)
                if (folder / "done.json").is_file():
                    hyps[run.key] = {label: (folder / f"test.{label}.hyp").read_text(encoding="utf-8").splitlines()
                                     for label in ("avg", "best")}
            write_json(a.out / f"{name or a.name}_hyps.json", hyps)
        return path

    def data_summary(self) -> dict[str, Any]:
        meta = read_json(self.data / "data.json") or {}
        splits = meta.get("splits", {})
        return {"dir": str(self.data), "raw_train": splits.get("train", {}).get("prefix"), "vocab_size": meta.get("vocab_size"),
                "joint": meta.get("joint"), "pairs": {s: splits.get(s, {}).get("pairs") for s in ("train", "valid", "test")},
                "test": SPLITS["test"], "valid": SPLITS["valid"]}

    _env_cache: dict[str, Any] | None = None

    def run_environment(self) -> dict[str, Any]:
        if self._env_cache is None:
            probe = ("import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
                     "'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name(0) if c else None, "
                     "'torch_threads': torch.get_num_threads()}))")
            result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=self.env)
            torch_info = json.loads(result.stdout) if result.returncode == 0 else {"torch": None, "error": result.stderr[-500:]}
            commit = os.environ.get("MULTIBRANCH_COMMIT")
            dirty = None
            if not commit:
                git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
                commit = git.stdout.strip() or None
                if commit:
                    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                            capture_output=True, text=True, cwd=ROOT)
                    dirty = bool(status.stdout.strip())
            self._env_cache = {"commit": commit, "commit_dirty": dirty, "command": " ".join([Path(sys.executable).name, *sys.argv]),
                               "python": platform.python_version(), "cpu": cpu_model(), "cpu_flags": cpu_flags(),
                               "cpu_count": os.cpu_count(),
                               "threads": self.args.threads or os.environ.get("OMP_NUM_THREADS"),
                               "device": self.args.device, "amp": self.args.amp, **torch_info}
        return self._env_cache

    # ---- the whole call -----------------------------------------------------------------------------------

    def main(self) -> int:
        a = self.args
        runs = self.plan()
        self.check_again(runs)
        self.work.mkdir(parents=True, exist_ok=True)
        a.out.mkdir(parents=True, exist_ok=True)
        if a.dry_run:
            for run in runs:
                needs = ", ".join(n.key for n in run.needs)
                print(f"{run.key:28s} {'grid ' if run.grid else ''}{'needs ' + needs if needs else ''}")
            return 0
        self.prepare()
        if a.prepare_only:
            say(f"prepared data in {self.data}")
            return 0
        self.run_environment()
        self.run_all(runs)
        if a.results_per_run:
            for run in runs:
                say(f"{run.key:28s} {run.status}{': ' + run.error if run.error else ''}")
            return 1 if any(run.status == "failed" for run in runs) else 0
        comparisons: dict[str, Any] = {}
        targets = [run for run in runs if run.system != "standard"]  # compare() skips runs not done
        with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            futures = {run.key: pool.submit(self.compare, run) for run in targets}
            for key, future in futures.items():
                try:
                    result = future.result()
                except Exception as error:
                    say(f"{key}: comparison FAILED: {error}")
                    continue
                if result is not None:
                    comparisons[key] = result
        path = self.write_results(runs, comparisons)
        self.print_table(read_json(path))
        say(f"wrote {path}")
        return 1 if any(run.status in ("failed",) for run in runs) else 0

    def check_again(self, runs: list[Run]) -> None:
        """--again: each key names a planned run, and no results file of this call's own would be overwritten."""
        planned = {run.key: run for run in runs}
        for key in self.args.again:
            if key not in planned:
                sys.exit(f"--again {key}: not a run of this call ({', '.join(sorted(planned))})")
            path = self.args.out / f"{self.run_results_name(planned[key])}.json"
            if self.args.results_per_run and path.exists():
                sys.exit(f"--again {key}: {path} holds it already; training it again would replace that record")

    def print_table(self, result: dict[str, Any]) -> None:
        a = self.args
        device = "GPU" if a.device.startswith("cuda") or (a.device == "auto" and self.run_environment().get("gpu")) \
            else "CPU"
        print("\n" + markdown_table(result["rows"], device))

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", choices=sorted(RECIPES), default="iwslt", help="iwslt: the papers' IWSLT shape "
                   "(the `transformer` preset); cpu: the CPU shape (the `-tiny` presets, the same number of updates "
                   "for every system; bench/reproduce_runner.py builds it in the background) (default: iwslt)")
    p.add_argument("--systems", nargs="+", default=None, choices=SYSTEMS, metavar="SYSTEM",
                   help=f"systems to train (default: the recipe's table: iwslt: {' '.join(RECIPES['iwslt'].systems)}; "
                   f"cpu: {' '.join(RECIPES['cpu'].table_systems)})")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="seeds (default: 1 2 3)")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder of the results JSON (default: bench/results; "
                   "on the device: $OUT)")
    p.add_argument("--name", default=None, help="results file OUT/NAME.json (default: reproduce, reproduce_tiny)")
    p.add_argument("--work", type=Path, default=None,
                   help="prepared data and runs, kept between calls (default: runs/reproduce[-tiny], git-ignored)")
    p.add_argument("--data", type=Path, default=None, help="an already prepared data folder (default: WORK/data)")
    p.add_argument("--multi30k", type=Path, default=multi30k_dir(),
                   help="raw Multi30k (default: $MULTIBRANCH_MULTI30K or $MULTIBRANCH_SHARED_DATA/multi30k)")
    p.add_argument("--tiny", action="store_true", help="CPU size: tiny model, a few hundred sentences, a few dozen updates")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--amp", default=None, choices=["none", "bf16", "fp16", "auto"],
                   help="training autocast (default: iwslt none, cpu auto: bf16 where the CPU computes it natively)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads of every command (default: unset; with --jobs N: cores / N; --tiny: 1)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (default: 1)")
    stop = p.add_argument_group("stopping and budget")
    stop.add_argument("--max-updates", type=int, default=None, help="update cap of every run (iwslt: 12000; cpu: "
                      "the update count bench/reproduce_curve.py chose, in bench/results/reproduce_cpu_curve.json; "
                      "tiny: 30); also the length DropHead's V schedule and Weighted's kappa/alpha freeze plan for")
    stop.add_argument("--patience", type=int, default=None, help="stop after N validations without a better "
                      "valid BLEU (iwslt: 5; cpu: none, every run trains --max-updates; tiny: 3)")
    stop.add_argument("--valid-every", type=int, default=None, help="validate and checkpoint every N updates "
                      "(iwslt: 500; cpu: 250)")
    stop.add_argument("--valid-sentences", type=int, default=None, help="validation BLEU on the first N of val (default: all)")
    stop.add_argument("--max-epochs", type=int, default=200, help="epoch cap (default: the preset's 200)")
    stop.add_argument("--budget", type=float, default=None, help="minutes this call may take: no run starts later, and "
                      "every training stops in time (resumed by the next call)")
    stop.add_argument("--reserve", type=float, default=None, help="minutes of --budget kept for scoring and the "
                      "analyses (full: 2.5; 1.5 with --no-analyses)")
    stop.add_argument("--min-segment", type=float, default=0.5, help="no training starts with fewer --budget minutes left")
    stop.add_argument("--whole-runs", action="store_true", help="with --budget on a CPU (--recipe cpu): start a run "
                      "only when its estimated minutes fit what is left (bench/reproduce_cost.py), since a run cut "
                      "short is lost where the work folder does not outlive the call")
    stop.add_argument("--segment-updates", type=int, default=None, help="pause each run after N more updates (resume later)")
    recipe = p.add_argument_group("recipe")
    recipe.add_argument("--average-last", type=int, default=None, help="checkpoints averaged (full: 5; tiny: 3)")
    recipe.add_argument("--rho-grid", type=lambda s: [float(x) for x in s.split(",")], default=list(DEFAULT_RHO_GRID),
                        help="MAT drop-branch rates tried at --grid-seed (default: 0.1,0.2,0.3)")
    recipe.add_argument("--rho", type=float, default=None, help="fix MAT's rho (no grid; cpu: 0.2, mat-tiny's)")
    recipe.add_argument("--grid-seed", type=int, default=1, help="seed of the rho grid runs (default: 1)")
    recipe.add_argument("--warmup", type=int, default=None, help="LR warm-up updates (default: the preset's 4000)")
    recipe.add_argument("--lr", type=float, default=None, help="peak LR (default: the preset's 5e-4)")
    recipe.add_argument("--set", dest="overrides", action="append", default=[], metavar="[SYSTEM:]KEY=VALUE",
                        help="a config override for every run, or for one system's runs (repeatable)")
    p.add_argument("--vocab-size", type=int, default=None, help="joint SentencePiece vocabulary (full: 8000; tiny: 300)")
    p.add_argument("--train-lines", type=int, default=None, help="use the first N training pairs (tiny: 300)")
    p.add_argument("--valid-lines", type=int, default=None, help="use the first N validation pairs (tiny: 40)")
    p.add_argument("--test-lines", type=int, default=None, help="use the first N test pairs (tiny: 40)")
    p.add_argument("--bootstrap", type=int, default=1000, help="paired bootstrap resamples (default: 1000)")
    p.add_argument("--results-per-run", action="store_true", help="write one results file per finished run, "
                   "OUT/NAME_RUN_seedK.json, instead of OUT/NAME.json (its per-line BLEU statistics give the "
                   "paired bootstrap; no translations are kept); a run that a results file in OUT or "
                   "bench/results holds finished, trained to the same settings, is not trained again")
    p.add_argument("--skip-reported", action="store_true", help="do not train a run that a results file in OUT "
                   "or bench/results holds finished, trained to the same settings (as --results-per-run does), "
                   "while writing one OUT/NAME.json")
    p.add_argument("--again", nargs="+", default=[], metavar="RUN/seedK", help="with --results-per-run or "
                   "--skip-reported: train these runs even where a results file holds them finished, e.g. a run "
                   "a GPU reported, trained again on the CPU (the report sets the two devices' scores side by side)")
    p.add_argument("--save-hyps", action="store_true", help="also write OUT/NAME_hyps.json: every finished run's "
                   "test translations (averaged and best checkpoint)")
    p.add_argument("--no-analyses", dest="analyses", action="store_false", help="skip the papers' analyses of "
                   "finished runs (bench/reproduce_analyses.py: pruning curves, BLEU by length, gates, diversity)")
    p.add_argument("--analysis-sentences", type=int, default=None, help="test sentences scored per pruning-curve "
                   "point (full: 500; tiny: 40)")
    p.add_argument("--analysis-examples", type=int, default=None, help="valid examples for head importance and "
                   "MUTE diversity (default: all of val)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep last.pt and the step checkpoints of "
                   "finished runs (default: only best.pt and the average stay)")
    p.add_argument("--prepare-only", action="store_true", help="prepare the data and stop (e.g. before carrying it)")
    p.add_argument("--dry-run", action="store_true", help="print the runs and their dependencies and stop")
    args = p.parse_args(argv)
    recipe = RECIPES[args.recipe]
    defaults = {**recipe.defaults, **TINY_DEFAULTS} if args.tiny else recipe.defaults
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.systems is None:
        args.systems = list(recipe.table_systems)
    foreign = [s for s in args.systems if s not in recipe.systems]
    if foreign:
        p.error(f"--systems {' '.join(foreign)}: not in the {args.recipe} recipe ({' '.join(recipe.systems)})")
    if args.rho is None:
        args.rho = recipe.rho
    if args.max_updates is None and not (args.dry_run or args.prepare_only):
        p.error("the CPU recipe's number of updates is not chosen yet: bench/reproduce_curve.py measures it on the "
                "standard model's validation curve (or give --max-updates)")
    if args.again and not (args.results_per_run or args.skip_reported):
        p.error("--again needs --results-per-run or --skip-reported (without them every run is trained anyway)")
    if args.reserve is None:
        args.reserve = 0.0 if args.tiny else (2.5 if args.analyses else 1.5)
    if args.threads is None and args.tiny:
        args.threads = 1
    elif args.threads is None and args.jobs > 1:  # runs side by side share the cores, none oversubscribes them
        args.threads = max(1, (os.cpu_count() or 1) // args.jobs)
    stem = "reproduce" if args.recipe == "iwslt" else f"reproduce_{args.recipe}"
    if args.name is None:
        args.name = f"{stem}_tiny" if args.tiny else stem
    if args.work is None:
        args.work = ROOT / "runs" / (f"{stem}-tiny" if args.tiny else stem).replace("_", "-")
    args.work = args.work.resolve()
    args.out = args.out.resolve()
    args.data = args.data.resolve() if args.data else None
    if args.grid_seed not in args.seeds and any(s in MAT_SYSTEMS for s in args.systems) and args.rho is None:
        print(f"note: the rho grid runs at --grid-seed {args.grid_seed}, which is not among --seeds", file=sys.stderr)
    return args


def stop_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM to the harness's process group (the background runner's stop) ends it as Ctrl-C does: the trainings,
    signalled too, save last.pt, and the harness writes each run's record of its training call before it exits."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if threading.current_thread() is not threading.main_thread():
        return Harness(args).main()
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        return Harness(args).main()
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
