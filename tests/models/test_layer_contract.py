"""The contract every registered layer kind keeps, checked once for all kinds.

Parametrised over the LayerConfig registry: a newly registered kind without an entry in CASES (and in
ONE_BRANCH) fails here instead of going untested. The checks, on tiny models with every random
option switched on (dropout, attention/activation dropout, DropHead, the kind's own structured
dropout or noise at rate R):

- cached incremental decoding (`decode_step`) equals the full teacher-forced forward;
- a beam-style reorder of the decoder state continues like the full forward of the reordered prefixes;
- a memory row shared by a sentence's hypotheses (beam search) equals a copy per hypothesis;
- eval is deterministic and independent of every dropout / noise rate (same weights, rates 0);
  training is stochastic;
- state_dict -> fresh model -> the same output;
- one branch (unit) equals the standard Transformer where the kind has a branch count.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
import torch

from multibranch.config import from_dict
from multibranch.hooks import ModuleHooks
from multibranch.models import LayerConfig, ModelConfig, build_model
from multibranch.modules.state import DecoderState
from tests.helpers.layer_kinds import both_sides

VOCAB, PAD, BOS, EOS = 40, 0, 2, 3
R = 0.3  # every dropout / structured-dropout / noise rate of the models under test
BIASED = ["identity", "swap", "mask", "disorder"]


def _rates(r: float) -> dict:
    return {"dropout": r, "attention_dropout": r, "activation_dropout": r, "drophead": {"rate": r}}


def _mat(r: float, **layer) -> dict:
    return both_sides({"kind": "transformer", "attention_branches": 2, "ffn_branches": 2, "drop_branch": r, **layer})


def _mute(**layer) -> dict:
    return {"norm": "pre", "relative_positions": 4, "encoder": {"kind": "mute", **layer},
            "decoder": {"kind": "transformer"}}


def _muse(r: float, conv: bool = True, **layer) -> dict:
    return both_sides({"kind": "muse", "conv": conv, "conv_weight_dropout": r, "input_dropout": r, **layer})


# kind -> case name -> model-config overrides as a function of the rate r (r = 0: no randomness at all)
CASES: dict[str, dict[str, Callable[[float], dict]]] = {
    "transformer": {
        "standard": lambda r: {},
        "standard-pre-learned-relative": lambda r: {"norm": "pre", "positions": "learned", "relative_positions": 4},
        "mat": lambda r: _mat(r),
        "mat-pre-relative-per-sample-mean-sq": lambda r: {
            "norm": "pre", "positions": "learned", "relative_positions": 4,
            **_mat(r, drop_branch_granularity="sample", branch_merge="mean_sq")},
        "mat-head-drop": lambda r: _mat(r, head_drop=True),
    },
    "weighted": {
        "cross": lambda r: both_sides({"kind": "weighted"}),
        "self": lambda r: both_sides({"kind": "weighted", "decoder_branched": "self"}),
        "cross-pre-relative": lambda r: {"norm": "pre", "relative_positions": 4, **both_sides({"kind": "weighted"})},
        "self-pre-relative": lambda r: {"norm": "pre", "relative_positions": 4,
                                        **both_sides({"kind": "weighted", "decoder_branched": "self"})},
        "shared-ffn-branch-norm": lambda r: both_sides({"kind": "weighted", "ffn_mode": "shared", "branch_norm": True}),
    },
    "mute": {
        "units": lambda r: _mute(),
        "biased-sequential": lambda r: _mute(bias_modules=BIASED, bias_switch=r, fusion="sequential"),
        "biased-shared-attention": lambda r: _mute(bias_modules=BIASED, bias_switch=r, shared_attention=True),
    },
    "muse": {
        "muse": lambda r: _muse(r),
        "muse-simple": lambda r: _muse(r, conv=False),
        "muse-pre": lambda r: {"norm": "pre", **_muse(r)},
        "muse-simple-pre": lambda r: {"norm": "pre", **_muse(r, conv=False)},
        "muse-relative": lambda r: {"relative_positions": 4, **_muse(r)},
        "muse-separate-concat": lambda r: _muse(r, conv_projection="separate", kernel_mix="concat",
                                                kernel_sizes=[1, 5]),
        "muse-per-layer-unfold": lambda r: _muse(r, layer_kernel_sizes=[[3], [7, 15]], conv_band_max_len=0),
    },
}


def _params() -> list:
    params = []
    for kind in sorted(LayerConfig._variants):  # every registered kind, so a new one cannot be forgotten
        for name in CASES.get(kind, {"<no contract case>": None}):
            params.append(pytest.param(kind, name, id=f"{kind}:{name}"))
    return params


def _config(kind: str, name: str, r: float) -> ModelConfig:
    if kind not in CASES:
        pytest.fail(f"layer kind {kind!r} is registered but has no case in tests/models/test_layer_contract.py CASES")
    values = {"d_model": 32, "heads": 4, "ffn_dim": 48, "encoder_layers": 2, "decoder_layers": 2,
              "max_positions": 64, "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB, **_rates(r)}
    values.update(CASES[kind][name](r))
    cfg = from_dict(ModelConfig, values)
    assert kind in (cfg.encoder.kind, cfg.decoder.kind)
    return cfg


def _perturbed(cfg: ModelConfig) -> torch.nn.Module:
    """A model with larger random weights than the init (so differences show), kept valid by the
    kinds' own projections (simplex kappa/alpha, normalised AutoShuffle)."""
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ModuleHooks(model).after_optimizer_step()
    return model


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


