"""Weighted Transformer layer kind (docs/papers.md#weighted-transformer): batched branches, MHA recovery,
parameter counts, beam search, DropHead, kappa/alpha through the real trainer (incremental decoding,
eval determinism and save/load: tests/models/test_layer_contract.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from multibranch.config import ConfigError, from_dict
from multibranch.experiment import ExperimentConfig, resolve_config
from multibranch.experiment.decoding import DecodeConfig
from multibranch.hooks import ModuleHooks
from multibranch.models import ModelConfig, build_model
from multibranch.models.layers.weighted import BranchedAttention, branch_heads
from multibranch.modules.simplex import BranchWeights, on_simplex, replace_branch_weights
from multibranch.schedules import learning_rate_at
from multibranch.train.optim import LRScheduler, build_optimizer

VOCAB = 40
PAD, BOS, EOS = 0, 2, 3


def _cfg(layer: dict | None = None, decoder: dict | None = None, **model) -> ModelConfig:
    layer = {"kind": "weighted", **(layer or {})}
    values = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1,
              "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB, "encoder": layer,
              "decoder": {**layer, **(decoder or {})}}
    values.update(model)
    return from_dict(ModelConfig, values)


def _perturb(module: torch.nn.Module, scale: float = 0.1) -> None:
    """Larger random weights than the init (zero biases included), so differences would show."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * scale)
        for m in module.modules():
            if isinstance(m, BranchWeights) and m.normalization == "simplex":
                m.after_optimizer_step()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded sources [3, 9] and decoder inputs [3, 7] (BOS + tokens)."""
    src = torch.randint(4, VOCAB, (3, 9))
    src[0, 6:] = PAD
    src[2, 3:] = PAD
    src[torch.arange(3), torch.tensor([5, 8, 2])] = EOS
    prev = torch.randint(4, VOCAB, (3, 7))
    prev[:, 0] = BOS
    return src, prev


def _branched(model, where: str = "encoder") -> BranchedAttention:
    return model.encoder.layers[0].branched if where == "encoder" else model.decoder.layers[0].branched


# ---- the branched computation ---------------------------------------------------------------------


def _loop_reference(ba: BranchedAttention, x, memory=None, mask=None, causal=False) -> torch.Tensor:
    """eq. 5-7 written head by head and branch by branch, from the module's own weights."""
    attn, M, dv = ba.attention, ba.branches, ba.attention.head_dim
    w_qkv, b_qkv = attn.in_proj.weight, attn.in_proj.bias  # [3d, d], [3d]
    d = ba.d_model
    kv = x if memory is None else memory
    kappa, alpha = ba.weights()
    out = 0
    for i in range(M):
        rows = slice(i * dv, (i + 1) * dv)
        q = x @ w_qkv[:d][rows].T + b_qkv[:d][rows]  # [B, L, d_v]
        k = kv @ w_qkv[d : 2 * d][rows].T + b_qkv[d : 2 * d][rows]
        v = kv @ w_qkv[2 * d :][rows].T + b_qkv[2 * d :][rows]
        scores = q @ k.transpose(1, 2) / math.sqrt(dv)  # [B, L, S]
        if mask is not None:
            scores = scores.masked_fill(mask[:, None, :], float("-inf"))
        if causal:
            scores = scores.masked_fill(torch.ones_like(scores[0], dtype=torch.bool).triu(1), float("-inf"))
        head = scores.softmax(-1) @ v  # [B, L, d_v]
        b = kappa[i] * (head @ attn.out_proj.weight[:, rows].T) + attn.out_bias[0]  # [B, L, d]
        g = 0 if ba.w1.shape[0] == 1 else i  # "shared": one FFN for every branch
        pre = ba.branch_norm is not None and ba.pre_norm
        c = F.relu((ba.branch_norm(b) if pre else b) @ ba.w1[g] + ba.b1[g]) @ ba.w2[g] + ba.b2
        r = b + c if ba.branch_residual else c
        if ba.branch_norm is not None and not ba.pre_norm:
            r = ba.branch_norm(r)
        out = out + alpha[i] * r
    return out


