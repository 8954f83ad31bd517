"""A synthetic code-docstring corpus (three function templates) for the code task tests."""

from __future__ import annotations

import random
from pathlib import Path

NAMES = ["alpha", "beta", "gamma", "delta", "count", "total", "size", "width", "height", "depth"]
OPS = {"plus": "+", "minus": "-", "times": "*"}


def synthetic_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """n (docstring literal, escaped function) pairs from three templates: arithmetic, a guarded print
    (two indentation levels) and a greeting (a space inside a string, a DCNL in the docstring)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        a, b = rng.sample(NAMES, 2)
        kind = rng.randrange(3)
        if kind == 0:
            op = rng.choice(sorted(OPS))
            pairs.append((f"'Return {a} {op} {b}.'",
                          f"def {a}_{op}_{b}({a}, {b}): DCNL DCSP return ({a} {OPS[op]} {b})"))
        elif kind == 1:
            pairs.append((f"'Print {a} if it is positive.'",
                          f"def show_{a}({a}): DCNL DCSP if ({a} > 0): DCNL DCSP  DCSP print({a})"))
        else:
            pairs.append((f"'Greet {a}. DCNL Says hello.'", f"def greet_{a}(): DCNL DCSP return 'hello DCSP {a}'"))
    return pairs


def write_corpus(prefix: Path, pairs: list[tuple[str, str]]) -> Path:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.desc").write_text("".join(d + "\n" for d, _ in pairs), encoding="utf-8")
    Path(f"{prefix}.code").write_text("".join(c + "\n" for _, c in pairs), encoding="utf-8")
    return prefix
