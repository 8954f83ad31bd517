"""MUTE encoder layer and models (docs/papers.md#mute): equivalences computed at test time."""

from __future__ import annotations

import json

import pytest
import torch

from multibranch.config import ConfigError, from_dict
from multibranch.experiment import resolve_config
from multibranch.experiment.training import TrainConfig
from multibranch.hooks import ModuleHooks
from multibranch.models import LayerConfig, ModelConfig, build_model
from multibranch.models.layers.mute import MuteEncoderLayer, diversity_score, encoder_diversity
from multibranch.modules.autoshuffle import normalise_shuffle, sequential_fusion
from multibranch.train.optim import build_optimizer
from tests.helpers.configs import tiny_model_dict

BIASED = ["identity", "swap", "mask", "disorder"]


def _cfg(mute: dict | None = None, **overrides) -> ModelConfig:
    model = tiny_model_dict(norm="pre", relative_positions=4, encoder={"kind": "mute", **(mute or {})},
                            decoder={"kind": "transformer"})
    model.update(overrides)
    return from_dict(ModelConfig, model)


def _layer(mute: dict | None = None, **overrides) -> MuteEncoderLayer:
    layer = build_model(_cfg(mute, **overrides)).encoder.layers[0]
    with torch.no_grad():  # larger random weights than the init, so differences would show
        for name, p in layer.named_parameters():
            if "autoshuffle" not in name:
                p.add_(torch.randn_like(p) * 0.1)
    return layer


def _inputs(batch: int = 3, length: int = 7, d: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, length, d)
    pad = torch.zeros(batch, length, dtype=torch.bool)
    pad[1, 4:] = True
    pad[2, 2:] = True
    return x, pad


def _transformer_layer(cfg: ModelConfig):
    return LayerConfig.variant("transformer")().build_encoder_layer(cfg, 0)


def _copy_unit(mute: MuteEncoderLayer, std, attn_unit: int, ffn_unit: int) -> None:
    """Unit weights of `mute` into a pre-norm TransformerEncoderLayer (LN_a -> its attention norm)."""
    a, f = mute.self_attn, mute.ffn
    with torch.no_grad():
        std.self_attn.in_proj.weight.copy_(a.in_weight[attn_unit])
        std.self_attn.in_proj.bias.copy_(a.in_bias[attn_unit])
        std.self_attn.out_proj.weight.copy_(a.out_weight[attn_unit])
        std.self_attn.out_bias[0].copy_(a.out_bias[attn_unit])
        if a.relative is not None:
            std.self_attn.relative.load_state_dict(a.relative.state_dict())
        std.self_attn_residual.norm.load_state_dict(mute.norm.state_dict())
        std.ffn_residual.norm.weight.copy_(f.norm_weight[ffn_unit])
        std.ffn_residual.norm.bias.copy_(f.norm_bias[ffn_unit])
        std.ffn.fc1.weight.copy_(f.fc1_weight[ffn_unit])
        std.ffn.fc1.bias.copy_(f.fc1_bias[ffn_unit])
        std.ffn.fc2.weight.copy_(f.fc2_weight[ffn_unit])
        std.ffn.fc2_bias[0].copy_(f.fc2_bias[ffn_unit])


# ---- configuration ----------------------------------------------------------------------------------


def test_config_errors():
    with pytest.raises(ConfigError, match="encoder-only"):
        from_dict(ModelConfig, tiny_model_dict(norm="pre", encoder={"kind": "mute"}, decoder={"kind": "mute"}))
    with pytest.raises(ConfigError, match="pre-norm"):
        from_dict(ModelConfig, tiny_model_dict(norm="post", encoder={"kind": "mute"}))
    with pytest.raises(ConfigError, match="bias_modules has 2 entries"):
        _cfg({"bias_modules": ["identity", "swap"]})
    with pytest.raises(ConfigError, match="not one of"):
        _cfg({"bias_modules": ["identity", "swap", "shuffle", "mask"]})
    with pytest.raises(ConfigError, match="encoder-only"):
        _cfg().encoder.build_decoder_layer(_cfg(), 0)


