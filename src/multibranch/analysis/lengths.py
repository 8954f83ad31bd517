"""BLEU and sentence counts by source-length bucket (MUSE Fig. 3, docs/papers.md#muse-length-buckets-and-gate-ratios).

Length = the sentence's subword tokens as the model reads them (the prepared split's ids; the appended
EOS is not counted). Buckets are given by their inclusive upper edges: edges (15, 30) mean 1-15, 16-30,
>30. Empty buckets are reported with 0 sentences and BLEU null.

lengths.json:
    {"data", "split", "sentences", "buckets": [{"label", "low", "high"}],
     "models": [{"label", "checkpoint", "bleu", "signature", "buckets": [{"label", "low", "high",
                 "sentences", "bleu"}]}]}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from multibranch.analysis.batches import check_vocabulary
from multibranch.evaluate.metrics import score_corpus
from multibranch.figures import plots
from multibranch.figures.report import ReportFolder
from multibranch.loading.checkpoint import load_model
from multibranch.tasks.translation.dataset import PreparedData
from multibranch.tasks.translation.translator import Translator

# the report's files beside index.md: in a folder of other files, ReportFolder.check refuses them up front
REPORT_FILES = ("lengths.json", "lengths.png")

DEFAULT_EDGES = (15, 30, 45, 60, 75, 90, 105)


@dataclass(frozen=True)
class Bucket:
    """Source lengths low..high inclusive (high None: no upper bound)."""

    low: int
    high: int | None

    @property
    def label(self) -> str:
        return f">{self.low - 1}" if self.high is None else f"{self.low}-{self.high}"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "low": self.low, "high": self.high}


def make_buckets(edges: Sequence[int]) -> list[Bucket]:
    """Buckets 1..e1, e1+1..e2, ..., >e_last from strictly increasing positive upper edges."""
    if not edges or any(e < 1 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"bucket edges {list(edges)} must be strictly increasing integers >= 1")
    lows = [1, *(e + 1 for e in edges)]
    return [Bucket(low, high) for low, high in zip(lows, [*edges, None], strict=True)]


def parse_edges(text: str) -> list[int]:
    """'15,30,45' -> [15, 30, 45] (ValueError with the reason otherwise)."""
    try:
        edges = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"bucket edges {text!r} must be comma-separated integers, e.g. 15,30,45") from None
    make_buckets(edges)
    return edges


def assign_buckets(lengths: Sequence[int], buckets: list[Bucket]) -> np.ndarray:
    """Index of each sentence's bucket, [n]; sentences shorter than 1 token go to the first bucket."""
    uppers = np.array([b.high for b in buckets[:-1]], dtype=np.int64)
    return np.searchsorted(uppers, np.asarray(lengths, dtype=np.int64), side="left")


def bleu_by_length(lengths: Sequence[int], hypotheses: list[str], references: list[str],
                   buckets: list[Bucket]) -> list[dict[str, Any]]:
    """Corpus BLEU (sacreBLEU) and sentence count of every bucket, in bucket order."""
    if not len(lengths) == len(hypotheses) == len(references):
        raise ValueError(f"{len(lengths)} lengths, {len(hypotheses)} hypotheses, {len(references)} references")
    which = assign_buckets(lengths, buckets)
    rows = []
    for index, bucket in enumerate(buckets):
        members = np.flatnonzero(which == index).tolist()
        bleu = None
        if members:
            result = score_corpus([hypotheses[i] for i in members], [[references[i] for i in members]],
                                  metrics=("bleu",))
            bleu = float(result["bleu"]["score"])
        rows.append({**bucket.to_dict(), "sentences": len(members), "bleu": bleu})
    return rows


@dataclass
class LengthOptions:
    split: str = "test"
    max_sentences: int | None = None
    edges: tuple[int, ...] = DEFAULT_EDGES
    beam: int | None = None
    device: str = "cpu"


def analyze_lengths(ckpts: list[str], labels: list[str] | None, data_dir: str | Path, out: str | Path,
                    options: LengthOptions, force: bool = False) -> ReportFolder:
    """Translate the split with every checkpoint and write lengths.json, lengths.png, index.md."""

    ReportFolder.check(out, force, REPORT_FILES)
    labels = labels or [Path(c).stem if len(ckpts) == 1 else str(c) for c in ckpts]
    if len(labels) != len(ckpts):
        raise ValueError(f"{len(labels)} labels for {len(ckpts)} checkpoints")
    buckets = make_buckets(options.edges)
    data = PreparedData.load(data_dir)
    split = data.split(options.split)
    n = len(split) if options.max_sentences is None else min(options.max_sentences, len(split))
    sources, references = split.raw_src_lines()[:n], split.raw_tgt_lines()[:n]
    lengths = split.src_lengths[:n].tolist()
    models = []
    for ckpt, label in zip(ckpts, labels, strict=True):
        loaded = load_model(ckpt, options.device, task="translation")
        check_vocabulary(data, loaded.config.model, str(ckpt))
        decode = loaded.config.decode
        if options.beam is not None:
            decode = dataclasses.replace(decode, beam=options.beam)
        translator = Translator(loaded.model, loaded.tokenizer or data.tokenizer(), decode, options.device)
        hypotheses = translator.translate(sources)
        total = score_corpus(hypotheses, [references], metrics=("bleu",))["bleu"]
        models.append({"label": label, "checkpoint": str(ckpt), "bleu": float(total["score"]),
                       "signature": total["signature"], "decode": dataclasses.asdict(decode),
                       "buckets": bleu_by_length(lengths, hypotheses, references, buckets)})
    report = {"data": str(data_dir), "split": split.name, "sentences": n,
              "buckets": [b.to_dict() for b in buckets], "models": models}
    return write_report(report, out, force)


def write_report(report: dict[str, Any], out: str | Path, force: bool) -> ReportFolder:
    folder = ReportFolder.create(out, force, REPORT_FILES)
    folder.write_json("lengths.json", report)
    folder.write_png("lengths.png", plots.length_buckets_plot(report))
    lines = [f"# BLEU by source length ({report['sentences']} sentences of `{report['split']}` of "
             f"`{report['data']}`)", "", "Source length = subword tokens of the source sentence (EOS not counted). "
             "Numbers: [lengths.json](lengths.json).", "", "![BLEU by source length](lengths.png)", "",
             "| bucket | sentences | " + " | ".join(m["label"] for m in report["models"]) + " |",
             "|---|---:|" + "---:|" * len(report["models"])]
    for i, bucket in enumerate(report["buckets"]):
        scores = [m["buckets"][i]["bleu"] for m in report["models"]]
        cells = " | ".join("-" if s is None else f"{s:.2f}" for s in scores)
        lines.append(f"| {bucket['label']} | {report['models'][0]['buckets'][i]['sentences']} | {cells} |")
    lines.append("| all | {} | {} |".format(report["sentences"], " | ".join(f"{m['bleu']:.2f}" for m in report["models"])))
    folder.write_text("index.md", "\n".join(lines) + "\n")
    return folder