@pytest.mark.parametrize("ffn_mode", ["split", "shared"])
@pytest.mark.parametrize("branch_residual", [True, False])
def test_batched_branches_equal_a_per_branch_loop(ffn_mode, branch_residual, device):
    model = build_model(_cfg({"ffn_mode": ffn_mode, "branch_residual": branch_residual})).eval()
    _perturb(model)
    model = model.to(device)
    x, memory = torch.randn(3, 6, 32, device=device), torch.randn(3, 5, 32, device=device)
    mask = torch.zeros(3, 5, dtype=torch.bool, device=device)
    mask[1, 3:] = True
    with torch.no_grad():
        enc = _branched(model)
        torch.testing.assert_close(enc(x), _loop_reference(enc, x), atol=1e-5, rtol=1e-5)
        dec = _branched(model, "decoder")  # cross layout: keys/values from the encoder
        torch.testing.assert_close(dec(x, memory, key_padding_mask=mask), _loop_reference(dec, x, memory, mask),
                                   atol=1e-5, rtol=1e-5)
        selfb = build_model(_cfg(decoder={"decoder_branched": "self"})).eval()
        _perturb(selfb)
        dec = _branched(selfb.to(device), "decoder")
        torch.testing.assert_close(dec(x, causal=True), _loop_reference(dec, x, causal=True), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_branch_norm_equals_a_per_branch_loop(norm):
    """The LayerNorm inside the branches: on the FFN input (pre-norm) or on r_i (post-norm)."""
    model = build_model(_cfg({"branch_norm": True}, norm=norm)).eval()
    _perturb(model)
    x = torch.randn(3, 6, 32)
    with torch.no_grad():
        enc = _branched(model)
        torch.testing.assert_close(enc(x), _loop_reference(enc, x), atol=1e-5, rtol=1e-5)


def test_kappa_alpha_one_recovers_multi_head_attention():
    """Paper: kappa = alpha = 1 (not on the simplex) gives concat(heads) W_O; here the FFN is zeroed so the
    branch-residual output is exactly the attention path. b_O is added once per branch."""
    model = build_model(_cfg()).eval()
    _perturb(model)
    ba = _branched(model)
    with torch.no_grad():
        ba.weights.kappa.fill_(1.0)
        ba.weights.alpha.fill_(1.0)
        ba.w2.zero_()
        ba.b2.zero_()
        ba.attention.out_bias.normal_()
        x = torch.randn(2, 7, 32)
        mask = torch.zeros(2, 7, dtype=torch.bool)
        mask[0, 5:] = True
        mha = ba.attention(x, key_padding_mask=mask)  # the standard ParallelAttention forward: concat W_O + b_O
        extra_bias = (ba.branches - 1) * ba.attention.out_bias[0]
        torch.testing.assert_close(ba(x, key_padding_mask=mask), mha + extra_bias, atol=1e-5, rtol=1e-5)


def test_output_projection_blocks_are_views_of_w_o():
    ba = _branched(build_model(_cfg()))
    w_o = ba.output_projections()  # [M, d_v, d]
    assert w_o.shape == (4, 8, 32)
    for i in range(4):
        torch.testing.assert_close(w_o[i], ba.attention.out_proj.weight[:, i * 8 : (i + 1) * 8].T)


# ---- parameters -----------------------------------------------------------------------------------


def _count(cfg) -> int:
    return build_model(cfg).parameter_counts()["total"]


@pytest.mark.parametrize(("decoder_branched", "ffn_mode"), [("cross", "split"), ("self", "shared")])
def test_parameter_count_against_the_transformer_preset(decoder_branched, ffn_mode):
    """Each branched module adds kappa/alpha (2M) and merges two residual sublayers into one (one LayerNorm,
    2d, fewer); `branch_norm` keeps that LayerNorm inside the branches: exactly baseline + 2M."""
    sets = [f"model.encoder.ffn_mode={ffn_mode}", f"model.decoder.ffn_mode={ffn_mode}",
            f"model.decoder.decoder_branched={decoder_branched}"]
    base = resolve_config("transformer-tiny").model
    weighted = resolve_config("weighted-tiny", overrides=sets).model
    norm = resolve_config("weighted-tiny", overrides=[*sets, "model.encoder.branch_norm=true",
                                                       "model.decoder.branch_norm=true"]).model
    for cfg in (base, weighted, norm):
        cfg.src_vocab_size = cfg.tgt_vocab_size = 300
    d, M = base.d_model, base.heads
    modules = weighted.encoder_layers + weighted.decoder_layers
    assert (weighted.d_model, weighted.heads, weighted.ffn_dim) == (d, M, base.ffn_dim)
    assert _count(norm) == _count(base) + modules * 2 * M
    assert _count(weighted) == _count(base) + modules * (2 * M - 2 * d)


def test_config_checks():
    with pytest.raises(ConfigError, match="divisible by the number of branches"):
        _cfg(ffn_dim=66)
    _cfg({"ffn_mode": "shared"}, ffn_dim=66)
    with pytest.raises(ConfigError, match="top_k"):
        _cfg({"top_k": 5})
    with pytest.raises(ConfigError, match="decoder_branched"):
        _cfg(decoder={"decoder_branched": "both"})


# ---- decoding, determinism, DropHead --------------------------------------------------------------


@pytest.mark.parametrize("decoder_branched", ["cross", "self"])
def test_beam_search_batched_equals_one_sentence_at_a_time(decoder_branched):
    """Beam bookkeeping (state.reorder, finished rows dropped) works on the weighted caches."""
    from multibranch.inference.beam import beam_search

    model = build_model(_cfg(decoder={"decoder_branched": decoder_branched}))
    _perturb(model, 0.3)
    model.eval()
    src, _ = _batch()
    options = dict(max_len_a=0.0, max_len_b=8)
    batched = beam_search(model, src, DecodeConfig(beam=3, **options))
    for i in range(src.shape[0]):
        keep = int(src[i].ne(PAD).sum())
        (alone,) = beam_search(model, src[i : i + 1, :keep], DecodeConfig(beam=3, **options))
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[i]], abs=1e-4)


