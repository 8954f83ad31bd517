"""Tokenised BLEU, the way the WMT14 En-De papers report it (multi-bleu.perl on the given tokens).

The seed papers' WMT14 En-De numbers are BLEU on Moses-tokenised text, and since Vaswani et al. with
compound splitting: every hyphen between two non-space characters becomes its own token,
`a-b` -> `a ##AT##-##AT## b` (tensor2tensor's get_ende_bleu.sh, fairseq's compound_split_bleu.sh,
both `perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`). The score depends on the tokenisation of the
hypotheses and references, so it is only comparable between systems scored on the same tokens; it is
always reported next to sacreBLEU, never instead of it.

Hypotheses and references must already be tokenised the same way (e.g. `translate` output on a
`prepare --pretokenized` directory, with `@@ ` undone, against fairseq's tokenised references): this
module splits on whitespace and adds nothing else. Like multi-bleu.perl, there is no smoothing (a zero
n-gram precision gives BLEU 0) and case matters unless `lowercase`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU

from multibranch.errors import DataError

_COMPOUND = re.compile(r"(\S)-(\S)")

NOT_COMPARABLE = "tokenised BLEU: not comparable across tokenisations; report sacreBLEU"


def compound_split(line: str) -> str:
    """`a-b` -> `a ##AT##-##AT## b`, left to right without overlap, exactly as the perl one-liner."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]], *, split_compounds: bool = False,
                   lowercase: bool = False) -> dict[str, Any]:
    """Corpus BLEU on whitespace tokens of `hypotheses` against the reference streams (lists of lines):
    {"name", "score", "precisions", "bp", "sys_len", "ref_len", "compound_split", "signature", "text",
    "note"}. DataError when a stream's line count differs."""
    for i, stream in enumerate(references, start=1):
        if len(stream) != len(hypotheses):
            raise DataError(f"line counts differ: {len(hypotheses)} hypotheses but {len(stream)} lines in reference {i}")
    prepare = compound_split if split_compounds else (lambda line: line)
    hyps = [" ".join(prepare(line).split()) for line in hypotheses]
    refs = [[" ".join(prepare(line).split()) for line in stream] for stream in references]
    metric = BLEU(tokenize="none", smooth_method="none", lowercase=lowercase, force=True)
    score = metric.corpus_score(hyps, refs)
    signature = f"{metric.get_signature()}|compound-split:{'yes' if split_compounds else 'no'}"
    return {
        "name": "tokenized BLEU",
        "score": float(score.score),
        "precisions": [float(p) for p in score.precisions],
        "bp": float(score.bp),
        "sys_len": int(score.sys_len),
        "ref_len": int(score.ref_len),
        "compound_split": split_compounds,
        "signature": signature,
        "text": f"tokenized {score}",
        "note": NOT_COMPARABLE,
    }
