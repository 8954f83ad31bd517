"""Would averaging seeds clear the bar? Valid accuracy of trained runs alone and of their averaged probabilities.

Reads runs that `bench/classify_quality.py` trained (their best.pt), labels the VALIDATION split of the
same prepared data with `multibranch classify --probs` (the test split is not read), and reports each
run's accuracy and the accuracy of the mean probability over the runs of each system and over all runs.
An ensemble of k runs costs k trainings, so it is a measure of what variance reduction could buy, not
a preset.

    python bench/classify_ensemble.py --dataset sst2 --runs runs/bench/cq_sst2/sst2 --name ensemble_sst2
Results: bench/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--name", help="results file bench/results/<name>.json (default: ensemble_<dataset>)")
    args = parser.parse_args()
    scratch = work_dir() / (args.name or f"ensemble_{args.dataset}")
    scratch.mkdir(parents=True, exist_ok=True)
    log = scratch / "classify.log"
    data = prepared(args.dataset, log, args.vocab)
    texts, gold = read_split(data, "valid")
    runs = sorted(p for p in args.runs.iterdir() if (p / "best.pt").is_file() and "-seed" in p.name)
    if not runs:
        sys.exit(f"{args.runs}: no <system>-seed<N>/best.pt runs")
    tables = {run.name: probabilities(run / "best.pt", data / "valid.txt", scratch / f"{run.name}.valid", log)
              for run in runs}
    systems: dict[str, list[str]] = defaultdict(list)
    for name in tables:
        systems[name.rsplit("-seed", 1)[0]].append(name)
    rows = [{"system": system, "runs": names, "alone": [round(accuracy([tables[n]], gold), 4) for n in names],
             "ensemble": round(accuracy([tables[n] for n in names], gold), 4)} for system, names in systems.items()]
    rows.append({"system": "all", "runs": list(tables), "ensemble": round(accuracy(list(tables.values()), gold), 4)})
    for row in rows:
        print(f"{row['system']:>24}: alone {row.get('alone', '-')}  ensemble of {len(row['runs'])}: {row['ensemble']}")
    result = {"environment": environment(), "dataset": args.dataset, "split": "valid", "examples": len(texts),
              "rows": rows}
    path = RESULTS / f"{args.name or f'ensemble_{args.dataset}'}.json"
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"written {path}")


if __name__ == "__main__":
    main()
