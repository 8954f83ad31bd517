"""Pruning by masking (curve, dominant heads) and physical head removal (`multibranch prune`)."""

from __future__ import annotations

import copy

import pytest
import torch

from multibranch.analysis.heads import attention_sites
from multibranch.config import from_dict
from multibranch.evaluate.metrics import score_corpus
from multibranch.experiment.decoding import DecodeConfig
from multibranch.models import ModelConfig, build_model
from multibranch.pruning.curve import planned_counts, pruning_curve, select_heads
from multibranch.pruning.dominant import dominant_heads
from multibranch.pruning.scoring import BleuScorer
from multibranch.tasks.translation.dataset import PreparedData
from multibranch.tasks.translation.translator import Translator
from tests.helpers.configs import tiny_model_dict


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


# ---- physical pruning ----------------------------------------------------------------------------

PHYSICAL_KINDS = {
    "standard": {"relative_positions": 3},
    "mat": {"encoder": {"kind": "transformer", "attention_branches": 2, "ffn_branches": 2},
            "decoder": {"kind": "transformer", "attention_branches": 2, "ffn_branches": 2}},
}


def _payload(model: torch.nn.Module) -> dict:
    from multibranch.experiment import ExperimentConfig

    config = ExperimentConfig(model=model.config).to_dict()
    return {"config": config, "model": {k: v.clone() for k, v in model.state_dict().items()}, "meta": {}}


def _load(payload: dict) -> torch.nn.Module:
    from multibranch.experiment import ExperimentConfig

    model = build_model(ExperimentConfig.from_dict(payload["config"]).model)
    model.load_state_dict(payload["model"])
    return model.eval()


def _src_prev() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(4, 40, (3, 9))
    src[0, 6:] = 0
    src[torch.arange(3), torch.tensor([5, 8, 8])] = 3
    prev = torch.randint(4, 40, (3, 7))
    prev[:, 0] = 2
    return src, prev


@pytest.mark.parametrize("kind", list(PHYSICAL_KINDS))
def test_pruned_model_translates_exactly_like_the_masked_one(kind):
    from multibranch.analysis.heads import gates_installed, mask_gates
    from multibranch.inference.search import search
    from multibranch.pruning.removal import prune_heads

    model = _model(**PHYSICAL_KINDS[kind])
    sites = attention_sites(model)
    gen = torch.Generator().manual_seed(2)
    remove = [(s.name, int(h)) for s in sites for h in torch.randperm(s.heads, generator=gen)[: 1 + s.layer]]
    remove.append((sites[0].name, int(torch.randperm(sites[0].heads, generator=gen)[-1])))  # a 3rd head here
    pruned = _load(prune_heads(_payload(model), remove))

    src, prev = _src_prev()
    with torch.no_grad(), gates_installed(sites, mask_gates(sites, remove)):
        masked_logits = model(src, prev)
        masked_out = {beam: search(model, src, DecodeConfig(beam=beam, max_len_b=6)) for beam in (1, 3)}
    with torch.no_grad():
        torch.testing.assert_close(pruned(src, prev), masked_logits, rtol=1e-5, atol=1e-5)
        for beam, expected in masked_out.items():
            got = search(pruned, src, DecodeConfig(beam=beam, max_len_b=6))
            assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in expected]
            assert not torch.allclose(model(src, prev), masked_logits, atol=1e-4)  # the heads mattered

    for site in attention_sites(pruned):
        removed = len({h for name, h in remove if name == site.name})
        original = next(s.heads for s in sites if s.name == site.name)
        assert site.heads == original - removed


def test_prune_records_counts_in_the_config_and_kept_heads_in_meta():
    from multibranch.pruning.removal import prune_heads

    model = _model()
    out = prune_heads(_payload(model), [("encoder.layers.1.self_attn", 0), ("decoder.layers.0.cross_attn", 3)])
    assert out["config"]["model"]["encoder"]["layer_heads"] == [[4], [3]]
    assert out["config"]["model"]["decoder"]["layer_heads"] == [[4, 3], [4, 4]]
    assert out["config"]["model"]["encoder"]["head_dim"] == 8
    assert out["meta"]["conversion"]["kept"]["decoder.layers.0.cross_attn"] == [0, 1, 2]
    before, after = model.parameter_counts()["total"], _load(out).parameter_counts()["total"]
    assert before - after == 2 * (4 * 32 * 8 + 3 * 8)  # per head: Q/K/V rows (+bias) and W_O columns


