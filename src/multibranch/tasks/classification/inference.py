"""Labelling raw text with a trained classifier: its tokenizer (SentencePiece or HF), batches, softmax;
an ensemble of classifiers averages their probabilities.

An example is a text, or for a sentence-pair classifier (`classifier.pairs`) a pair of texts (a, b),
encoded as `prepare` encodes pairs (`pairs.join_pair`: the tokenizer's separator, longest_first cut to
the model's positions). Text lines give pairs as `a<TAB>b` (`parse_examples`).
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch
from torch import Tensor, nn

from multibranch.data.tokenizer import AnyTokenizer
from multibranch.errors import DataError
from multibranch.tasks.classification.pairs import join_pair, pair_separator
from multibranch.tasks.classification.task import encode_batch

Example = str | tuple[str, str]

logger = logging.getLogger(__name__)


def is_pair_model(model: nn.Module) -> bool:
    """Whether a classifier reads sentence pairs."""
    return bool(getattr(model.head, "pairs", False))


def check_examples(model: nn.Module, examples: list[Example], name: str) -> None:
    """DataError when single texts go to a pair classifier `name` or pairs to a single-text one."""
    pairs = [isinstance(x, tuple) for x in examples]
    if is_pair_model(model) and not all(pairs):
        raise DataError(f"{name} classifies sentence pairs: give two texts per example (a<TAB>b lines; "
                        '{"pairs": [[a, b], ...]} in a request)')
    if not is_pair_model(model) and any(pairs):
        raise DataError(f"{name} classifies single texts, not sentence pairs: give one text per example")


def encode_examples(model: nn.Module, tokenizer: AnyTokenizer, examples: list[Example]) -> list[list[int]]:
    """Token ids (no BOS/EOS) of texts or pairs, cut to the model's positions (pairs: longest_first)."""
    return encode_and_cut(model, tokenizer, examples)[0]


def encode_and_cut(model: nn.Module, tokenizer: AnyTokenizer,
                   examples: list[Example]) -> tuple[list[list[int]], list[int]]:
    """`encode_examples`' token ids, and the positions of the examples that were cut to fit."""
    limit = model.config.max_positions - 2  # BOS + EOS
    if not examples or not isinstance(examples[0], tuple):
        full = tokenizer.encode_src(list(examples))  # type: ignore[arg-type]
        return [seq[:limit] for seq in full], [i for i, seq in enumerate(full) if len(seq) > limit]
    separator = pair_separator(tokenizer)
    firsts = tokenizer.encode_src([a for a, _ in examples])  # type: ignore[misc]
    seconds = tokenizer.encode_src([b for _, b in examples])  # type: ignore[misc]
    joined = [join_pair(a, b, separator, limit) for a, b in zip(firsts, seconds, strict=True)]
    return [ids for ids, _ in joined], [i for i, (_, cut) in enumerate(joined) if cut]


def parse_examples(lines: list[str], pairs: bool, name: str) -> list[Example | None]:
    """Examples of input lines: a blank line -> None; with `pairs` each other line is `a<TAB>b` (DataError
    naming `name:line` for another number of columns or an empty text); without, the line itself, but
    input whose every line has one TAB (pairs) is refused."""
    if not pairs:
        texts = [line for line in lines if line.strip()]
        if texts and all(line.count("\t") == 1 for line in texts):
            raise DataError(f"{name}: every line holds two tab-separated texts (sentence pairs), but the classifier "
                            "classifies single texts")
        return [line if line.strip() else None for line in lines]
    out: list[Example | None] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            out.append(None)
            continue
        cells = line.split("\t")
        if len(cells) != 2:
            raise DataError(f"{name}:{number}: {len(cells)} tab-separated column(s); the classifier reads sentence "
                            "pairs: two texts a<TAB>b per line")
        for which, cell in zip(("first", "second"), cells):
            if not cell.strip():
                raise DataError(f"{name}:{number}: empty {which} text of the pair")
        out.append((cells[0], cells[1]))
    return out


@torch.no_grad()
def classify_lines(model: nn.Module, tokenizer: AnyTokenizer, lines: list[Example],
                   device: torch.device | str = "cpu", batch_size: int = 64) -> Tensor:
    """Class probabilities [n, C] (fp32) of `lines` (non-empty texts, or pairs for a pair classifier);
    inputs longer than the model's positions are truncated, with one warning counting them."""
    cfg = model.config
    check_examples(model, lines, "the classifier")
    ids, cut = encode_and_cut(model, tokenizer, lines)
    if cut:
        logger.warning("%d of %d texts are longer than the classifier's %d tokens; each is classified from its "
                       "first %d tokens (pairs: both texts shortened, longest first), as prepare cut the training "
                       "data", len(cut), len(lines), cfg.max_positions - 2, cfg.max_positions - 2)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths together: less padding
    probs = torch.zeros(len(ids), model.head.num_labels)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = encode_batch([ids[i] for i in chunk], cfg.pad_id, cfg.bos_id, cfg.eos_id).to(device)  # [B, S]
        probs[chunk] = model(src).float().softmax(-1).cpu()  # [B, C]
    return probs


def label_names(config: object) -> list[str]:
    """The label names of a classifier's ExperimentConfig, in output order ("0", "1", ... if unnamed)."""
    head = config.classifier  # type: ignore[attr-defined]
    return head.labels or [str(i) for i in range(head.num_labels)]


class Classifiers(Protocol):
    """A loaded classifier or ensemble (`loading.model.LoadedModel`): whether it reads pairs, its mean probabilities."""

    pairs: bool

    def classify(self, examples: list[Example], batch_size: int = 64) -> torch.Tensor: ...


def classify_text_lines(classifiers: Classifiers, lines: list[str], batch_size: int = 64,
                        name: str = "<input>") -> list[list[float] | None]:
    """Per input line (`name`, for errors) the label probabilities of `classifiers`, or None for an empty line;
    a pair classifier reads `a<TAB>b` lines."""
    examples = parse_examples(lines, classifiers.pairs, name)
    kept = [i for i, example in enumerate(examples) if example is not None]
    per_line: list[list[float] | None] = [None] * len(lines)
    if kept:
        probs = classifiers.classify([examples[i] for i in kept], batch_size)  # type: ignore[misc]  # [n, C]
        for row, i in enumerate(kept):
            per_line[i] = probs[row].tolist()
    return per_line