@pytest.mark.parametrize(("kind", "name"), _params())
def test_cached_steps_equal_the_full_forward(kind, name, device):
    model = _perturbed(_config(kind, name, R)).to(device).eval()
    src, prev = (t.to(device) for t in _batch())
    with torch.inference_mode():
        full = model(src, prev)  # [B, T, V]
        enc = model.encode(src)
        state = DecoderState()
        steps = [model.decode_step(prev[:, t : t + 1], enc, state) for t in range(prev.shape[1])]
    assert state.step == prev.shape[1]
    for t, logits in enumerate(steps):
        assert logits.dtype == torch.float32 and logits.shape == (3, VOCAB)
        torch.testing.assert_close(logits, full[:, t].float(), atol=1e-5, rtol=1e-5, msg=f"position {t}")


@pytest.mark.parametrize(("kind", "name"), _params())
def test_reordered_state_continues_like_the_full_forward_of_reordered_prefixes(kind, name, device):
    """Beam-style reordering: rows change places mid-decoding (within and across sentences)."""
    model = _perturbed(_config(kind, name, R)).to(device).eval()
    src, prev = (t.to(device) for t in _batch())
    order = torch.tensor([2, 2, 0], device=device)  # row 0 <- old row 2, row 1 <- old row 2, row 2 <- old row 0
    with torch.inference_mode():
        enc, state = model.encode(src), DecoderState()
        for t in range(3):
            model.decode_step(prev[:, t : t + 1], enc, state)
        state.reorder(order)
        enc = enc.index_select(order)
        new_prev = torch.cat([prev[order, :3], prev[:, 3:]], dim=1)  # reordered prefixes, fresh suffixes
        steps = [model.decode_step(new_prev[:, t : t + 1], enc, state) for t in range(3, new_prev.shape[1])]
        full = model(src[order], new_prev)
    for i, logits in enumerate(steps):
        torch.testing.assert_close(logits, full[:, 3 + i], atol=1e-5, rtol=1e-5, msg=f"position {3 + i}")


@pytest.mark.parametrize(("kind", "name"), _params())
def test_memory_shared_by_a_sentences_hypotheses_equals_a_copy_per_hypothesis(kind, name):
    """Beam search passes one memory row per sentence for its G hypotheses (and keeps the static
    caches at one row per sentence): the logits equal those with the memory copied to every row,
    before and after a reorder that drops a sentence (`DecoderState.reorder(order, sources=keep)`)."""
    G = 2
    model = _perturbed(_config(kind, name, R)).eval()
    src, _ = _batch()  # 3 sentences
    g = torch.Generator().manual_seed(5)
    prev = torch.randint(4, VOCAB, (3 * G, 6), generator=g)  # G different prefixes per sentence
    prev[:, 0] = BOS
    keep, order = torch.tensor([0, 2]), torch.tensor([1, 1, 4, 5])  # drop sentence 1; rows stay in-sentence
    with torch.inference_mode():
        shared_enc = model.encode(src)  # [3, S, d]
        copied_enc = shared_enc.index_select(torch.arange(3).repeat_interleave(G))  # [3G, S, d]
        shared, copied = DecoderState(), DecoderState()
        for t in range(3):
            torch.testing.assert_close(model.decode_step(prev[:, t : t + 1], shared_enc, shared),
                                       model.decode_step(prev[:, t : t + 1], copied_enc, copied),
                                       atol=1e-5, rtol=1e-5, msg=f"position {t}")
        shared.reorder(order, sources=keep)
        copied.reorder(order)
        shared_enc, copied_enc = shared_enc.index_select(keep), copied_enc.index_select(order)
        for t in range(3, prev.shape[1]):
            tokens = prev[order, t : t + 1]
            torch.testing.assert_close(model.decode_step(tokens, shared_enc, shared),
                                       model.decode_step(tokens, copied_enc, copied),
                                       atol=1e-5, rtol=1e-5, msg=f"position {t} after the reorder")


