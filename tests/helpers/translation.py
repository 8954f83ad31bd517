"""Generated text for the tiny translation model (its SentencePiece model and its inputs)."""

from __future__ import annotations

import random

MAX_POSITIONS = 24  # learned positions of the tiny translation model (the `experiment` fixture)


def corpus_lines(n: int, seed: int) -> list[str]:
    """n lines of made-up words built from ten syllables."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(40)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def translator_of(path: object, device: str = "cpu", precision: str = "fp32", **decode: object) -> object:
    """The translator `multibranch translate` decodes with for one checkpoint, export or CTranslate2 directory,
    with `decode` fields over its decode config."""
    from multibranch.loading.model import LoadedModel

    return LoadedModel.load(str(path), device, precision, decode=decode).translator()
