"""Scores for generated Python functions: PoV, mean sentence BLEU and corpus BLEU.

- **PoV** (percentage of valid code, the MAT paper's code-generation metric): the fraction of
  hypotheses that `ast.parse` accepts, under the grammar of the running Python, as one function
  definition: the parsed module's body is exactly one `FunctionDef` or `AsyncFunctionDef` (its
  decorators are part of it; comments and blank lines are not statements). Text that parses but is
  something else (`QQQQ`, `raise SystemExit(3)`, a function with statements before or after it,
  two functions, a class) is invalid: each target is one function (docs/code-generation.md says
  why). Generated code is only parsed, never executed or compiled to bytecode, and names are never
  resolved. Parsing is guarded: sources longer than `MAX_SOURCE_CHARS` characters count as invalid
  without being parsed, and SyntaxError (IndentationError, TabError), ValueError (null bytes),
  RecursionError, MemoryError and OverflowError all mean "invalid".
- **BLEU on code tokens.** Both sides are cut into code tokens, so that BLEU does not depend on
  layout (indentation width, spaces around operators, line breaks): Python's `tokenize` over the
  source, keeping names, numbers, strings and operators and dropping NEWLINE/NL/INDENT/DEDENT,
  comments and whitespace. Source that `tokenize` rejects (unbalanced brackets at the end,
  inconsistent dedent, an unterminated triple-quoted string) falls back to `regex_code_tokens`,
  which gives the same tokens on code that tokenizes. The tokens are joined by single spaces and
  scored by sacreBLEU with `tokenize="none"` (sacreBLEU splits on whitespace, so the words of a
  string constant count one by one).
- **Sentence BLEU** is sacreBLEU's sentence score with exponential smoothing (`smooth_method="exp"`,
  effective order), averaged over the hypotheses (docs/papers.md#mat-code-generation-pov); **corpus BLEU** is
  `multibranch.evaluate.metrics.score_corpus` on the same token streams.

By default hypotheses and references are in the corpus's one-line escaped form (`DCNL`/`DCSP`, what
a line-based model writes) and are decoded with `multibranch.tasks.code.corpus.decode_code` first.
"""

from __future__ import annotations

import ast
import re
import tokenize
import warnings
from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU

from multibranch.errors import DataError
from multibranch.evaluate.metrics import score_corpus
from multibranch.tasks.code.corpus import decode_code, python_tokens, split_source_functions

MAX_SOURCE_CHARS = 100_000
CODE_TOKENIZATION = "python tokenize (regex fallback), layout dropped, tokens joined by spaces"
_LAYOUT = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT,
           tokenize.ENDMARKER, tokenize.ENCODING}

_OPERATORS = sorted(
    ["**=", "//=", ">>=", "<<=", "...", "!=", "%=", "&=", "**", "*=", "+=", "-=", "->", "//", "/=",
     ":=", "<<", "<=", "==", ">=", ">>", "@=", "^=", "|="],
    key=len, reverse=True,
)
_REGEX_TOKEN = re.compile(
    "|".join([
        r"(?P<skip>\s+|#[^\n]*|\\\n)",
        r"(?P<string>(?:[rRbBuUfF]{1,2})?(?:'''[\s\S]*?(?:'''|\Z)|\"\"\"[\s\S]*?(?:\"\"\"|\Z)"
        r"|'(?:[^'\\\n]|\\[\s\S])*'|\"(?:[^\"\\\n]|\\[\s\S])*\"))",
        r"(?P<number>0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+"
        r"|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d[\d_]*)?[jJ]?)",
        r"(?P<name>[^\W\d]\w*)",
        "(?P<op>" + "|".join(re.escape(op) for op in _OPERATORS) + r"|\S)",
    ])
)


# ---- PoV --------------------------------------------------------------------------------------------


def _parse(source: str, max_chars: int) -> ast.Module | None:
    """`ast.parse(source)`, or None for blank, too long or unparseable source (never executed)."""
    if not source.strip() or len(source) > max_chars:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. invalid escape sequences: still valid code
            return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


def parses(source: str, max_chars: int = MAX_SOURCE_CHARS) -> bool:
    """True if `source` is not blank, has at most `max_chars` characters and `ast.parse` accepts it."""
    return _parse(source, max_chars) is not None


def is_function(tree: ast.Module | None) -> bool:
    """What PoV counts: a parsed module that is exactly one function definition (`def` or `async def`,
    with any decorators). None (source that did not parse) is not."""
    return tree is not None and len(tree.body) == 1 and isinstance(tree.body[0], (ast.FunctionDef,
                                                                                  ast.AsyncFunctionDef))


# ---- code tokens ------------------------------------------------------------------------------------


def regex_code_tokens(source: str) -> list[str]:
    """Code tokens by a regular expression (for source that `tokenize` rejects)."""
    return [m.group() for m in _REGEX_TOKEN.finditer(source) if m.lastgroup != "skip"]


def _tokenize_tokens(source: str) -> list[str]:
    """Code tokens by Python's tokenizer; raises tokenize.TokenError / SyntaxError on bad source."""
    return [tok.string for tok in python_tokens(source) if tok.type not in _LAYOUT and tok.string.strip()]


def code_tokens(source: str) -> tuple[list[str], bool]:
    """(tokens, used_fallback): `tokenize` tokens of the source, else the regex tokens."""
    try:
        return _tokenize_tokens(source), False
    except (tokenize.TokenError, SyntaxError, ValueError, RecursionError, MemoryError):
        return regex_code_tokens(source), True


def token_line(tokens: Sequence[str]) -> str:
    """Tokens as one whitespace-normalised line for sacreBLEU (tokenize="none")."""
    return " ".join(" ".join(tokens).split())