@pytest.mark.parametrize(("kind", "name"), _params())
def test_eval_is_deterministic_and_independent_of_the_dropout_rates(kind, name, device):
    """Bit-equal on every device: the same kernels on the same inputs (deterministic algorithms, conftest.py)."""
    model = _perturbed(_config(kind, name, R)).to(device)
    no_randomness = build_model(_config(kind, name, 0.0)).to(device)
    no_randomness.load_state_dict(model.state_dict())
    src, prev = (t.to(device) for t in _batch())
    with torch.no_grad():
        out = model.eval()(src, prev)
        assert torch.equal(out, model(src, prev))
        assert torch.equal(out, no_randomness.eval()(src, prev)), "a dropout or noise rate acts in eval"
        model.train()
        assert not torch.allclose(model(src, prev), model(src, prev)), "training should be stochastic"


@pytest.mark.parametrize(("kind", "name"), _params())
def test_state_dict_round_trip_into_a_fresh_model(kind, name):
    cfg = _config(kind, name, R)
    model = _perturbed(cfg).eval()
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    fresh = build_model(cfg).eval()
    src, prev = _batch()
    with torch.no_grad():
        out = model(src, prev)
        assert not torch.allclose(fresh(src, prev), out), "a fresh model differs before loading"
        fresh.load_state_dict(torch.load(buffer, weights_only=True))
        assert torch.equal(fresh(src, prev), out)


# ---- one branch == the standard Transformer ---------------------------------------------------------


_MUTE_NORM = {"norm.weight": "self_attn_residual.norm.weight", "norm.bias": "self_attn_residual.norm.bias"}
_MUTE_UNIT = {"self_attn.in_weight": "self_attn.in_proj.weight", "self_attn.in_bias": "self_attn.in_proj.bias",
              "self_attn.out_weight": "self_attn.out_proj.weight", "ffn.norm_weight": "ffn_residual.norm.weight",
              "ffn.norm_bias": "ffn_residual.norm.bias", "ffn.fc1_weight": "ffn.fc1.weight",
              "ffn.fc1_bias": "ffn.fc1.bias", "ffn.fc2_weight": "ffn.fc2.weight"}  # [1, ...] -> [...]


def _mute_unit_to_transformer(state: dict) -> dict:
    """A one-unit MUTE encoder's weights under the standard pre-norm layer's names (unit axis dropped);
    out_bias, fc2_bias ([1, d] in both) and the relative-position tables keep their names."""
    out = {}
    for key, value in state.items():
        prefix, _, name = key.partition(".layers.")
        layer, _, name = name.partition(".")
        if prefix != "encoder" or not name:
            out[key] = value
        elif name == "unit_weights":
            assert torch.equal(value, torch.ones(1)), "a single unit has weight 1"
        elif name in _MUTE_NORM:
            out[f"encoder.layers.{layer}.{_MUTE_NORM[name]}"] = value
        else:
            out[f"encoder.layers.{layer}.{_MUTE_UNIT.get(name, name)}"] = value[0] if name in _MUTE_UNIT else value
    return out


# kind -> (the kind with one branch / unit as model overrides, the standard model's overrides, its weights
# under the standard names), or the reason the kind has no branch count
OneBranch = tuple[Callable[[float], dict], dict, Callable[[dict], dict]]
ONE_BRANCH: dict[str, OneBranch | str] = {
    "transformer": (lambda r: both_sides({"kind": "transformer", "attention_branches": 1, "ffn_branches": 1,
                                     "drop_branch": r}), {}, lambda state: state),
    "mute": (lambda r: _mute(units=1, bias_modules=["identity"], bias_switch=r),
             {"norm": "pre", "relative_positions": 4}, _mute_unit_to_transformer),
    "weighted": "its branches are the heads; kappa = alpha = 1 is tested in test_weighted.py",
    "muse": "no branch count (MUSE-simple == MUSE without its conv is tested in test_muse.py)",
}


@pytest.mark.parametrize("kind", sorted(LayerConfig._variants))
def test_one_branch_equals_the_standard_transformer(kind, device):
    if kind not in ONE_BRANCH:
        pytest.fail(f"layer kind {kind!r} has no entry in tests/models/test_layer_contract.py ONE_BRANCH")
    if isinstance(ONE_BRANCH[kind], str):
        return  # the kind has no branch count (the reason is in ONE_BRANCH)
    one_branch, standard_overrides, to_standard = ONE_BRANCH[kind]
    base = {"d_model": 32, "heads": 4, "ffn_dim": 48, "encoder_layers": 2, "decoder_layers": 2,
            "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB, **_rates(R)}
    one = build_model(from_dict(ModelConfig, {**base, **one_branch(R)}))
    with torch.no_grad():  # random weights, except a single MUTE unit's weight w = 1 (its init)
        for key, p in one.named_parameters():
            if not key.endswith("unit_weights"):
                p.add_(torch.randn_like(p) * 0.1)
    standard = build_model(from_dict(ModelConfig, {**base, **standard_overrides}))
    standard.load_state_dict(to_standard(one.state_dict()))
    one, standard = one.to(device), standard.to(device)
    src, prev = (t.to(device) for t in _batch())
    with torch.no_grad():
        torch.testing.assert_close(one.eval()(src, prev), standard.eval()(src, prev), atol=1e-5, rtol=1e-5)