def test_drophead_acts_on_the_branch_axis_before_w_o():
    """DropHead is identity in eval and, in training, scales head i = branch i by the sampled mask."""
    cfg = _cfg(dropout=0.0, drophead={"rate": 0.5})
    model = build_model(cfg)
    _perturb(model)
    attn = _branched(model).attention
    assert attn.drophead is not None and attn.drophead.paths == 4
    x = torch.randn(6, 5, 32)
    with torch.no_grad():
        attn.eval()
        clean = branch_heads(attn, x)  # [B, M, L, d_v]
        attn.train()
        torch.manual_seed(11)
        scale, _ = attn.head_scales(6, x.device)  # [B, M]
        torch.manual_seed(11)
        dropped = branch_heads(attn, x)
    assert scale is not None and bool((scale == 0).any())
    torch.testing.assert_close(dropped, clean * scale[:, :, None, None])

    plain = build_model(_cfg(dropout=0.0))
    plain.load_state_dict(model.state_dict())  # DropHead has no parameters
    src, prev = _batch()
    with torch.no_grad():
        model.eval()
        plain.eval()
        torch.testing.assert_close(model(src, prev), plain(src, prev))  # identity in eval
        model.train()
        plain.train()
        assert not torch.allclose(model(src, prev), plain(src, prev))
        torch.testing.assert_close(plain(src, prev), plain.eval()(src, prev))  # nothing else is random here


