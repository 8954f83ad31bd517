"""What a user can break: each case runs one `multibranch` command, as a user would, against input or output
that is wrong, and checks the three promises of the README:

    exit code     2 for bad input or a refused output, 143 after SIGTERM (0 where the input is valid)
    message       one line on stderr naming the problem (a substring each case gives), never a traceback
    disk          a refused command leaves its folder exactly as it was (every file's bytes, no new file);
                  an interrupted one leaves no temporary (`.NAME.tmp*`, `.NAME.*.tmp`) beside its output

    python bench/bad_input_sweep.py                  # every case, a few minutes on 2 cores
    python bench/bad_input_sweep.py -k force sigterm # the cases whose name contains one of the words
    python bench/bad_input_sweep.py --keep DIR       # keep the cases' folders under DIR to look at them

The fixtures come from the CLI itself: `multibranch demo` (a small MAT, its raw text, prepared data and
run directory) and `train --preset transformer-tiny` on the same data (a standard model for the conversions).
Each case gets its own copy of what it touches. Results: bench/results/bad_input_sweep.json (one row per case:
exit code, stderr's last line, what failed); the exit status is 1 when any case fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench.common import environment, preset_amp  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "bad_input_sweep.json"
TEMPORARY = re.compile(r"^\..*(\.tmp|\.tmp-.*|\.tmp\..*)$")


@dataclass
class Case:
    """One command against bad input. `setup(folder)` writes what the case needs into its folder and returns
    the arguments after `multibranch`; `message` must appear in stderr's last line. With `sigterm_after`
    (seconds) the command is sent SIGTERM then, and only temporaries are checked on disk."""

    name: str
    setup: Callable[[Path], list[str]]
    message: str
    code: int = 2
    sigterm_after: float | None = None
    unchanged: bool = True  # a refused command changes nothing in the case's folder
    env: dict[str, str] = field(default_factory=dict)


def multibranch(*args: str, cwd: Path, env: dict[str, str] | None = None,
                sigterm_after: float | None = None) -> subprocess.CompletedProcess:
    """`multibranch ARGS` in a fresh process (the installed console script), stdout and stderr captured."""
    command = [sys.executable, "-m", "multibranch", *args]
    process = subprocess.Popen(command, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    if sigterm_after is not None:
        try:
            process.wait(sigterm_after)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
    try:
        out, err = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path -> sha256 of its bytes)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class Fixtures:
    """A demo run (MAT), a standard run on the same data, and an export directory, made once by the CLI."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        demo = root / "demo"
        steps = [("demo", "--out", str(demo), "--updates", "5"),
                 ("train", "--data", str(demo / "data"), "--out", str(root / "standard"), "--preset",
                  "transformer-tiny", "--max-steps", "3"),
                 ("convert", "export", "--ckpt", str(root / "standard" / "best.pt"), "--out", str(root / "export"))]
        for step in steps:
            done = multibranch(*step, cwd=root)
            if done.returncode != 0:
                raise SystemExit(f"fixture step `multibranch {' '.join(step)}` failed:\n{done.stderr}")
        self.raw, self.data, self.run = demo / "raw", demo / "data", demo / "run"
        self.standard, self.export = root / "standard", root / "export"

    def copy(self, name: str, folder: Path) -> Path:
        """A copy of one fixture (raw, data, run, standard, export) inside the case's folder."""
        source = {"raw": self.raw, "data": self.data, "run": self.run, "standard": self.standard,
                  "export": self.export}[name]
        target = folder / name
        shutil.copytree(source, target)
        return target


def write(path: Path, text: str | bytes) -> Path:
    """`path` holding `text`; returns `path`."""
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def notes(folder: Path, name: str = "notes") -> Path:
    """A folder of the user's own files, which no --force may delete."""
    path = folder / name
    path.mkdir()
    (path / "ideas.txt").write_text("keep me\n", encoding="utf-8")
    return path


