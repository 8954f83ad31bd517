"""Pruning by masking (curve, dominant heads) and physical head removal (`multibranch prune`)."""

from __future__ import annotations

import copy

import pytest
import torch

from multibranch.analysis.heads import attention_sites
from multibranch.analysis.pruning import dominant_heads, planned_counts, pruning_curve, select_heads
from multibranch.analysis.scoring import BleuScorer
from multibranch.config import from_dict
from multibranch.data.dataset import PreparedData
from multibranch.evaluate.metrics import score_corpus
from multibranch.inference.config import DecodeConfig
from multibranch.inference.translator import Translator
from multibranch.models import ModelConfig, build_model
from tests.conftest import tiny_model_dict


def _model(vocab: int = 40, **overrides) -> torch.nn.Module:
    cfg = from_dict(ModelConfig, tiny_model_dict(src_vocab_size=vocab, tgt_vocab_size=vocab, **overrides))
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _masked_now(sites) -> set[tuple[str, int]]:
    """Heads whose installed gate is 0 (read from the modules, independently of the curve's bookkeeping)."""
    out = set()
    for site in sites:
        gate = site.module.head_gate
        if gate is not None:
            out.update((site.name, int(h)) for h in torch.nonzero(gate == 0).flatten())
    return out


def _fixed_scores(sites, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {s.name: torch.rand(s.heads, generator=gen) for s in sites}


def test_planned_counts_are_rounded_fractions_of_the_total():
    assert [c for _, c in planned_counts(24)] == [0, 2, 5, 7, 10, 12, 14, 17, 19, 22, 24]
    assert [f for f, _ in planned_counts(24)][:4] == [0.0, 0.1, 0.2, 0.3]
    assert planned_counts(24, maskable=18)[-1] == (0.7, 17)
    assert [c for _, c in planned_counts(8, step=0.25)] == [0, 2, 4, 6, 8]


def test_curve_masks_the_planned_number_of_least_important_heads():
    sites = attention_sites(_model())  # 6 modules x 4 heads
    scores = _fixed_scores(sites)
    ranking = sorted((float(scores[s.name][h]), s.name, h) for s in sites for h in range(s.heads))
    seen: list[set] = []

    def evaluate() -> float:
        seen.append(_masked_now(sites))
        return float(len(seen[-1]))

    curve = pruning_curve(sites, lambda gates: scores, evaluate)
    assert [p.fraction for p in curve] == [f for f, _ in planned_counts(24)]
    for point, now, (_, count) in zip(curve, seen, planned_counts(24), strict=True):
        assert point.score == count == len(point.masked)
        assert now == {(name, h) for _, name, h in ranking[:count]}  # the `count` least important
    assert all(s.module.head_gate is None for s in sites)


def test_keep_one_head_per_module():
    sites = attention_sites(_model())
    scores = _fixed_scores(sites, seed=3)
    seen = []

    def evaluate() -> float:
        seen.append(_masked_now(sites))
        return 0.0

    curve = pruning_curve(sites, lambda gates: scores, evaluate, keep_one=True)
    assert curve[-1].fraction == 0.7 and len(curve[-1].masked) == 17  # 18 maskable of 24
    for now in seen:
        for site in sites:
            assert sum(1 for name, _ in now if name == site.name) < site.heads
    with pytest.raises(ValueError, match="cannot mask"):
        select_heads(sites, scores, 19, [], keep_one=True)


def test_recomputed_importance_is_asked_under_the_current_mask():
    sites = attention_sites(_model())
    calls = []

    def importance(gates):
        masked = {(name, int(h)) for name, g in gates.items() for h in torch.nonzero(g == 0).flatten()}
        calls.append(masked)
        # a ranking that changes with the mask: the fewer heads masked, the more the last modules matter
        return {s.name: torch.arange(s.heads, dtype=torch.float) * (1 + i * len(masked)) for i, s in enumerate(sites)}

    curve = pruning_curve(sites, importance, lambda: 0.0, step=0.25, recompute=True)
    assert len(calls) == len(curve) - 1  # once at the start, then after every masking step but the first
    for before, point in zip(calls[1:], curve[1:-1], strict=False):
        assert before <= set(point.masked)
    assert set(curve[1].masked) == {(s.name, 0) for s in sites}  # all-equal zeros first: head 0 of every module


def test_dominant_heads_table():
    sites = attention_sites(_model())
    weights = _fixed_scores(sites, seed=5)  # the score drop each head causes when masked

    def evaluate() -> float:
        return 10.0 - sum(float(weights[name][h]) for name, h in _masked_now(sites))

    table = dominant_heads(sites, evaluate)
    assert table["baseline"] == 10.0
    for module, site in zip(table["modules"], sites, strict=True):
        torch.testing.assert_close(torch.tensor(module["deltas"]), -weights[site.name])
        assert module["dominant_head"] == int(weights[site.name].argmax())
    for role in ("encoder_self", "decoder_self", "cross"):
        expected = -sum(float(weights[s.name].max()) for s in sites if s.role == role) / 2
        assert table["mean_dominant_delta"][role] == pytest.approx(expected)


def test_curve_on_bleu_starts_at_the_unpruned_score_and_masks_like_zeroed_values(tiny_data):
    data = PreparedData.load(tiny_data)
    split = data.split("valid")
    sources, references = split.raw_src_lines()[:8], split.raw_tgt_lines()[:8]
    model = _model(vocab=data.meta["vocab_size"]["src"])
    decode = DecodeConfig(beam=2, max_len_b=5)
    reference_model = copy.deepcopy(model)
    unpruned = Translator(reference_model, data.tokenizer(), decode).translate(sources)
    expected = score_corpus(unpruned, [references], metrics=("bleu",))["bleu"]["score"]

    sites = attention_sites(model)
    scorer = BleuScorer(model, data.tokenizer(), sources, references, decode)
    hypotheses = []

    def evaluate() -> float:
        score = scorer()
        hypotheses.append(scorer.last_hypotheses)
        return score

    curve = pruning_curve(sites, lambda gates: _fixed_scores(sites), evaluate, step=0.5)
    assert curve[0].fraction == 0.0 and curve[0].score == expected
    assert hypotheses[0] == unpruned
    with torch.no_grad():  # the 50% mask, done by hand: zero the masked heads' value projections
        for name, head in curve[1].masked:
            attn = reference_model.get_submodule(name)
            rows = slice(2 * attn.inner_dim + head * attn.head_dim, 2 * attn.inner_dim + (head + 1) * attn.head_dim)
            attn.in_proj.weight[rows] = 0.0
            attn.in_proj.bias[rows] = 0.0
    assert hypotheses[1] == Translator(reference_model, data.tokenizer(), decode).translate(sources)
    assert hypotheses[1] != unpruned