@pytest.mark.parametrize("layer", [{"normalization": "softmax"}, {"top_k": 2}, {"normalization": "softmax", "top_k": 1}])
def test_ablation_options_build_train_and_keep_their_weights_normalised(layer, device):
    model = build_model(_cfg(layer)).to(device)
    src, prev = (t.to(device) for t in _batch())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    hooks = ModuleHooks(model)
    for _ in range(3):
        model(src, prev).logsumexp(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        hooks.after_optimizer_step()
    for module in model.modules():
        if isinstance(module, BranchWeights):
            kappa, alpha = (w.detach() for w in module())
            assert on_simplex(kappa) and on_simplex(alpha)
            if "top_k" in layer:
                assert int((alpha > 0).sum()) == layer["top_k"]
    assert "kappa.0" in ",".join(hooks.training_metrics())


def test_test_time_replacement_changes_the_model_output():
    model = build_model(_cfg()).eval()
    _perturb(model)
    src, prev = _batch()
    with torch.no_grad():
        learned = model(src, prev)
        assert replace_branch_weights(model, "uniform") == 4  # 2 encoder + 2 decoder modules
        uniform = model(src, prev)
        replace_branch_weights(model, "random", seed=1)
        random1 = model(src, prev)
        replace_branch_weights(model, "random", seed=1)
        torch.testing.assert_close(model(src, prev), random1)
    assert not torch.allclose(learned, uniform) and not torch.allclose(uniform, random1)


# ---- kappa/alpha in the optimizer -----------------------------------------------------------------


def _experiment(max_steps: int, freeze_last: int, **model) -> ExperimentConfig:
    layer = {"kind": "weighted", "freeze_last": freeze_last}
    return from_dict(ExperimentConfig, {
        "model": {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 3,
                  "dropout": 0.1, "encoder": layer, "decoder": layer, **model},
        "train": {"max_tokens": 400, "lr": {"schedule": "inverse_sqrt", "lr": 0.003, "warmup": 3},
                  "valid_every": 100, "log_every": 1, "valid_bleu": False, "max_steps": max_steps, "seed": 5},
    })


def test_kappa_alpha_groups_get_their_schedule_and_lr_zero_while_frozen():
    cfg = _experiment(max_steps=50, freeze_last=10)
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = VOCAB
    model = build_model(cfg.model)
    specs = ModuleHooks(model).parameter_groups()
    assert sorted(s.name for s in specs) == ["kappa_alpha.decoder", "kappa_alpha.encoder"]
    assert sum(len(s.params) for s in specs) == 2 * (2 + 3)
    optimizer = build_optimizer(model, cfg.train, specs)
    assert {g["name"]: g["weight_decay"] for g in optimizer.param_groups}["kappa_alpha.encoder"] == 0.0
    scheduler = LRScheduler(optimizer, cfg.train.lr, cfg.model.d_model, specs, cfg.train.max_steps)
    for update in range(1, 51):
        rates = scheduler.set_step(update)
        assert rates["main"] > 0
        for stack, layers in (("encoder", 2), ("decoder", 3)):
            expected = learning_rate_at(cfg.model.encoder.kappa_alpha_lr, update, 32 / layers)
            assert rates[f"kappa_alpha.{stack}"] == (0.0 if update > 40 else pytest.approx(expected))
    with pytest.raises(ValueError, match="max_steps"):
        LRScheduler(optimizer, cfg.train.lr, cfg.model.d_model, specs, None)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    from multibranch.data.parallel_prepare import PrepareConfig
    from multibranch.tasks.translation.prepare import prepare
    from multibranch.tasks.translation.synthetic import generate_synthetic_task

    root = tmp_path_factory.mktemp("weighted_data")
    generate_synthetic_task(root / "raw", seed=2, n_train=200, n_valid=12, n_test=12)
    prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(root / "raw" / "train"),
                          valid=str(root / "raw" / "valid"), test=[str(root / "raw" / "test")],
                          out=str(root / "data"), vocab_size=150))
    return root / "data"


def test_trainer_keeps_kappa_alpha_on_the_simplex_logs_them_and_freezes_them(small_data, tmp_path):
    from multibranch.loading.checkpoint import load_model
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions

    steps, freeze = 8, 3
    state = train(_experiment(steps, freeze), RunOptions(data_dir=small_data, run_dir=tmp_path / "run", progress=False))
    assert state.step == steps
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_records = {r["step"]: r["modules"] for r in records if r["type"] == "train"}
    assert sorted(train_records) == list(range(1, steps + 1))
    key = "encoder.layers.1.branched.weights"
    for step, metrics in train_records.items():
        for module in ("encoder.layers.0", "encoder.layers.1", "decoder.layers.2"):
            for name in ("kappa", "alpha"):
                values = torch.tensor([metrics[f"{module}.branched.weights.{name}.{i}"] for i in range(4)])
                assert on_simplex(values), (step, module, name, values)
    trajectory = [[train_records[s][f"{key}.alpha.{i}"] for i in range(4)] for s in range(1, steps + 1)]
    assert trajectory[0] != trajectory[steps - freeze - 1]  # moving while trained
    for s in range(steps - freeze, steps):  # updates steps-freeze+1 .. steps: LR 0, projection a no-op
        assert trajectory[s] == trajectory[steps - freeze - 1]
    model = load_model(tmp_path / "run" / "last.pt").model
    for module in model.modules():
        if isinstance(module, BranchWeights):
            assert on_simplex(module.kappa.detach()) and on_simplex(module.alpha.detach())
