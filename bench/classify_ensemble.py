"""Would averaging seeds clear the bar? Accuracy of trained runs alone and of their averaged probabilities.

Reads runs that `bench/classify_quality.py` trained (their best.pt), labels a split of the same prepared
data with `multibranch classify --probs`, and reports each run's accuracy and the accuracy of the mean
probability over the runs of each system and over all runs (what `classify --ckpt A B C` predicts), or
with `--members K` of each K consecutive seeds of a system (mean and sd over those ensembles).
An ensemble of k runs costs k trainings. The validation split (default) is for deciding; `--split test`
scores a decided ensemble once.

    python bench/classify_ensemble.py --dataset sst2 --runs runs/bench/cq_sst2/sst2 --name ensemble_sst2
    python bench/classify_ensemble.py --dataset trec6 --runs DIR --split test --name ensemble_trec6_test
Results: bench/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.classify_quality import DATASETS, multibranch, prepared, read_split, sh  # noqa: E402
from bench.common import RESULTS, environment, work_dir  # noqa: E402


def probabilities(ckpt: Path, texts: Path, out: Path, log: Path) -> list[dict[str, float]]:
    """One {label: probability} per line of `texts`, from `classify --probs`."""
    sh(multibranch("classify", "--ckpt", str(ckpt), "-i", str(texts), "-o", str(out), "--probs", "--device", "cpu"), log)
    rows = []
    for line in out.read_text(encoding="utf-8").splitlines():
        _, probs = line.split("\t")
        rows.append({name: float(p) for name, p in (item.rsplit("=", 1) for item in probs.split(" "))})
    return rows


def accuracy(tables: list[list[dict[str, float]]], gold: list[str]) -> float:
    """Accuracy of the argmax of the summed probabilities of `tables` (one table per run)."""
    right = 0
    for i, label in enumerate(gold):
        summed: dict[str, float] = defaultdict(float)
        for table in tables:
            for name, p in table[i].items():
                summed[name] += p
        right += max(summed, key=summed.__getitem__) == label
    return right / len(gold)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, choices=list(DATASETS))
    parser.add_argument("--runs", required=True, type=Path, help="folder of <system>-seed<N> run directories")
    parser.add_argument("--vocab", type=int, help="the vocabulary the runs were prepared with (default: the dataset's)")
    parser.add_argument("--split", choices=["valid", "test"], default="valid")
    parser.add_argument("--members", type=int, help="ensembles of K consecutive seeds per system (default: all seeds)")
    parser.add_argument("--name", help="results file bench/results/<name>.json (default: ensemble_<dataset>)")
    args = parser.parse_args()
    scratch = work_dir() / (args.name or f"ensemble_{args.dataset}")
    scratch.mkdir(parents=True, exist_ok=True)
    log = scratch / "classify.log"
    data = prepared(args.dataset, log, args.vocab)
    texts, gold = read_split(data, args.split)
    runs = sorted((p for p in args.runs.iterdir() if (p / "best.pt").is_file() and "-seed" in p.name),
                  key=lambda p: (p.name.rsplit("-seed", 1)[0], int(p.name.rsplit("-seed", 1)[1])))
    if not runs:
        sys.exit(f"{args.runs}: no <system>-seed<N>/best.pt runs")
    tables = {run.name: probabilities(run / "best.pt", data / f"{args.split}.txt", scratch / f"{run.name}.{args.split}", log)
              for run in runs}
    systems: dict[str, list[str]] = defaultdict(list)
    for name in tables:
        systems[name.rsplit("-seed", 1)[0]].append(name)
    rows = []
    for system, names in systems.items():
        size = args.members or len(names)
        groups = [names[i : i + size] for i in range(0, len(names) - size + 1, size)]
        ensembles = [round(accuracy([tables[n] for n in group], gold), 4) for group in groups]
        rows.append({"system": system, "runs": names, "alone": [round(accuracy([tables[n]], gold), 4) for n in names],
                     "members": size, "groups": groups, "ensemble": ensembles, "ensemble_mean": statistics.mean(ensembles),
                     "ensemble_sd": statistics.stdev(ensembles) if len(ensembles) > 1 else 0.0})
    if not args.members:
        rows.append({"system": "all", "runs": list(tables), "members": len(tables),
                     "ensemble": [round(accuracy(list(tables.values()), gold), 4)]})
    for row in rows:
        print(f"{row['system']:>24}: alone {row.get('alone', '-')}  ensembles of {row['members']}: {row['ensemble']}")
    result = {"environment": environment(amp="none"),  # `classify` runs without autocast
              "dataset": args.dataset, "split": args.split, "runs_dir": str(args.runs), "examples": len(texts),
              "rows": rows}
    path = RESULTS / f"{args.name or f'ensemble_{args.dataset}'}.json"
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"written {path}")


if __name__ == "__main__":
    main()
