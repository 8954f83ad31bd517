"""The built-in synthetic task: deterministic, structured, as documented in its module docstring."""

from __future__ import annotations

import pytest

from multibranch.data.text import read_parallel
from multibranch.tasks.translation.synthetic import (
    MAX_WORDS,
    MIN_WORDS,
    build_lexicon,
    generate_pairs,
    generate_synthetic_task,
)

PUNCT = ",.?!"


def _words(sentence: str) -> list[str]:
    return [w.strip(PUNCT) for w in sentence.split()]


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, str]]:
    return generate_pairs(5, 3000, "train")


def test_same_seed_same_files_different_seed_different(tmp_path):
    a = generate_synthetic_task(tmp_path / "a", seed=4, n_train=200, n_valid=20, n_test=20)
    b = generate_synthetic_task(tmp_path / "b", seed=4, n_train=200, n_valid=20, n_test=20)
    generate_synthetic_task(tmp_path / "c", seed=5, n_train=200, n_valid=20, n_test=20)
    names = [f"{split}.{side}" for split in ("train", "valid", "test") for side in ("src", "tgt")]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(names)
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    assert a["sizes"] == {"train": 200, "valid": 20, "test": 20}
    assert a["lexicon"] == b["lexicon"]
    assert a["src_lang"] == "src" and a["tgt_lang"] == "tgt"
    for split, prefix in a["prefixes"].items():
        text = read_parallel(f"{prefix}.src", f"{prefix}.tgt")
        assert len(text) == a["sizes"][split]


def test_lexicon_is_stable_per_seed_and_a_few_hundred_forms():
    assert build_lexicon(2) == build_lexicon(2)
    assert build_lexicon(2).src_forms() != build_lexicon(3).src_forms()
    lex = build_lexicon(2)
    assert 150 <= len(lex._all()) <= 250
    assert 200 <= len(lex.src_forms()) <= 400
    assert 400 <= len(lex.tgt_forms()) <= 700


def test_lengths_and_vocabulary(pairs):
    lex = build_lexicon(5)
    lengths = [len(s.split()) for s, _ in pairs]
    assert min(lengths) >= MIN_WORDS and max(lengths) <= MAX_WORDS
    assert min(lengths) <= 4 and max(lengths) >= 25  # the whole documented range is used
    assert all(len(s.split()) == len(t.split()) for s, t in pairs)
    src_types = {w for s, _ in pairs for w in _words(s)}
    tgt_types = {w for _, t in pairs for w in _words(t)}
    assert src_types <= lex.src_forms() and tgt_types <= lex.tgt_forms()
    assert len(src_types) >= 0.8 * len(lex.src_forms())


def test_target_is_a_function_of_the_source(pairs):
    mapping: dict[str, str] = {}
    for src, tgt in pairs + generate_pairs(5, 3000, "other"):
        assert mapping.setdefault(src, tgt) == tgt


def test_word_order_differs(pairs):
    lex = build_lexicon(5)
    src_verbs, tgt_verbs = lex.src_verb_forms(), lex.tgt_verb_forms()
    # Target clauses are verb-final; source clauses are SVO, so they rarely end in a verb.
    assert all(_words(t)[-1] in tgt_verbs for _, t in pairs)
    src_final = sum(_words(s)[-1] in src_verbs for s, _ in pairs) / len(pairs)
    assert src_final < 0.3
    # Adjectives precede the noun in the source and follow it in the target.
    adjectives_src = {a.src[None] for a in lex.adjectives}
    nouns_src = {f for n in lex.nouns for f in n.src.values()}
    adjectives_tgt = {f for a in lex.adjectives for f in a.tgt.values()}
    nouns_tgt = {f for n in lex.nouns for f in n.tgt.values()}

    def adjective_then_noun(words, adjectives, nouns):
        return sum(a in adjectives and b in nouns for a, b in zip(words, words[1:], strict=False))

    src_an = sum(adjective_then_noun(_words(s), adjectives_src, nouns_src) for s, _ in pairs)
    tgt_an = sum(adjective_then_noun(_words(t), adjectives_tgt, nouns_tgt) for _, t in pairs)
    tgt_na = sum(adjective_then_noun(_words(t), nouns_tgt, adjectives_tgt) for _, t in pairs)
    assert src_an > 100 and tgt_na > 100 and tgt_an == 0


def test_target_agreement(pairs):
    lex = build_lexicon(5)
    # A target adjective right after a noun carries that noun's gender/number suffix.
    noun_feats = {f: (n.gender, num) for n in lex.nouns for num, f in n.tgt.items()}
    adj_feats = {f: key for a in lex.adjectives for key, f in a.tgt.items()}
    checked = 0
    for _, t in pairs:
        words = _words(t)
        for a, b in zip(words, words[1:], strict=False):
            if a in noun_feats and b in adj_feats:
                assert adj_feats[b] == noun_feats[a]
                checked += 1
    assert checked > 100


def test_valid_and_test_do_not_repeat_training_sentences(tmp_path):
    info = generate_synthetic_task(tmp_path, seed=1, n_train=500, n_valid=50, n_test=50)
    sources = {
        split: read_parallel(f"{prefix}.src", f"{prefix}.tgt").src.lines for split, prefix in info["prefixes"].items()
    }
    assert not set(sources["valid"]) & set(sources["train"])
    assert not set(sources["test"]) & (set(sources["train"]) | set(sources["valid"]))
    assert len(set(sources["valid"])) == 50