@pytest.mark.parametrize("name", ["mute", "mute-bias", "mute-bias-seq"])
def test_paper_presets(name):
    cfg = resolve_config(name)
    m, enc = cfg.model, cfg.model.encoder
    assert (m.d_model, m.heads, m.ffn_dim, m.encoder_layers, m.decoder_layers) == (512, 8, 2048, 6, 6)
    assert (m.norm, m.relative_positions, m.decoder.kind, enc.kind, enc.units) == ("pre", 16, "transformer", "mute", 4)
    assert (cfg.decode.beam, cfg.decode.length_penalty, cfg.decode.length_penalty_kind) == (4, 0.6, "gnmt")
    assert (cfg.train.label_smoothing_kind, cfg.train.lr.schedule, cfg.train.lr.warmup) == ("onmt", "noam", 16000)
    assert enc.bias_modules == (None if name == "mute" else BIASED)
    assert enc.fusion == ("sequential" if name == "mute-bias-seq" else "weighted")
    if name != "mute":
        assert enc.bias_switch.rate == 0.85


@pytest.mark.parametrize("name", ["mute-tiny", "mute-bias-tiny", "mute-bias-seq-tiny"])
def test_tiny_presets_build(name):
    cfg = resolve_config(name, overrides=["model.src_vocab_size=50", "model.tgt_vocab_size=50"])
    model = build_model(cfg.model)
    assert all(isinstance(layer, MuteEncoderLayer) for layer in model.encoder.layers)
    assert model.encoder.layers[0].units == 4 and cfg.model.norm == "pre" and cfg.model.relative_positions > 0
    assert (model.encoder.layers[0].autoshuffle is not None) == name.startswith("mute-bias-seq")


# ---- layer equivalences ---------------------------------------------------------------------------


def test_one_identity_unit_with_unit_weight_is_a_pre_norm_transformer_layer(device):
    cfg = _cfg({"units": 1}, dropout=0.0)
    mute = _layer({"units": 1}, dropout=0.0).eval()
    with torch.no_grad():
        mute.unit_weights.fill_(1.0)
    std = _transformer_layer(cfg).eval()
    _copy_unit(mute, std, 0, 0)
    mute, std = mute.to(device), std.to(device)
    x, pad = (t.to(device) for t in _inputs())
    torch.testing.assert_close(mute(x, pad), std(x, pad), atol=1e-5, rtol=1e-5)


def test_one_unit_matches_the_transformer_layer_in_training_too_with_dropouts_and_drophead(device):
    """Same seed, same random draws: dropout, attention dropout, activation dropout and DropHead (on CUDA
    from its generator, which torch.manual_seed seeds too)."""
    over = {"dropout": 0.2, "attention_dropout": 0.1, "activation_dropout": 0.1, "drophead": {"rate": 0.3}}
    mute = _layer({"units": 1}, **over).train()
    with torch.no_grad():
        mute.unit_weights.fill_(1.0)
    std = _transformer_layer(_cfg({"units": 1}, **over)).train()
    _copy_unit(mute, std, 0, 0)
    mute, std = mute.to(device), std.to(device)
    x, pad = (t.to(device) for t in _inputs())
    torch.manual_seed(4)
    ours = mute(x, pad)
    torch.manual_seed(4)
    theirs = std(x, pad)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_drophead_acts_per_sample_and_unit_with_rescale_within_the_unit():
    layer = _layer({}, dropout=0.0, drophead={"rate": 0.5}).train()
    drophead, seen = layer.self_attn.drophead, []
    original = drophead.forward
    drophead.forward = lambda batch, device: seen.append(original(batch, device)) or seen[-1]
    x, pad = _inputs()
    layer(x, pad)
    (scale,) = seen
    assert scale.shape == (3 * 4, 4), "one row per sample and unit, one column per head"
    kept = (scale > 0).float()
    torch.testing.assert_close(scale.sum(1), torch.full((12,), 4.0))
    torch.testing.assert_close(scale[kept.bool()], (4 / kept.sum(1, keepdim=True)).expand_as(scale)[kept.bool()])
    assert torch.equal(layer.eval()(x, pad), layer.eval()(x, pad))


def _loop_reference(layer: MuteEncoderLayer, x, pad, unit_inputs) -> torch.Tensor:
    """The layer computed unit by unit with standard modules (no dropout)."""
    cfg = _cfg(dropout=0.0)
    outputs = []
    for i in range(layer.units):
        std = _transformer_layer(cfg).eval()
        _copy_unit(layer, std, 0 if layer.self_attn.units == 1 else i, 0 if layer.ffn.units == 1 else i)
        s = x + std.self_attn(unit_inputs[i], key_padding_mask=pad)  # residual on the clean x
        outputs.append(s + std.ffn(std.ffn_residual.norm(s)))
    units = torch.stack(outputs)  # [I, B, S, d]
    if layer.autoshuffle is not None:
        return sequential_fusion(units, layer.autoshuffle.weight.detach(), layer.unit_weights.detach())
    return sum(layer.unit_weights[i].detach() * units[i] for i in range(layer.units))


