"""A synthetic translation task with real structure, generated offline (the default of `multibranch demo`).

Both languages are made of pseudo-words drawn from a seeded `random.Random`, so the lexicon, the
suffixes and the corpus are identical for one seed and different for another. The languages are
named `src` and `tgt`.

Lexicon (about 180 lemmas): 80 nouns (each with a target gender, masculine or feminine), 30
transitive and 10 intransitive verbs, 30 adjectives, 3 determiners (definite, indefinite,
demonstrative), 8 prepositions, 3 conjunctions (and, but, or), 7 subject pronouns (1sg, 2sg, 3sg
masculine, 3sg feminine, 1pl, 2pl, 3pl) and a relative pronoun. Every lemma has exactly one
translation, so the target is a function of the source (no synonyms).

Morphology:
- source (English-like): nouns take a plural suffix (`-s` / `-es`); verbs take `-s` / `-es` with a
  third-person singular subject; the indefinite and demonstrative determiners have singular and
  plural forms; adjectives, prepositions and the relative word `that` are invariable.
- target (agreement-rich): nouns take a plural suffix chosen by gender; determiners, adjectives and
  the relative pronoun agree with their noun in gender and number (4 suffixes); verbs agree with
  the subject in person and number (6 suffixes). Suffixes are drawn per seed.

Syntax (source -> target):
    Sentence := Clause (Conj Clause){0,2} [. ! ?]       (a comma may precede "but"; copied to target)
    Clause   := Subj V [Obj] [PP]          ->  Subj [Obj] [PP] V            (SVO -> SOV, verb-final)
    Subj     := Pronoun | NP | NP and NP   (coordinated subjects take a 3pl verb)
    NP       := Det Adj{0,2} N [PP | Rel]  ->  Det N Adj{mirrored} [PP | Rel]  (noun before adjectives)
    PP       := Prep NPs                   ->  NPs Post                      (prepositions -> postpositions)
    Rel      := that V [NPs]               ->  Rel-agr [NPs] V-agr           (subject relative, verb-final)
    NPs      := Det Adj{0,2} N             (simple NP: no PP, no Rel)
A clause whose object carries a relative clause has no adverbial PP, so every source sentence has one
analysis (NP-attached and adverbial PPs after an object give the same target string). Sides have the
same number of words: the target is a reordering plus inflection of the source. Punctuation is
attached to the preceding word. Sentences have MIN_WORDS..MAX_WORDS words (3..40; longer draws are
redrawn), typically 5-20. Each side has a few hundred word forms (`Lexicon.src_forms()` /
`tgt_forms()`: roughly 300 source and 550 target forms). Validation and test sentences never repeat a
training (or each other's) source sentence.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multibranch.data.text import write_lines

MIN_WORDS, MAX_WORDS = 3, 40
N_NOUNS, N_TRANSITIVE, N_INTRANSITIVE, N_ADJECTIVES, N_PREPOSITIONS = 80, 30, 10, 30, 8
GENDERS = ("m", "f")
NUMBERS = ("sg", "pl")
AGREEMENT = [(g, n) for g in GENDERS for n in NUMBERS]  # determiner / adjective / relative agreement
PERSONS = [(p, n) for n in NUMBERS for p in (1, 2, 3)]  # verb agreement
PRONOUNS = [(1, "sg"), (2, "sg"), (3, "sg"), (3, "sg"), (1, "pl"), (2, "pl"), (3, "pl")]  # 3sg: m and f
DETERMINERS = ("def", "indef", "dem")

_SRC_SOUNDS = ("bdfgklmnprstvz", "aeiou")
_TGT_SOUNDS = ("bcdfghjklmnprstwz", "aeiouäü")
_AGR_SUFFIXES = ("a", "e", "o", "i", "an", "en", "on", "ir", "ul", "es", "ak", "ot")
_PERSON_SUFFIXES = ("m", "s", "t", "mu", "tu", "nt", "ir", "ek", "om", "as", "il", "un")
_PLURAL_SUFFIXES = ("en", "i", "er", "ai", "ot", "ul")


@dataclass(frozen=True)
class Word:
    """One lemma: its source forms by feature and its target forms by feature."""

    src: dict[Any, str]
    tgt: dict[Any, str]
    gender: str = ""  # target gender (nouns)


@dataclass
class Lexicon:
    nouns: list[Word]
    transitive: list[Word]
    intransitive: list[Word]
    adjectives: list[Word]
    determiners: dict[str, Word]
    prepositions: list[Word]
    conjunctions: dict[str, Word]
    pronouns: list[Word]
    relative: Word

    def _all(self) -> list[Word]:
        return [
            *self.nouns, *self.transitive, *self.intransitive, *self.adjectives, *self.determiners.values(),
            *self.prepositions, *self.conjunctions.values(), *self.pronouns, self.relative,
        ]

    def src_forms(self) -> set[str]:
        return {form for word in self._all() for form in word.src.values()}

    def tgt_forms(self) -> set[str]:
        return {form for word in self._all() for form in word.tgt.values()}

    def tgt_verb_forms(self) -> set[str]:
        return {form for word in self.transitive + self.intransitive for form in word.tgt.values()}

    def src_verb_forms(self) -> set[str]:
        return {form for word in self.transitive + self.intransitive for form in word.src.values()}


class _Namer:
    """Pseudo-words of one language; every form of every lemma is distinct."""

    def __init__(self, rng: random.Random, sounds: tuple[str, str]) -> None:
        self.rng, self.consonants, self.vowels = rng, sounds[0], sounds[1]
        self.used: set[str] = set()

    def stem(self, syllables: tuple[int, int]) -> str:
        rng = self.rng
        return "".join(
            rng.choice(self.consonants) + rng.choice(self.vowels) + (rng.choice(self.consonants) if rng.random() < 0.3 else "")
            for _ in range(rng.randint(*syllables))
        )

    def lemma(self, syllables: tuple[int, int], inflect: Callable[[str], dict[Any, str]]) -> dict[Any, str]:
        while True:
            forms = inflect(self.stem(syllables))
            values = set(forms.values())
            if not values & self.used:
                self.used |= values
                return forms


def _s_suffix(stem: str) -> str:
    return stem + ("s" if stem[-1] in "aeiou" else "es")


def build_lexicon(seed: int) -> Lexicon:
    """The lexicon of `seed` (stable: it depends on the seed only)."""
    rng = random.Random(f"multibranch-synthetic-lexicon:{seed}")
    src, tgt = _Namer(rng, _SRC_SOUNDS), _Namer(rng, _TGT_SOUNDS)
    agr = dict(zip(AGREEMENT, rng.sample(_AGR_SUFFIXES, len(AGREEMENT)), strict=True))
    person = dict(zip(PERSONS, rng.sample(_PERSON_SUFFIXES, len(PERSONS)), strict=True))
    plural = dict(zip(GENDERS, rng.sample(_PLURAL_SUFFIXES, len(GENDERS)), strict=True))

    def agreeing(stem: str) -> dict[Any, str]:
        return {key: stem + suffix for key, suffix in agr.items()}

    def invariable(stem: str) -> dict[Any, str]:
        return {None: stem}

    nouns = []
    for _ in range(N_NOUNS):
        gender = rng.choice(GENDERS)
        nouns.append(Word(
            src.lemma((1, 3), lambda s: {"sg": s, "pl": _s_suffix(s)}),
            tgt.lemma((1, 3), lambda s, g=gender: {"sg": s, "pl": s + plural[g]}),
            gender,
        ))

    def verb() -> Word:
        return Word(
            src.lemma((1, 3), lambda s: {key: _s_suffix(s) if key == (3, "sg") else s for key in PERSONS}),
            tgt.lemma((1, 2), lambda s: {key: s + suffix for key, suffix in person.items()}),
        )

    transitive = [verb() for _ in range(N_TRANSITIVE)]
    intransitive = [verb() for _ in range(N_INTRANSITIVE)]
    adjectives = [Word(src.lemma((1, 3), invariable), tgt.lemma((1, 3), agreeing)) for _ in range(N_ADJECTIVES)]
    determiners = {
        "def": Word(src.lemma((1, 1), lambda s: {"sg": s, "pl": s}), tgt.lemma((1, 1), agreeing)),
        "indef": Word(src.lemma((1, 1), lambda s: {"sg": s, "pl": s + "m"}), tgt.lemma((1, 1), agreeing)),
        "dem": Word(src.lemma((1, 2), lambda s: {"sg": s, "pl": s + "n"}), tgt.lemma((1, 1), agreeing)),
    }
    prepositions = [Word(src.lemma((1, 2), invariable), tgt.lemma((1, 2), invariable)) for _ in range(N_PREPOSITIONS)]
    conjunctions = {
        name: Word(src.lemma((1, 1), invariable), tgt.lemma((1, 1), invariable)) for name in ("and", "but", "or")
    }
    pronouns = [Word(src.lemma((1, 1), invariable), tgt.lemma((1, 2), invariable)) for _ in PRONOUNS]
    relative = Word(src.lemma((1, 1), invariable), tgt.lemma((1, 1), agreeing))
    return Lexicon(
        nouns, transitive, intransitive, adjectives, determiners, prepositions, conjunctions, pronouns, relative
    )


@dataclass
class _Phrase:
    src: list[str]
    tgt: list[str]
    gender: str = ""
    number: str = "sg"
    person: int = 3
    has_relative: bool = False


class Grammar:
    """Draws parallel sentences from a lexicon (see the module docstring for the rules)."""

    def __init__(self, lexicon: Lexicon) -> None:
        self.lex = lexicon

    def simple_np(self, rng: random.Random) -> _Phrase:
        noun = rng.choice(self.lex.nouns)
        number = "pl" if rng.random() < 0.35 else "sg"
        det = self.lex.determiners[rng.choice(("def", "def", "indef", "dem"))]
        adjectives = rng.sample(self.lex.adjectives, rng.choices((0, 1, 2), weights=(55, 30, 15))[0])
        key = (noun.gender, number)
        return _Phrase(
            [det.src[number], *(a.src[None] for a in adjectives), noun.src[number]],
            [det.tgt[key], noun.tgt[number], *(a.tgt[key] for a in reversed(adjectives))],
            noun.gender,
            number,
        )

    def pp(self, rng: random.Random) -> _Phrase:
        prep, inner = rng.choice(self.lex.prepositions), self.simple_np(rng)
        return _Phrase([prep.src[None], *inner.src], [*inner.tgt, prep.tgt[None]])

    def np(self, rng: random.Random) -> _Phrase:
        phrase = self.simple_np(rng)
        draw = rng.random()
        if draw < 0.2:
            pp = self.pp(rng)
            phrase.src += pp.src
            phrase.tgt += pp.tgt
        elif draw < 0.32:
            key = (3, phrase.number)
            rel = self.lex.relative.tgt[(phrase.gender, phrase.number)]
            if rng.random() < 0.6:
                verb, obj = rng.choice(self.lex.transitive), self.simple_np(rng)
                phrase.src += [self.lex.relative.src[None], verb.src[key], *obj.src]
                phrase.tgt += [rel, *obj.tgt, verb.tgt[key]]
            else:
                verb = rng.choice(self.lex.intransitive)
                phrase.src += [self.lex.relative.src[None], verb.src[key]]
                phrase.tgt += [rel, verb.tgt[key]]
            phrase.has_relative = True
        return phrase

    def subject(self, rng: random.Random) -> _Phrase:
        draw = rng.random()
        if draw < 0.2:
            i = rng.randrange(len(PRONOUNS))
            word = self.lex.pronouns[i]
            return _Phrase([word.src[None]], [word.tgt[None]], person=PRONOUNS[i][0], number=PRONOUNS[i][1])
        if draw < 0.28:
            a, b, conj = self.np(rng), self.np(rng), self.lex.conjunctions["and"]
            return _Phrase([*a.src, conj.src[None], *b.src], [*a.tgt, conj.tgt[None], *b.tgt], number="pl")
        return self.np(rng)

    def clause(self, rng: random.Random) -> _Phrase:
        subj = self.subject(rng)
        key = (subj.person, subj.number)
        src, tgt = list(subj.src), list(subj.tgt)
        if rng.random() < 0.65:
            verb, obj = rng.choice(self.lex.transitive), self.np(rng)
            src += [verb.src[key], *obj.src]
            tgt += obj.tgt
            adverbial = not obj.has_relative and rng.random() < 0.3
        else:
            verb = rng.choice(self.lex.intransitive)
            src.append(verb.src[key])
            adverbial = rng.random() < 0.4
        if adverbial:
            pp = self.pp(rng)
            src += pp.src
            tgt += pp.tgt
        tgt.append(verb.tgt[key])
        return _Phrase(src, tgt)

    def sentence(self, rng: random.Random) -> tuple[str, str]:
        """One parallel sentence pair, MIN_WORDS..MAX_WORDS words on each side."""
        while True:
            first = self.clause(rng)
            src, tgt = first.src, first.tgt
            for _ in range(2):
                if rng.random() >= 0.25:
                    break
                name = rng.choice(("and", "and", "but", "or"))
                if name == "but" and rng.random() < 0.5:
                    src[-1] += ","
                    tgt[-1] += ","
                conj, nxt = self.lex.conjunctions[name], self.clause(rng)
                src += [conj.src[None], *nxt.src]
                tgt += [conj.tgt[None], *nxt.tgt]
            if MIN_WORDS <= len(src) <= MAX_WORDS:
                break
        mark = rng.choices(("", ".", "?", "!"), weights=(60, 30, 5, 5))[0]
        return " ".join(src) + mark, " ".join(tgt) + mark


def generate_pairs(seed: int, n: int, split: str, exclude: set[str] | None = None) -> list[tuple[str, str]]:
    """`n` sentence pairs of `split`; with `exclude`, source sentences in it (or repeated) are redrawn."""
    grammar = Grammar(build_lexicon(seed))
    rng = random.Random(f"multibranch-synthetic-{split}:{seed}")
    pairs: list[tuple[str, str]] = []
    seen = set(exclude or ())
    attempts = 0
    while len(pairs) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"could not draw {n} distinct new {split} sentences")
        src, tgt = grammar.sentence(rng)
        if exclude is not None:
            if src in seen:
                continue
            seen.add(src)
        pairs.append((src, tgt))
    return pairs


def generate_synthetic_task(
    out_dir: str | Path, seed: int = 1, n_train: int = 20000, n_valid: int = 500, n_test: int = 500
) -> dict[str, Any]:
    """Write `{train,valid,test}.{src,tgt}` into `out_dir`; returns what was written and the lexicon size."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train = generate_pairs(seed, n_train, "train")
    seen = {src for src, _ in train}
    valid = generate_pairs(seed, n_valid, "valid", exclude=seen)
    seen |= {src for src, _ in valid}
    test = generate_pairs(seed, n_test, "test", exclude=seen)
    files: dict[str, dict[str, str]] = {}
    for name, pairs in (("train", train), ("valid", valid), ("test", test)):
        files[name] = {}
        for side, column in (("src", 0), ("tgt", 1)):
            path = out / f"{name}.{side}"
            write_lines(path, (pair[column] for pair in pairs))
            files[name][side] = str(path)
    lexicon = build_lexicon(seed)
    return {
        "out_dir": str(out),
        "seed": seed,
        "src_lang": "src",
        "tgt_lang": "tgt",
        "prefixes": {name: str(out / name) for name in files},
        "files": files,
        "sizes": {"train": len(train), "valid": len(valid), "test": len(test)},
        "lexicon": {
            "lemmas": len(lexicon._all()),
            "src_forms": len(lexicon.src_forms()),
            "tgt_forms": len(lexicon.tgt_forms()),
        },
    }
