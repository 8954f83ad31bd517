"""Code generation (docstring -> Python function): the translation task over `prepare --task code` data
whose validation also decodes the valid split and scores the functions with PoV, mean sentence BLEU
and corpus BLEU on code tokens (`multibranch.tasks.code.metrics`; generated code is parsed, never run).

Validation metrics (besides loss / NLL / ppl): "pov" (fraction in [0, 1] of hypotheses that
`ast.parse` reads as exactly one function definition after `DCNL`/`DCSP` decoding), "sentence_bleu"
(mean, 0-100) and "bleu" (corpus BLEU, 0-100), on the first `train.valid_max_sentences` valid
examples. The best checkpoint follows `train.best_metric` ("bleu" by default; "pov", "sentence_bleu"
or "loss" also work).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multibranch.errors import DataError
from multibranch.tasks.code.metrics import score_code
from multibranch.tasks.code.prepare import TASK
from multibranch.tasks.refinement import Refinement


class CodeTask(Refinement):
    """Code generation as a refinement of the translation task (joined in tasks/registry.py): code data
    (data.json "task": "code") and code metrics."""

    name = "code"
    best_metric = "bleu"
    prepare_flag, command = "code", "multibranch translate"

    @classmethod
    def owns_data(cls, meta: dict[str, Any]) -> bool:
        return super().owns_data(meta) and meta.get("task") == TASK

    @classmethod
    def load_data(cls, data_dir: Path) -> Any:
        data = super().load_data(data_dir)
        if data.meta.get("task") != TASK:
            raise DataError(f"{data_dir}: not a code-generation data directory (prepare it with "
                            "`multibranch prepare --task code`)")
        return data

    def decode_scores(self, hypotheses: list[str], references: list[str]) -> dict[str, Any]:
        scores = score_code(hypotheses, references)
        return {"pov": scores["pov"]["score"], "sentence_bleu": scores["sentence_bleu"]["score"],
                "bleu": scores["bleu"]["score"], "bleu_signature": scores["bleu"]["signature"]}

    def describe_valid(self, result: dict[str, Any]) -> str:
        text = f"loss {result['loss']:.3f} | ppl {result['ppl']:.2f}"
        if "pov" in result:
            text += (f" | PoV {100 * result['pov']:.1f}% | sentence BLEU {result['sentence_bleu']:.2f} | "
                     f"BLEU {result['bleu']:.2f}")
        return text