@pytest.mark.parametrize(("overrides", "reason"), [
    ({"encoder": {"kind": "weighted"}, "decoder": {"kind": "weighted"}}, "own FFN"),
    ({"encoder": {"kind": "muse"}, "decoder": {"kind": "muse"}}, "value projection"),
    ({"norm": "pre", "encoder": {"kind": "mute", "units": 2}}, "stacked weights"),
])
def test_kinds_that_cannot_be_pruned_are_refused_with_the_reason(overrides, reason):
    from multibranch.config import ConfigError
    from multibranch.pruning.removal import prune_heads

    with pytest.raises(ConfigError, match=reason):
        prune_heads(_payload(_model(**overrides)), [("encoder.layers.0.self_attn", 0)])


def test_pruning_every_head_of_a_module_or_a_missing_head_is_refused():
    from multibranch.config import ConfigError
    from multibranch.pruning.removal import prune_heads

    payload = _payload(_model())
    with pytest.raises(ConfigError, match="at least one head"):
        prune_heads(payload, [("decoder.layers.1.cross_attn", h) for h in range(4)])
    with pytest.raises(ConfigError, match="no head 4"):
        prune_heads(payload, [("decoder.layers.1.cross_attn", 4)])
    with pytest.raises(ConfigError, match="layer_heads"):
        from_dict(ModelConfig, tiny_model_dict(encoder={"kind": "transformer", "layer_heads": [[4]]})).validate()


def test_prune_cli_fraction_and_heads_json(tiny_data, tmp_path, capsys):
    from multibranch.analysis.heads import gates_installed, mask_gates
    from multibranch.checkpoint.format import load_checkpoint, save_checkpoint
    from multibranch.cli import main
    from multibranch.loading.checkpoint import load_model

    vocab = PreparedData.load(tiny_data).meta["vocab_size"]["src"]
    model = _model(vocab=vocab)
    ckpt = tmp_path / "model.pt"
    save_checkpoint(ckpt, _payload(model))

    out = tmp_path / "pruned.pt"
    assert main(["prune", "--ckpt", str(ckpt), "--out", str(out), "--fraction", "0.25", "--data", str(tiny_data)]) == 0
    printed = capsys.readouterr().out
    assert "removed 6 head(s)" in printed and "-6,288" in printed  # 6 x (4 * 32 * 8 + 3 * 8)
    removed = [tuple(pair) for pair in load_checkpoint(out)["meta"]["conversion"]["removed"]]
    assert len(removed) == 6
    pruned = load_model(out).model
    src, prev = _src_prev()
    sites = attention_sites(model)
    with torch.no_grad(), gates_installed(sites, mask_gates(sites, removed)):
        torch.testing.assert_close(pruned(src, prev), model(src, prev), rtol=1e-5, atol=1e-5)

    heads = tmp_path / "heads.json"
    heads.write_text('{"masked": [["encoder.layers.0.self_attn", 1]]}')
    assert main(["prune", "--ckpt", str(ckpt), "--out", str(tmp_path / "one.pt"), "--heads-json", str(heads)]) == 0
    assert load_model(tmp_path / "one.pt").config.model.encoder.layer_heads == [[3], [4]]

    for argv, message in [
        (["--out", str(out), "--heads-json", str(heads)], "exists; pass --force"),
        (["--out", str(ckpt), "--heads-json", str(heads), "--force"], "same file as input"),
        (["--out", str(tmp_path / "x.pt"), "--fraction", "0.25"], "give --data"),
        (["--out", str(tmp_path / "x.pt"), "--fraction", "0.9", "--data", str(tiny_data)], "only 18 can go"),
        (["--out", str(tmp_path / "x.pt"), "--heads-json", str(tmp_path / "model.pt")], "not valid JSON"),
    ]:
        assert main(["prune", "--ckpt", str(ckpt), *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x.pt").exists()


def test_a_pruned_model_is_refused_by_the_ctranslate2_export():
    from multibranch.config import ConfigError
    from multibranch.convert.ct2 import check_exportable
    from multibranch.experiment import ExperimentConfig
    from multibranch.pruning.removal import prune_heads

    model = _model()
    check_exportable(model.config, "model.pt")  # the unpruned model is exportable
    pruned = prune_heads(_payload(model), [("encoder.layers.0.self_attn", 1)])
    with pytest.raises(ConfigError, match="pruned heads"):
        check_exportable(ExperimentConfig.from_dict(pruned["config"]).model, "pruned.pt")
