"""The SST-2 held-out split of bench/classify_quality.py: whole sentences held out, none of their
phrases left in train (a hand-made parse-tree file)."""

from __future__ import annotations

from pathlib import Path

from bench.classify_quality import sentence_level_split

SENTENCES = [  # (label, sentence of >= 10 words) ... and each one's phrases below
    ("1", "a warm and funny film that never loses sight of its characters"),
    ("0", "the plot is a mess and the jokes fall flat every single time"),
    ("1", "one of the best films of the year , full of heart and wit"),
    ("0", "a tedious exercise in style that forgets to tell any story at all"),
]
PHRASES = [("1", "a warm and funny film"), ("1", "funny"), ("0", "the plot is a mess"), ("0", "fall flat"),
           ("1", "the best films of the year"), ("0", "tedious"), ("1", "full of heart and wit"),
           ("1", "heart"), ("0", "a tedious exercise in style"), ("1", "film")]


def test_held_out_sentences_take_their_phrases_out_of_train(tmp_path: Path):
    raw = tmp_path / "train.tsv"
    rows = ["label\tsentence", *(f"{label}\t{text}" for label, text in SENTENCES + PHRASES)]
    raw.write_bytes(("\r\n".join(rows) + "\r\n").encode())  # CRLF like the shared file
    split = sentence_level_split(raw, test=1, valid=1, seed=1)
    held = split["test"][0] + split["valid"][0]
    assert len(held) == 2 and set(held) <= {text for _, text in SENTENCES}
    train_texts = split["train"][0]
    for sentence in held:
        assert not [t for t in train_texts if f" {t} " in f" {sentence} "], sentence
    # the phrases of the two sentences still in train stay, so do phrases that only share words ("film")
    kept = {text for _, text in SENTENCES} - set(held)
    assert kept <= set(train_texts)
    assert len(train_texts) + 2 == len(SENTENCES) + len(PHRASES) - sum(
        1 for _, p in PHRASES if any(f" {p} " in f" {s} " for s in held))
    # labels travel with their texts
    labels = {text: label for label, text in SENTENCES + PHRASES}
    for part in split.values():
        assert all(labels[t] == y for t, y in zip(*part))
