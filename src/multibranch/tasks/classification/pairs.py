"""Sentence pairs as one input sequence: the separator between the two texts and the truncation.

A pair (a, b) is stored and fed as one token sequence `a + separator + b`; the task adds BOS and EOS
around it as around a single text, so the model reads

    BERT import      [CLS] a [SEP] b [SEP]          (segment ids 0 up to the first SEP, 1 after it)
    RoBERTa import   <s> a </s></s> b </s>
    trained here     BOS a EOS b EOS                (the EOS piece is the separator)

A Hugging Face tokenizer's separator is read off its own pair template (its post-processor), so the
ids equal `tokenizer(a, b)`'s. Over-long pairs are cut as Hugging Face's `longest_first` strategy cuts
them (`longest_first`).
"""

from __future__ import annotations

from multibranch.data.tokenizer import AnyTokenizer, HFTokenizer
from multibranch.errors import DataError


def pair_separator(tokenizer: AnyTokenizer) -> list[int]:
    """The ids between the two texts of a pair: a Hugging Face tokenizer's (from its pair template,
    e.g. [SEP] for BERT, </s></s> for RoBERTa), else [EOS]."""
    if not isinstance(tokenizer, HFTokenizer):
        return [tokenizer.eos_id]
    backend = tokenizer.backend
    a, b = (backend.encode(text, add_special_tokens=False).ids for text in ("a", "b"))
    full = backend.encode("a", "b", add_special_tokens=True).ids
    if not (len(full) > len(a) + len(b) + 2 and full[0] == tokenizer.bos_id and full[-1] == tokenizer.eos_id
            and full[1 : 1 + len(a)] == a and full[len(full) - 1 - len(b) : -1] == b):
        raise DataError(f"the Hugging Face tokenizer's pair template {full} is not CLS a SEP... b SEP; "
                        "its sentence pairs cannot be encoded")
    return full[1 + len(a) : len(full) - 1 - len(b)]


def longest_first(n1: int, n2: int, budget: int) -> tuple[int, int]:
    """The lengths (k1, k2) that Hugging Face's `longest_first` truncation keeps of texts of n1 and n2
    tokens for at most `budget` tokens together: the longer text loses tokens until both are equally
    long, then both lose them alternately (an odd budget gives the extra token to the second text, or
    to the longer one)."""
    if n1 + n2 <= budget:
        return n1, n2
    short, long = min(n1, n2), max(n1, n2)
    if short > budget:
        long = short
    else:
        long = max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget // 2 + budget % 2
    return (short, long) if n1 <= n2 else (long, short)


def join_pair(a: list[int], b: list[int], separator: list[int], max_len: int | None) -> tuple[list[int], bool]:
    """(a + separator + b with a and b cut by `longest_first` to fit `max_len` tokens in all, whether
    it was cut). ValueError if `max_len` leaves no room for one token of each text."""
    if max_len is None:
        return [*a, *separator, *b], False
    budget = max_len - len(separator)
    if budget < 2:
        raise ValueError(f"max_len={max_len} leaves no room for two texts and the separator {separator}")
    k1, k2 = longest_first(len(a), len(b), budget)
    return [*a[:k1], *separator, *b[:k2]], (k1, k2) != (len(a), len(b))
