"""MUSE / MUSE-simple layers and models (docs/papers.md#muse): beam scores == rescoring, MUSE-simple
== MUSE without its conv, one parallel block per layer, DropHead on the MUSE attention, padding,
init, trainer hooks, presets and parameter counts against the reference run log. (Incremental
decoding, state reordering, eval determinism and save/load: tests/models/test_layer_contract.py.)"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from multibranch.config import ConfigError, deep_merge, from_dict
from multibranch.experiment import ExperimentConfig, load_preset_dict, resolve_config
from multibranch.experiment.decoding import DecodeConfig
from multibranch.hooks import ModuleHooks
from multibranch.models import ModelConfig, build_model
from multibranch.models.layers.muse import MultiScaleSelfAttention
from multibranch.modules.attention import ParallelAttention

VOCAB, PAD, BOS, EOS = 40, 0, 2, 3


def _cfg(conv: bool = True, layer: dict | None = None, **overrides) -> ModelConfig:
    kind = {"kind": "muse", "conv": conv, **(layer or {})}
    values = {
        "d_model": 32, "heads": 4, "ffn_dim": 48, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1,
        "max_positions": 64, "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB, "init": "torch",
        "encoder": dict(kind), "decoder": dict(kind),
    }
    values.update(overrides)
    return from_dict(ModelConfig, values)


def _model(conv: bool = True, layer: dict | None = None, **overrides) -> torch.nn.Module:
    model = build_model(_cfg(conv, layer, **overrides))
    with torch.no_grad():  # larger random weights (and non-uniform gates) than the init, so differences show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded sources [3, 9] and decoder inputs [3, 7] (BOS + tokens)."""
    g = torch.Generator().manual_seed(11)
    src = torch.randint(4, VOCAB, (3, 9), generator=g)
    src[0, 6:] = PAD
    src[2, 3:] = PAD
    src[torch.arange(3), torch.tensor([5, 8, 2])] = EOS
    prev = torch.randint(4, VOCAB, (3, 7), generator=g)
    prev[:, 0] = BOS
    return src, prev


@pytest.mark.parametrize("conv", [True, False])
def test_beam_search_scores_equal_teacher_forced_rescoring(conv):
    """The real beam search (hypotheses reordered every step, rolling windows included)."""
    from multibranch.inference.beam import beam_search

    model = _model(conv)
    src, _ = _batch()
    with torch.no_grad():
        hyps = beam_search(model, src, DecodeConfig(beam=4, min_len=0))
        for b, best in enumerate(hyps):
            for hyp in best[:2]:
                tokens = torch.tensor(hyp.tokens + [EOS])
                prev = torch.cat([torch.tensor([BOS]), tokens[:-1]])[None]
                logits = model(src[b : b + 1], prev).float()[0]
                logits[:, [PAD, BOS]] = float("-inf")  # the beam's masking before log_softmax
                expected = torch.log_softmax(logits, -1).gather(-1, tokens[:, None])[:, 0]
                torch.testing.assert_close(torch.tensor(hyp.positional_scores), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_muse_simple_equals_muse_with_the_conv_branch_removed(norm):
    muse, simple = _model(True, norm=norm), _model(False, norm=norm)
    extra = set(muse.state_dict()) - set(simple.state_dict())
    assert set(simple.state_dict()) < set(muse.state_dict())
    assert extra and all(".self_attn.conv." in k or ".self_attn.conv_out." in k for k in extra)
    simple.load_state_dict({k: v for k, v in muse.state_dict().items() if k not in extra})
    with torch.no_grad():
        for layer in [*muse.encoder.layers, *muse.decoder.layers]:
            layer.self_attn.conv_out.weight.zero_()  # W^C = 0: the conv contributes nothing
    src, prev = _batch()
    with torch.no_grad():
        assert torch.equal(muse(src, prev), simple(src, prev))
        muse.encoder.layers[0].self_attn.conv_out.weight.normal_()
        assert not torch.allclose(muse(src, prev), simple(src, prev))


def test_layers_are_one_parallel_block_with_one_residual_and_one_norm():
    model = _model(True)
    src, prev = _batch()
    with torch.no_grad():
        enc = model.encode(src)
        x = torch.randn(3, 9, 32)
        layer = model.encoder.layers[0]
        branches = layer.self_attn(x, key_padding_mask=enc.padding_mask) + layer.ffn(x)
        torch.testing.assert_close(layer(x, enc.padding_mask), layer.norm(x + branches))
        y = torch.randn(3, 7, 32)
        layer = model.decoder.layers[1]
        branches = (layer.self_attn(y, causal=True) + layer.cross_attn(y, enc.out, key_padding_mask=enc.padding_mask)
                    + layer.ffn(y))  # cross-attention reads the layer input y, in parallel
        torch.testing.assert_close(layer(y, enc.out, enc.padding_mask), layer.norm(y + branches))


def test_input_dropout_reaches_only_the_self_attention_and_conv_input():
    model = _model(True, layer={"input_dropout": 0.5}, dropout=0.0)
    layer = model.decoder.layers[0].train()
    seen = {}
    for name in ("self_attn", "cross_attn", "ffn"):
        getattr(layer, name).register_forward_pre_hook(lambda m, args, kw=None, n=name: seen.__setitem__(n, args[0]))
    y, memory = torch.randn(2, 5, 32), torch.randn(2, 4, 32)
    layer(y, memory, None)
    assert torch.equal(seen["cross_attn"], y) and torch.equal(seen["ffn"], y)
    dropped = seen["self_attn"]
    assert bool((dropped == 0).any())
    torch.testing.assert_close(dropped[dropped != 0], 2 * y[dropped != 0])


def test_drophead_acts_on_the_heads_of_the_muse_attention():
    model = _model(True, layer={"conv_weight_dropout": 0.0}, dropout=0.0, drophead={"rate": 0.5})
    attentions = [m for m in model.modules() if isinstance(m, ParallelAttention)]
    assert len(attentions) == 2 + 2 * 2 and all(a.drophead is not None for a in attentions)

    msa: MultiScaleSelfAttention = model.encoder.layers[0].self_attn
    reference = copy.deepcopy(msa).eval()
    scale = torch.tensor([[4.0, 0, 0, 0], [0, 2, 0, 2], [1, 1, 1, 1]])  # kept heads scaled by H/#kept
    msa.attn.drophead.forward = lambda batch_size, device: scale
    x = torch.randn(3, 6, 32)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, 4:] = True
    with torch.no_grad():
        got = msa.train()(x, key_padding_mask=pad)
        for b in range(3):  # scaling head h before W_O == scaling W_O's columns of head h
            ref = copy.deepcopy(reference)
            ref.attn.out_proj.weight.mul_(scale[b].repeat_interleave(8))
            torch.testing.assert_close(got[b : b + 1], ref(x[b : b + 1], key_padding_mask=pad[b : b + 1]))
        msa.attn.drophead.forward = lambda batch_size, device: torch.zeros(batch_size, 4)
        no_heads = msa(x, key_padding_mask=pad)  # only the conv branch and the output bias remain
        conv_only = msa.conv_out(msa.conv(msa.attn.project_qkv(x)[2].transpose(1, 2).reshape(3, 6, 32), pad))
        torch.testing.assert_close(no_heads, conv_only + msa.attn.out_bias[0])


