"""The Weighted Transformer's kappa/alpha replaced at test time (its Table 3): every score is sacreBLEU's of the
translations of a model whose weights were replaced independently, and the model keeps its own weights."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import sacrebleu
import torch

from multibranch.analysis.replacement import ReplacementOptions, replacement_scores
from multibranch.cli import main
from multibranch.experiment import ExperimentConfig
from multibranch.loading.checkpoint import load_model
from multibranch.modules.simplex import BranchWeights, replace_branch_weights
from multibranch.tasks.translation.dataset import PreparedData
from multibranch.tasks.translation.translator import Translator

SENTENCES = 12


def independent_scores(ckpt: Path, data_dir: Path, mode: str | None, seed: int = 0,
                       module: str | None = None) -> dict[str, float]:
    """Scores of a freshly loaded model with its weights replaced by `mode` (None: the learned ones), in every
    module or in `module` alone."""
    loaded = load_model(ckpt, "cpu")
    if module is not None:
        dict(loaded.model.named_modules())[module].replace_(mode)
    elif mode is not None:
        replace_branch_weights(loaded.model, mode, seed=seed)
    data = PreparedData.load(data_dir)
    split = data.split("valid")
    sources, references = split.raw_src_lines()[:SENTENCES], split.raw_tgt_lines()[:SENTENCES]
    decode = dataclasses.replace(loaded.config.decode, beam=1)
    hyps = Translator(loaded.model, loaded.tokenizer or data.tokenizer(), decode, "cpu").translate(sources)
    return {"bleu": sacrebleu.corpus_bleu(hyps, [references]).score,
            "chrf": sacrebleu.corpus_chrf(hyps, [references]).score}


def test_the_cli_scores_learned_uniform_and_random_weights_as_independently_replaced_models(
        weighted_checkpoint, tiny_data, tmp_path):
    out = tmp_path / "report"
    argv = ["analyze", "gates", "--ckpt", str(weighted_checkpoint), "--out", str(out), "--data", str(tiny_data),
            "--split", "valid", "--max-sentences", str(SENTENCES), "--random-draws", "2", "--per-module", "--beam", "1"]
    assert main(argv) == 0
    replaced = json.loads((out / "gates.json").read_text())["replacement"]
    assert (replaced["split"], replaced["sentences"]) == ("valid", SENTENCES)
    expected = {"learned": independent_scores(weighted_checkpoint, tiny_data, None),
                "uniform": independent_scores(weighted_checkpoint, tiny_data, "uniform")}
    for name, scores in expected.items():
        assert replaced[name] == pytest.approx(scores, abs=1e-9), name
    draws = [independent_scores(weighted_checkpoint, tiny_data, "random", seed) for seed in (1, 2)]
    assert [r["seed"] for r in replaced["random"]] == [1, 2]
    for row, scores in zip(replaced["random"], draws, strict=True):
        assert {k: row[k] for k in scores} == pytest.approx(scores, abs=1e-9)
    assert replaced["random_mean"]["chrf"] == pytest.approx(sum(d["chrf"] for d in draws) / 2)
    names = [name for name, m in load_model(weighted_checkpoint, "cpu").model.named_modules()
             if isinstance(m, BranchWeights)]
    assert [m["name"] for m in replaced["uniform_per_module"]] == names and len(names) == 4
    for row in replaced["uniform_per_module"]:
        scores = independent_scores(weighted_checkpoint, tiny_data, "uniform", module=row["name"])
        assert {k: row[k] for k in scores} == pytest.approx(scores, abs=1e-9), row["name"]
    # the replacements change the translations: otherwise the comparison above could not tell them apart
    assert len({round(s["chrf"], 6) for s in (expected["learned"], expected["uniform"], *draws)}) > 1
    assert "replaced at test time" in (out / "index.md").read_text()


def test_the_model_keeps_its_own_weights_after_the_replacements(weighted_checkpoint, tiny_data):
    loaded = load_model(weighted_checkpoint, "cpu")
    before = [p.detach().clone() for m in loaded.model.modules() if isinstance(m, BranchWeights)
              for p in (m.kappa, m.alpha)]
    assert not all(torch.allclose(p, torch.full_like(p, 1 / p.numel())) for p in before)  # trained off 1/M
    split = PreparedData.load(tiny_data).split("valid")
    replacement_scores(loaded.model, PreparedData.load(tiny_data).tokenizer(), split.raw_src_lines()[:4],
                       split.raw_tgt_lines()[:4], loaded.config.decode,
                       ReplacementOptions(draws=1, beam=1, per_module=True))
    after = [p.detach() for m in loaded.model.modules() if isinstance(m, BranchWeights) for p in (m.kappa, m.alpha)]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_replacing_weights_a_model_does_not_have_is_one_clear_error(tiny_data, tmp_path, capsys):
    from multibranch.checkpoint.format import save_checkpoint
    from multibranch.experiment import resolve_config
    from multibranch.models import build_model
    from tests.helpers.models import noisy_model

    muse = dataclasses.replace(resolve_config("muse-tiny").model, src_vocab_size=200, tgt_vocab_size=200)
    ckpt = tmp_path / "muse.pt"
    save_checkpoint(ckpt, {"config": ExperimentConfig(model=muse).to_dict(), "model": build_model(muse).state_dict(),
                           "meta": {}})
    out = tmp_path / "report"
    assert main(["analyze", "gates", "--ckpt", str(ckpt), "--out", str(out), "--data", str(tiny_data)]) == 2
    err = capsys.readouterr().err
    assert "no Weighted Transformer kappa/alpha" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    with pytest.raises(ValueError, match="no Weighted Transformer"):
        replacement_scores(noisy_model(20, 0.0, 1), None, ["a"], ["b"], None, ReplacementOptions())