# ---- scores -----------------------------------------------------------------------------------------


def sentence_bleu_scores(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[list[float], str]:
    """Per-line sacreBLEU sentence BLEU (exp smoothing, effective order) of token lines, and its signature."""

    metric = BLEU(tokenize="none", smooth_method="exp", effective_order=True)
    scores = [float(metric.sentence_score(h, [r]).score) for h, r in zip(hypotheses, references)]
    return scores, str(metric.get_signature())


def score_code(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    escaped: bool = True,
    max_chars: int = MAX_SOURCE_CHARS,
) -> dict[str, Any]:
    """PoV, mean sentence BLEU and corpus BLEU of generated functions against references.

    `escaped=True`: both sides are corpus lines (`DCNL`/`DCSP`) and are decoded first; False: both
    are Python source. Returns
    {"lines": n,
     "pov": {"score": fraction in [0, 1], "valid": k, "invalid": n - k, "too_long": t,
             "not_function": hypotheses that parse but are not one function definition (among the invalid)},
     "sentence_bleu": {"name", "score" (mean, 0-100), "signature"},
     "bleu": score_corpus's BLEU entry (score, signature, text, precisions, bp, lengths),
     "tokenization": {"description", "hypothesis_fallbacks", "reference_fallbacks"}}.
    Unequal line counts or no lines raise DataError.
    """
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise DataError(f"line counts differ: {len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise DataError("no hypotheses to score")
    if escaped:
        hypotheses = [decode_code(h) for h in hypotheses]
        references = [decode_code(r) for r in references]
    verdicts = [(tree is not None, is_function(tree)) for tree in (_parse(h, max_chars) for h in hypotheses)]
    valid = sum(function for _, function in verdicts)
    not_function = sum(parsed for parsed, _ in verdicts) - valid
    too_long = sum(len(h) > max_chars for h in hypotheses)
    hyp_lines, ref_lines, fallbacks = [], [], [0, 0]
    for side, (sources, out) in enumerate(((hypotheses, hyp_lines), (references, ref_lines))):
        for source in sources:
            tokens, fell_back = code_tokens(source)
            out.append(token_line(tokens))
            fallbacks[side] += fell_back
    sentence, signature = sentence_bleu_scores(hyp_lines, ref_lines)
    n = len(hypotheses)
    return {
        "lines": n,
        "pov": {"score": valid / n, "valid": valid, "invalid": n - valid, "too_long": too_long,
                "not_function": not_function},
        "sentence_bleu": {"name": "sentence BLEU (mean)", "score": sum(sentence) / n, "signature": signature},
        "bleu": score_corpus(hyp_lines, ref_lines, metrics=("bleu",), tokenize="none")["bleu"],
        "tokenization": {"description": CODE_TOKENIZATION, "hypothesis_fallbacks": fallbacks[0],
                         "reference_fallbacks": fallbacks[1]},
    }


def format_code_scores(result: dict[str, Any]) -> list[str]:
    """Report lines: PoV, mean sentence BLEU and corpus BLEU (each with its signature)."""
    pov, sentence, bleu = result["pov"], result["sentence_bleu"], result["bleu"]
    return [
        f"PoV = {100 * pov['score']:.2f}% ({pov['valid']}/{result['lines']} parse as one function definition "
        f"with Python's ast; {pov['not_function']} others parse but are not one)",
        f"sentence BLEU (mean) = {sentence['score']:.2f} ({sentence['signature']})",
        f"{bleu['text']} ({bleu['signature']})",
        f"code tokens: {result['tokenization']['description']}",
    ]


def check_pairs(hypotheses: Sequence[str], references: Sequence[str], hyp_name: str, ref_name: str,
                what: str = "functions") -> None:
    """Equal, non-zero counts of hypotheses and references, or one clear DataError."""
    if len(hypotheses) != len(references):
        raise DataError(f"line counts differ: {hyp_name} has {len(hypotheses)} lines, {ref_name} has "
                        f"{len(references)}")
    if not references:
        raise DataError(f"{ref_name}: no {what} to score")


def score_code_lines(lines: Sequence[str], references: Sequence[str], hyp_name: str, ref_name: str,
                     code_format: str = "escaped") -> dict[str, Any]:
    """`evaluate --task code`: score `lines` (escaped functions one a line, or with code_format "source"
    what `translate --code-format source` writes) against escaped reference functions, one a line.
    DataError when the counts do not match (naming --code-format source when that is the likely cause)."""
    if code_format == "source":
        hypotheses = split_source_functions(list(lines))
        if references and len(hypotheses) != len(references):
            raise DataError(f"{hyp_name} read as --code-format source holds {len(hypotheses)} functions (each ended "
                            f"by an empty line) but {ref_name} has {len(references)} lines; a function with an empty "
                            "line of its own splits in two in that form, so score translate's escaped one-line "
                            "output (--code-format escaped, its default) instead")
        check_pairs(hypotheses, references, hyp_name, ref_name)
        result = score_code(hypotheses, [decode_code(r) for r in references], escaped=False)
    else:
        if (references and len(lines) > len(references)
                and len(split_source_functions(list(lines))) == len(references)):
            raise DataError(f"line counts differ: {hyp_name} has {len(lines)} lines, {ref_name} has {len(references)}; "
                            f"{hyp_name} reads as {len(references)} functions each ended by an empty line, as "
                            "`translate --code-format source` writes them: pass --code-format source")
        check_pairs(lines, references, hyp_name, ref_name)
        result = score_code(lines, references)
    result["code_format"] = code_format
    return result