# Explicit noise draws for the batch of `_inputs()` (real lengths 7, 4, 2), one entry per sentence:
SWAP_PAIRS = [(1, 3), (0, 1), (0, 1)]  # the two exchanged positions
DISORDER = [(2, (2, 0, 1)), (1, (1, 2, 0)), None]  # (window start, permutation); too short: unchanged
MASKED = [(4,), (2,), (1,)]  # masked positions (one per sentence: valid for both mask modes)


def _explicit_draws(kinds: list[str], batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draws above in the layer's encoding: (index [I, B, S] source positions, masked [I, B, S])."""
    index = torch.arange(length).repeat(len(kinds), batch, 1)
    masked = torch.zeros(len(kinds), batch, length, dtype=torch.bool)
    for i, kind in enumerate(kinds):
        for b in range(batch):
            if kind == "swap":
                p1, p2 = SWAP_PAIRS[b]
                index[i, b, p1], index[i, b, p2] = p2, p1
            elif kind == "disorder" and DISORDER[b] is not None:
                start, perm = DISORDER[b]
                index[i, b, start : start + 3] = start + torch.tensor(perm)
            elif kind == "mask":
                masked[i, b, list(MASKED[b])] = True
    return index, masked


def _hand_noised_inputs(kinds: list[str], n: torch.Tensor, e_mask: torch.Tensor | None) -> torch.Tensor:
    """Unit inputs [I, B, S, d] written out row by row from the same draws (no production noise code)."""
    units = []
    for kind in kinds:
        u = n.clone()
        for b in range(n.shape[0]):
            if kind == "swap":
                p1, p2 = SWAP_PAIRS[b]
                u[b, p1], u[b, p2] = n[b, p2], n[b, p1]
            elif kind == "disorder" and DISORDER[b] is not None:
                start, perm = DISORDER[b]
                for k in range(3):
                    u[b, start + k] = n[b, start + perm[k]]
            elif kind == "mask":
                for pos in MASKED[b]:
                    u[b, pos] = e_mask
        units.append(u)
    return torch.stack(units)


@pytest.mark.parametrize(
    "mute",
    [
        {},
        {"fusion": "sequential"},
        {"bias_modules": BIASED, "bias_switch": 1.0},
        {"bias_modules": BIASED, "bias_switch": 1.0, "fusion": "sequential", "mask_mode": "one"},
        {"bias_modules": BIASED, "bias_switch": 1.0, "shared_attention": True},
        {"bias_modules": BIASED, "bias_switch": 1.0, "shared_ffn": True},
    ],
)
def test_batched_units_equal_a_per_unit_loop(mute):
    layer = _layer(mute, dropout=0.0)
    with torch.no_grad():
        layer.unit_weights.copy_(torch.randn(4))
        if layer.autoshuffle is not None:
            layer.autoshuffle.weight.copy_(normalise_shuffle(torch.rand(4, 4)))
    x, pad = _inputs()
    layer.train()  # noise on (p_beta = 1: no coin), no dropout
    if layer.bias is not None:  # the layer gets the explicit draws instead of random ones
        draws = _explicit_draws(layer.bias.kinds, *pad.shape)
        layer.bias.sample = lambda padding_mask, generator=None: draws
    ours = layer(x, pad)
    with torch.no_grad():
        n = layer.norm(x)
        if layer.bias is not None:
            unit_inputs = _hand_noised_inputs(layer.bias.kinds, n, layer.bias.mask_embedding)
        else:
            unit_inputs = n[None].expand(4, *n.shape)
        expected = _loop_reference(layer, x, pad, unit_inputs)
    torch.testing.assert_close(ours.detach(), expected, atol=1e-5, rtol=1e-5)


def test_eval_is_noise_free_and_the_bias_modules_add_only_the_mask_embedding():
    """(Eval determinism and rate independence are in test_layer_contract.py.)"""
    biased = build_model(_cfg({"bias_modules": BIASED, "bias_switch": 1.0, "fusion": "sequential"}, dropout=0.0))
    plain = build_model(_cfg({"fusion": "sequential"}, dropout=0.0))
    missing, unexpected = plain.load_state_dict(biased.state_dict(), strict=False)
    assert not missing and all(k.endswith("bias.mask_embedding") for k in unexpected)
    src = torch.randint(4, 40, (3, 9))
    src[1, 6:] = 0
    prev = torch.randint(4, 40, (3, 5))
    biased.eval()
    out = biased(src, prev)
    assert torch.equal(out, plain.eval()(src, prev)), "no bias module acts in eval"
    biased.train()
    assert not torch.allclose(biased(src, prev), out), "with p_beta = 1 training is noised"


def test_shared_sublayer_ablations():
    full = _layer({})
    one_self = _layer({"shared_attention": True})
    one_ffn = _layer({"shared_ffn": True})
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    attn = sum(p.numel() for p in full.self_attn.parameters() if p.dim() > 1 or p.shape[0] == 4) // 4
    assert one_self.self_attn.units == 1 and one_ffn.ffn.units == 1
    assert count(full) - count(one_self) == 3 * (attn - sum(p.numel() for p in full.self_attn.relative.parameters()) // 4)
    x, pad = _inputs()
    scores = one_self.eval().diversity(x, pad)
    assert scores["att_sub"] == pytest.approx(torch.exp(torch.tensor(-1.0)).item(), abs=1e-5)
    assert scores["ffn_sub"] > scores["att_sub"], "own FFNs make the units differ"


def test_parameters_are_i_units_of_a_pre_norm_layer():
    cfg = _cfg({"fusion": "sequential", "bias_modules": BIASED})
    std = sum(p.numel() for p in _transformer_layer(cfg).parameters())
    layer = build_model(cfg).encoder.layers[0]
    relative, d = 2 * 9 * 8, 32  # key and value tables of (2*4+1) x d_k
    expected = 4 * (std - relative - 2 * d) + 2 * d + relative + 4 + 16 + d  # + LN_a, w, M^p, e_mask
    assert sum(p.numel() for p in layer.parameters()) == expected


def test_init_excludes_autoshuffle_mask_and_unit_weights_from_xavier():
    model = build_model(_cfg({"bias_modules": BIASED, "fusion": "sequential"}))
    for layer in model.encoder.layers:
        assert layer.autoshuffle.is_normalised()
        assert torch.equal(layer.unit_weights, torch.full((4,), 0.25))
        bound = (6 / 64) ** 0.5  # Glorot for one [d, d] block of one unit
        blocks = layer.self_attn.in_weight.detach().view(4, 3, 32, 32)
        assert blocks.abs().max() <= bound and (blocks.abs().amax(dim=(2, 3)) > 0.8 * bound).all()


# ---- hooks ------------------------------------------------------------------------------------------


def test_hooks_schedules_penalty_metrics_and_groups():
    cfg = _cfg({"bias_modules": BIASED, "fusion": "sequential", "autoshuffle_penalty": 0.01,
                "bias_switch": {"schedule": "linear", "start": 0.5, "end": 1.0}}, drophead={"rate": 0.2})
    model = build_model(cfg)
    hooks = ModuleHooks(model)
    hooks.update_start(50, 10, 100)
    layers = model.encoder.layers
    assert all(layer.bias.switch.value == pytest.approx(0.75) for layer in layers)
    losses = hooks.extra_losses()
    torch.testing.assert_close(losses["autoshuffle"], 0.01 * sum(layer.autoshuffle.penalty() for layer in layers))
    metrics = hooks.training_metrics()
    assert metrics["encoder.layers.1.w3"] == 0.25 and "encoder.layers.0.perm_penalty" in metrics
    opt = build_optimizer(model, TrainConfig(max_steps=1, weight_decay=0.01), hooks.parameter_groups())
    (group,) = [g for g in opt.param_groups if g["name"] == "mute_no_decay"]
    assert group["weight_decay"] == 0.0 and len(group["params"]) == 2 * len(layers)
    model.train()
    src = torch.randint(4, 40, (3, 9))
    (model(src, src).logsumexp(-1).mean() + losses["autoshuffle"]).backward()
    opt.step()
    assert not all(layer.autoshuffle.is_normalised() for layer in layers)
    hooks.after_optimizer_step()
    assert all(layer.autoshuffle.is_normalised() for layer in layers)


# ---- diversity (eq. 21) -----------------------------------------------------------------------------


@pytest.mark.parametrize("units", [1, 2, 4])
def test_diversity_of_identical_and_orthogonal_units(units):
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    same = torch.randn(1, 2, 5, 8).expand(units, 2, 5, 8)
    assert diversity_score(same, pad).item() == pytest.approx(torch.exp(torch.tensor(-1.0)).item(), abs=1e-6)
    ortho = torch.zeros(units, 2, 5, 8)
    for i in range(units):
        ortho[i, ..., i] = torch.rand(2, 5) + 0.5
    ortho[:, 1, 3:] = torch.randn(units, 2, 8)  # garbage at pads is ignored
    assert diversity_score(ortho, pad).item() == pytest.approx(torch.exp(torch.tensor(-1.0 / units)).item(), abs=1e-6)


def test_encoder_diversity_runs_in_eval_on_every_mute_layer():
    model = build_model(_cfg({"bias_modules": BIASED}))
    src = torch.randint(4, 40, (3, 9))
    with pytest.raises(RuntimeError, match="eval"):
        encoder_diversity(model.train(), src)
    src[1, 6:] = model.config.pad_id
    scores = encoder_diversity(model.eval(), src)
    assert len(scores) == 2 and set(scores[0]) == {"att_pos", "att_sub", "ffn_sub"}
    # each layer is scored on the input it gets in a normal forward (not the embeddings, not its output);
    # the scores themselves are checked against a hand computation in tests/analysis/test_diversity_reference.py
    inputs = []
    hooks = [layer.register_forward_pre_hook(lambda mod, args: inputs.append(args[0].detach()))
             for layer in model.encoder.layers]
    with torch.no_grad():
        model.encoder(src)
    for hook in hooks:
        hook.remove()
    assert not torch.allclose(inputs[0], inputs[1])
    for layer, x, got in zip(model.encoder.layers, inputs, scores, strict=True):
        assert got == pytest.approx(layer.diversity(x, src.eq(model.config.pad_id)), rel=1e-6)


# ---- the whole model ----------------------------------------------------------------------------------


def _mute_experiment(**train_overrides):
    from multibranch.experiment import ExperimentConfig

    model = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 1, "decoder_layers": 1, "norm": "pre",
             "relative_positions": 4, "dropout": 0.1,
             "encoder": {"kind": "mute", "bias_modules": BIASED, "fusion": "sequential", "autoshuffle_penalty": 0.1,
                         "bias_switch": 0.5},
             "decoder": {"kind": "transformer"}}
    trn = {"max_tokens": 400, "lr": {"schedule": "inverse_sqrt", "lr": 0.002, "warmup": 5}, "valid_every": 4,
           "log_every": 1, "valid_bleu": False, "max_steps": 4, "seed": 7, **train_overrides}
    return from_dict(ExperimentConfig, {"model": model, "train": trn})


def _train_records(run) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["type"] == "train"]