def cases(fx: Fixtures) -> list[Case]:
    def prepare_args(raw: Path, out: Path, *extra: str) -> list[str]:
        return ["prepare", "--src", "src", "--tgt", "tgt", "--train", str(raw / "train"), "--valid",
                str(raw / "valid"), "--out", str(out), "--vocab-size", "120", *extra]

    def train_args(data: Path, out: Path, *extra: str) -> list[str]:
        return ["train", "--data", str(data), "--out", str(out), "--preset", "transformer-tiny",
                "--max-steps", "2", *extra]

    def big_raw(folder: Path) -> Path:
        """The demo's training text repeated until `prepare` takes seconds (for the signal cases)."""
        raw = fx.copy("raw", folder)
        for side in ("src", "tgt"):
            text = (raw / f"train.{side}").read_text(encoding="utf-8")
            (raw / f"train.{side}").write_text(text * 60, encoding="utf-8")
        return raw

    def corrupt_tokens(folder: Path) -> list[str]:
        data = fx.copy("data", folder)
        tokens = np.load(data / "train.src.tokens.npy")
        tokens[3] = 10**6  # an id far beyond the vocabulary
        np.save(data / "train.src.tokens.npy", tokens)
        return train_args(data, folder / "run")

    def corrupt_offsets(folder: Path) -> list[str]:
        data = fx.copy("data", folder)
        offsets = np.load(data / "train.tgt.offsets.npy")
        offsets[len(offsets) // 2] = offsets[-1] * 10  # offsets past the end of the tokens
        np.save(data / "train.tgt.offsets.npy", offsets)
        return train_args(data, folder / "run")

    def truncated_spm(folder: Path) -> list[str]:
        export = fx.copy("export", folder)
        model = export / "spm.model" if (export / "spm.model").exists() else next(export.glob("*.model"))
        model.write_bytes(model.read_bytes()[:100])
        (folder / "in.txt").write_text("ein haus\n", encoding="utf-8")
        return ["translate", "--ckpt", str(export), "-i", str(folder / "in.txt"), "-o", str(folder / "out.txt")]

    def translate_input(folder: Path, data: bytes, *extra: str) -> list[str]:
        return ["translate", "--ckpt", str(fx.run / "best.pt"), "-i", str(write(folder / "in.txt", data)), *extra]

    def dict_overwrite(folder: Path) -> list[str]:
        raw = fx.copy("raw", folder)
        words = sorted({w for line in (raw / "train.src").read_text(encoding="utf-8").split("\n") for w in line.split()}
                       | {w for line in (raw / "train.tgt").read_text(encoding="utf-8").split("\n") for w in line.split()})
        lines = [f"{w} 1" for w in words] + [f"{words[0]} 5 #fairseq:overwrite"]
        (folder / "dict.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return ["prepare", "--src", "src", "--tgt", "tgt", "--train", str(raw / "train"), "--valid",
                str(raw / "valid"), "--out", str(folder / "data"), "--pretokenized", "--dict", str(folder / "dict.txt")]

    def truncated_checkpoint(folder: Path) -> list[str]:
        (folder / "broken.pt").write_bytes((fx.run / "best.pt").read_bytes()[:5000])
        (folder / "in.txt").write_text("ein haus\n", encoding="utf-8")
        return ["translate", "--ckpt", str(folder / "broken.pt"), "-i", str(folder / "in.txt")]

    def mismatched(folder: Path) -> list[str]:
        raw = fx.copy("raw", folder)
        lines = (raw / "train.tgt").read_text(encoding="utf-8").splitlines(keepends=True)
        (raw / "train.tgt").write_text("".join(lines[:-3]), encoding="utf-8")
        return prepare_args(raw, folder / "data")

    def stopped_before_first_checkpoint(folder: Path) -> Path:
        """The run as a start killed before its first checkpoint leaves it: config.yaml, tokenizer/, train.log,
        metrics.jsonl, an empty checkpoints/; no checkpoint."""
        run = fx.copy("run", folder)
        for checkpoint in run.rglob("*.pt"):
            checkpoint.unlink()
        return run

    def same_file(folder: Path) -> list[str]:
        (folder / "in.txt").write_text("ein haus\n", encoding="utf-8")
        return ["translate", "--ckpt", str(fx.run / "best.pt"), "-i", str(folder / "in.txt"), "-o",
                str(folder / "." / "in.txt"), "--force"]

    return [
        # --force replaces only output of its own kind
        Case("force-to-hf-onto-run", lambda f: ["convert", "to-hf", "--ckpt", str(fx.standard / "best.pt"),
                                                "--out", str(fx.copy("run", f)), "--force"],
             "is a training run directory, not a Hugging Face model folder"),
        Case("force-ct2-onto-notes", lambda f: ["convert", "ct2", "--ckpt", str(fx.standard / "best.pt"),
                                                "--out", str(notes(f)), "--force"],
             "is a directory of other files, not a CTranslate2 model directory"),
        Case("force-prepare-onto-notes", lambda f: prepare_args(fx.raw, notes(f), "--force"),
             "is a directory of other files, not a prepared data directory"),
        Case("force-export-onto-data", lambda f: ["convert", "export", "--ckpt", str(fx.standard / "best.pt"),
                                                  "--out", str(fx.copy("data", f)), "--force"],
             "is a prepared data directory, not a release export directory"),
        Case("force-average-onto-text", lambda f: ["average", "--ckpts", str(fx.run / "best.pt"),
                                                   str(fx.run / "last.pt"), "--out",
                                                   str(notes(f) / "ideas.txt"), "--force"],
             "is a file, not a multibranch checkpoint"),
        Case("force-average-onto-best-pt", lambda f: ["average", "--run", str(fx.copy("run", f)), "--last", "1",
                                                      "--out", str(f / "run" / "best.pt"), "--force"],
             "is the best.pt of a training run"),
        Case("force-export-onto-its-input", lambda f: ["convert", "export", "--ckpt", str(fx.copy("export", f)),
                                                       "--out", str(f / "export"), "--force", "--dtype", "fp16"],
             "holds the input"),
        # a run killed before its first checkpoint: a plain start names the remedies, --auto-resume starts over
        Case("train-into-run-stopped-before-first-checkpoint",
             lambda f: train_args(fx.data, stopped_before_first_checkpoint(f)), "pass --auto-resume or --force"),
        Case("train-auto-resume-run-stopped-before-first-checkpoint",
             lambda f: train_args(fx.data, stopped_before_first_checkpoint(f), "--auto-resume"), "", code=0,
             unchanged=False),
        # messages that name what is wrong
        Case("train-classification-preset-missing-data",
             lambda f: ["train", "--data", str(f / "nowhere"), "--out", str(f / "run"), "--preset", "trec6-tiny"],
             "(the directory does not exist)"),
        Case("average-two-runs-of-other-configs",
             lambda f: ["average", "--ckpts", str(fx.run / "best.pt"), str(fx.standard / "best.pt"), "--out",
                        str(f / "avg.pt")], f": {fx.run / 'best.pt'} "),  # the run's path, not just best.pt
        # a failed start leaves no run directory
        Case("train-max-tokens-20", lambda f: train_args(fx.data, f / "run", "--max-tokens", "20"),
             "--max-tokens"),
        Case("train-learned-positions-too-short",
             lambda f: train_args(fx.data, f / "run", "--set", "model.positions=learned",
                                  "--set", "model.max_positions=4"), "max_positions"),
        Case("train-token-ids-beyond-vocabulary", corrupt_tokens, "vocabulary"),
        Case("train-offsets-corrupted", corrupt_offsets, "offsets"),
        Case("train-unknown-config-key", lambda f: train_args(fx.data, f / "run", "--set", "model.bogus=1"),
             "model.bogus"),
        # numbers out of range, NaN or infinite: one line naming the option, before anything is loaded or written
        Case("train-max-steps-negative", lambda f: train_args(fx.data, f / "run", "--max-steps", "-3"),
             "--max-steps -3: must be >= 1"),
        Case("translate-lenpen-nan", lambda f: translate_input(f, b"ein haus\n", "--lenpen", "nan"), "--lenpen"),
        Case("translate-lenpen-inf", lambda f: translate_input(f, b"ein haus\n", "--lenpen", "inf"), "--lenpen"),
        Case("translate-max-len-b-negative", lambda f: translate_input(f, b"ein haus\n", "--max-len-b", "-5"),
             "--max-len-b -5"),
        Case("serve-max-body-bytes-tiny", lambda f: ["serve", "--ckpt", str(fx.run / "best.pt"), "--port", "0",
                                                     "--max-body-bytes", "10"], "--max-body-bytes 10"),
        # a line over the model's limit, refused by name before anything is written
        Case("translate-long-line-refused", lambda f: translate_input(
            f, b"ein haus\n" + b"ein haus steht am fluss " * 600 + b"\n", "--long-inputs", "refuse", "-o",
            str(f / "out.txt")), "input line 2 has"),
        # one line where a traceback was
        Case("translate-temperature-inf", lambda f: translate_input(f, b"ein haus\n", "--sampling",
                                                                    "--temperature", "inf"), "--temperature"),
        Case("translate-export-truncated-spm", truncated_spm, "spm"),
        Case("translate-invalid-utf8", lambda f: translate_input(f, b"ein haus\n\xff\xfe kaputt\n"), "in.txt:2"),
        Case("translate-truncated-checkpoint", truncated_checkpoint, "broken.pt"),
        Case("translate-output-is-input", same_file, "same file as input"),
        Case("translate-ensemble-mean-one-checkpoint",
             lambda f: translate_input(f, b"ein haus\n", "--ensemble-mean", "prob"), "--ensemble-mean"),
        Case("classify-with-translation-checkpoint",
             lambda f: ["classify", "--ckpt", str(fx.run / "best.pt"), "-i", str(write(f / "in.txt", "x\n"))],
             "translation"),
        # data the user prepares
        Case("prepare-mismatched-line-counts", mismatched, "lines"),
        Case("prepare-spm-sample-0", lambda f: prepare_args(fx.raw, f / "data", "--spm-sample", "0"),
             "--spm-sample"),
        Case("prepare-dict-fairseq-overwrite", dict_overwrite, "", code=0, unchanged=False),
        # SIGTERM: as Ctrl-C, temporaries removed, exit 143
        Case("sigterm-prepare", lambda f: prepare_args(big_raw(f), f / "data", "--workers", "2"),
             "terminated", code=143, sigterm_after=4.0, unchanged=False),
        Case("sigterm-translate-force", lambda f: translate_input(
            f, b"ein haus steht am fluss\n" * 3000, "-o", str(write(f / "out.txt", "old\n")), "--force"), "terminated", code=143, sigterm_after=6.0, unchanged=False),
    ]


def run_case(case: Case, folder: Path) -> dict:
    """Run one case in its own folder; the row says what was checked and what failed."""
    folder.mkdir(parents=True)
    args = case.setup(folder)
    before = snapshot(folder)
    start = time.perf_counter()
    done = multibranch(*args, cwd=folder, env=case.env, sigterm_after=case.sigterm_after)
    lines = done.stderr.strip().splitlines()
    last = lines[-1] if lines else ""
    failures = []
    if done.returncode != case.code:
        failures.append(f"exit {done.returncode}, expected {case.code}")
    if "Traceback" in done.stderr:
        failures.append("a traceback on stderr")
    if case.code != 0 and case.message not in last:
        failures.append(f"stderr's last line lacks {case.message!r}")
    if case.code == 2 and len(lines) != 1:
        failures.append(f"{len(lines)} lines on stderr, expected 1")
    after = snapshot(folder)
    left = sorted(name for name in after if TEMPORARY.match(Path(name).name))
    if left:
        failures.append(f"temporaries left: {left}")
    if case.unchanged and after != before:
        changed = sorted(set(after) ^ set(before) | {n for n in after if n in before and after[n] != before[n]})
        failures.append(f"changed on disk: {changed[:5]}")
    return {"case": case.name, "argv": ["multibranch", *args], "exit": done.returncode, "stderr": last,
            "seconds": round(time.perf_counter() - start, 2), "ok": not failures, "failures": failures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", nargs="+", default=[], help="run only the cases whose name contains one of these")
    parser.add_argument("--keep", type=Path, help="work under this folder and keep it (default: a temporary one)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON results go")
    args = parser.parse_args()
    os.environ.setdefault("MULTIBRANCH_CPU_KERNELS", "0")  # the kernels' own cache has its tests
    root = Path(tempfile.mkdtemp(prefix="bad-input-")) if args.keep is None else args.keep
    root.mkdir(parents=True, exist_ok=True)
    try:
        fixtures = Fixtures(root / "fixtures")
        chosen = [c for c in cases(fixtures) if not args.k or any(word in c.name for word in args.k)]
        rows = []
        for case in chosen:
            row = run_case(case, root / "cases" / case.name)
            rows.append(row)
            print(f"{'ok  ' if row['ok'] else 'FAIL'} {case.name:42s} exit {row['exit']:3d}  {row['stderr'][:110]}")
            for failure in row["failures"]:
                print(f"     - {failure}")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    failed = [r["case"] for r in rows if not r["ok"]]
    summary = {"environment": environment(amp=preset_amp("transformer-tiny")), "cases": len(rows),
               "failed": failed, "rows": rows}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    partial = args.results.with_name(f".{args.results.name}.tmp")
    partial.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, args.results)
    print(f"{len(rows) - len(failed)} of {len(rows)} cases as promised; results in {args.results}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