def test_real_tokens_are_independent_of_source_padding_length():
    outputs = {}
    for mask in (True, False):
        model = _model(True, layer={"conv_mask_padding": mask})
        src = torch.randint(4, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            outputs[mask] = [model.encode(F.pad(src, (0, pad), value=PAD)).out[:, :6] for pad in (0, 4, 13)]
    for out in outputs[True][1:]:
        torch.testing.assert_close(out, outputs[True][0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(outputs[False][2], outputs[False][0], atol=1e-4)  # the reference's leak


@pytest.mark.parametrize("scheme", ["torch", "xavier"])
def test_init_treats_attention_and_conv_output_as_one_matrix(scheme):
    cfg = _cfg(True, d_model=128, heads=4, init=scheme)
    model = build_model(cfg)
    layer = model.decoder.layers[0]
    d = 128
    bound = math.sqrt(3 / (2 * d)) if scheme == "torch" else math.sqrt(6 / (d + 2 * d))  # W_out [d, 2d]
    for w in (layer.self_attn.attn.out_proj.weight, layer.self_attn.conv_out.weight):
        assert 0.95 * bound < w.abs().max() <= bound
    cross_bound = math.sqrt(3 / d) if scheme == "torch" else math.sqrt(6 / (2 * d))  # plain [d, d]
    assert 0.95 * cross_bound < layer.cross_attn.out_proj.weight.abs().max() <= cross_bound
    conv = layer.self_attn.conv
    torch.testing.assert_close(conv.gate.detach(), torch.full((2,), 0.5))
    xavier_k15 = math.sqrt(6 / (d + 4 * 15))  # the kernel predictor is Xavier under both schemes
    assert 0.9 * xavier_k15 < conv.kernel_proj.weight[4 * 3 :].abs().max() <= xavier_k15


def test_gates_are_reported_per_layer_and_excluded_from_weight_decay():
    model = _model(True)
    hooks = ModuleHooks(model)
    metrics = hooks.training_metrics()
    for stack in ("encoder", "decoder"):
        for i in range(2):
            gate = [metrics[f"{stack}.layers.{i}.self_attn.conv.gate.k{k}"] for k in (3, 15)]
            layer = getattr(model, stack).layers[i]
            torch.testing.assert_close(torch.tensor(gate), torch.softmax(layer.self_attn.conv.gate.detach(), 0))
    (group,) = hooks.parameter_groups()
    assert group.name == "kernel_gates" and group.weight_decay == 0.0 and len(group.params) == 4
    single = ModuleHooks(_model(True, layer={"kernel_sizes": [3]}))  # one kernel: no gate to learn
    assert single.training_metrics() == {} and single.parameter_groups() == []


def test_config_validation_and_per_layer_kernels():
    with pytest.raises(ConfigError, match="odd"):
        _cfg(True, layer={"kernel_sizes": [3, 4]})
    with pytest.raises(ConfigError, match="layer_kernel_sizes"):
        _cfg(True, layer={"layer_kernel_sizes": [[3], [5], [7]]})  # 3 entries for 2 layers
    with pytest.raises(ConfigError):
        _cfg(True, layer={"conv_weight_dropout": 1.0})
    model = build_model(_cfg(True, layer={"layer_kernel_sizes": [[3], [7, 15]]}))
    assert [layer.self_attn.conv.kernel_sizes for layer in model.encoder.layers] == [[3], [7, 15]]
    assert [layer.self_attn.conv.causal for layer in model.decoder.layers] == [True, True]
    assert not any(layer.self_attn.conv.causal for layer in model.encoder.layers)
    assert all(layer.cross_attn is None for layer in model.encoder.layers)


def test_muse_base_parameter_count_equals_the_reference_run_log():
    """lancopku/MUSE IWSLT14 De-En log: 48,193,584 parameters (8848/6632 vocabularies, separate
    embeddings), which include an unused LayerNorm (2d) allocated in each of the 12 decoder layers."""
    sizes = ["model.src_vocab_size=8848", "model.tgt_vocab_size=6632"]
    with torch.device("meta"):  # shapes only
        muse = build_model(resolve_config("muse", None, sizes).model).parameter_counts()["total"]
        simple = build_model(resolve_config("muse-simple", None, sizes).model).parameter_counts()["total"]
    assert muse == 48_193_584 - 12 * 2 * 384
    conv_params = 24 * (384 * 384 + 384 * 4 * (3 + 15) + 2)  # W^C_2, kernel predictor, gate per layer
    assert simple == muse - conv_params and round(simple / 1e6) == 44  # paper: 44M


def test_presets_resolve_and_tiny_presets_match_transformer_tiny_size():
    base = resolve_config("muse")
    assert base.model.init == "torch" and base.model.share_embeddings == "none" and base.model.dropout == 0.4
    assert base.model.encoder.kernel_sizes == [3, 15] and base.model.decoder.conv
    assert (base.train.lr.lr, base.train.lr.warmup, base.train.weight_decay) == (1e-3, 4000, 1e-4)
    assert (base.decode.beam, base.decode.length_penalty) == (5, 1.0)
    assert not resolve_config("muse-simple").model.encoder.conv
    vocab = {"model": {"src_vocab_size": 1000, "tgt_vocab_size": 1000}}
    counts = {}
    for name in ("transformer-tiny", "muse-tiny", "muse-simple-tiny"):
        cfg = ExperimentConfig.from_dict(deep_merge(load_preset_dict(name), vocab))
        with torch.device("meta"):
            counts[name] = build_model(cfg.model).parameter_counts()["total"]
    assert abs(counts["muse-tiny"] / counts["transformer-tiny"] - 1) < 0.05
    assert counts["muse-simple-tiny"] < counts["muse-tiny"]
    assert resolve_config("muse-tiny").model.init == "torch"


@pytest.fixture(scope="module")
def synthetic_data(tmp_path_factory):
    from multibranch.data.parallel_prepare import PrepareConfig
    from multibranch.tasks.translation.prepare import prepare
    from multibranch.tasks.translation.synthetic import generate_synthetic_task

    root = tmp_path_factory.mktemp("muse_data")
    generate_synthetic_task(root / "raw", seed=5, n_train=200, n_valid=16, n_test=8)
    raw = root / "raw"
    prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(raw / "train"), valid=str(raw / "valid"),
                          test=[str(raw / "test")], out=str(root / "data"), vocab_size=120))
    return root / "data"


def test_short_training_run_through_the_trainer(synthetic_data, tmp_path):
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions

    data = deep_merge(load_preset_dict("muse-tiny"), {
        "model": {"d_model": 32, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2},
        "train": {"max_steps": 4, "max_tokens": 400, "valid_every": 4, "log_every": 2, "valid_bleu": False,
                  "max_minutes": None, "weight_decay": 0.01, "lr": {"schedule": "inverse_sqrt", "lr": 0.002,
                                                                   "warmup": 2}},
    })
    state = train(ExperimentConfig.from_dict(data), RunOptions(synthetic_data, tmp_path / "run", progress=False))
    assert state.step == 4
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trains = [r for r in records if r["type"] == "train"]
    assert trains and all(math.isfinite(r["loss"]) for r in trains)
    gates = {k: v for k, v in trains[-1]["modules"].items() if ".conv.gate." in k}
    assert len(gates) == 2 * 2 * 2  # 2 kernels x 2 layers x (encoder, decoder)
    assert any(abs(v - 0.5) > 1e-6 for v in gates.values()), "the gates were trained"