def test_short_training_run_through_the_trainer(tiny_data, tmp_path):
    from multibranch.loading.checkpoint import load_model
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions

    train(_mute_experiment(), RunOptions(tiny_data, tmp_path / "run"))
    records = _train_records(tmp_path / "run")
    assert len(records) == 4
    assert all(r["aux_autoshuffle"] > 0 and "encoder.layers.0.w3" in r["modules"] for r in records)
    assert records[-1]["modules"]["encoder.layers.0.w0"] != 0.25, "unit weights are trained"
    loaded = load_model(tmp_path / "run" / "last.pt")
    assert loaded.model.encoder.layers[0].autoshuffle.is_normalised(), "the saved matrix is the normalised one"


@pytest.mark.slow
def test_resumed_run_repeats_the_uninterrupted_one(tiny_data, tmp_path):
    """Noise coins and positions come from the torch RNG (saved in last.pt); M^p loads bit-for-bit."""
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions

    train(_mute_experiment(max_steps=8, deterministic=True), RunOptions(tiny_data, tmp_path / "straight"))
    train(_mute_experiment(max_steps=4, deterministic=True), RunOptions(tiny_data, tmp_path / "legs"))
    train(_mute_experiment(max_steps=8, deterministic=True), RunOptions(tiny_data, tmp_path / "legs", resume=True))
    keys = ("step", "loss", "grad_norm", "aux_autoshuffle", "modules")
    legs, straight = _train_records(tmp_path / "legs"), _train_records(tmp_path / "straight")
    assert [[r[k] for k in keys] for r in legs] == [[r[k] for k in keys] for r in straight]
