"""Decoding precisions (`--precision fp32|int8|bf16|fp16`): each packed linear against an independent
reference (F.linear in float64 on the same values, a hand-derived int8 error bound), the packed copy of
every layer kind against its model, the half-precision copy CUDA decodes with (on every device this machine
has), and the plumbing (Translator, CLI, serve engine)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from multibranch import device as device_module
from multibranch.config import ConfigError
from multibranch.device import native_cpu_int8
from multibranch.inference import precision as precision_module
from multibranch.inference.precision import (
    HALF_DTYPES,
    cast_for_decoding,
    check_precision,
    for_decoding,
)
from multibranch.modules import packed_linear
from multibranch.modules.packed_linear import (
    ONEDNN_INT8_MIN_OUT,
    Int8Linear,
    OneDnnInt8Linear,
    OneDnnLinear,
    bf16_supported,
    int8_rows,
    int8_supported,
    onednn_int8_supported,
    onednn_supported,
    pack_linear,
)
from multibranch.modules.state import DecoderState
from tests.helpers.layer_kinds import both_sides
from tests.helpers.models import noisy_model

pytestmark = pytest.mark.usefixtures("one_thread")
needs_int8 = pytest.mark.skipif(not int8_supported(), reason="this PyTorch build has no fbgemm (x86) kernels")
needs_onednn = pytest.mark.skipif(not onednn_supported(), reason="this PyTorch build cannot prepack for oneDNN")
needs_onednn_int8 = pytest.mark.skipif(not onednn_int8_supported(), reason="this PyTorch build has no oneDNN int8 linear")
needs_bf16 = pytest.mark.skipif(not bf16_supported(), reason="this CPU has no native bf16 matmuls (AVX512-BF16/AMX)")
SUPPORTED = {"fp32": needs_onednn, "int8": needs_int8, "bf16": needs_bf16}
PACKINGS = tuple(SUPPORTED)  # the CPU's packed precisions (fp16 is CUDA's alone)

VOCAB, BOS = 40, 2


@needs_onednn
@pytest.mark.parametrize("relu", [False, True])
def test_onednn_fp32_linear_equals_f_linear_up_to_summation_order(relu):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(300, 64, generator=g), torch.randn(300, generator=g)
    x = torch.randn(2, 7, 64, generator=g)  # any leading dims
    exact = F.linear(x.double(), w.double(), b.double())
    exact = exact.relu() if relu else exact
    got = OneDnnLinear(w, b, relu=relu)(x)
    assert got.dtype == torch.float32 and got.shape == (2, 7, 300)
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)  # fp32 rounding of 64-term sums
    assert (got.min() >= 0) if relu else (got.min() < 0)
    torch.testing.assert_close(OneDnnLinear(w)(x[0].t().contiguous().t()), F.linear(x[0], w), rtol=1e-5, atol=1e-5)
    assert OneDnnLinear(w, b)(x[:, :0]).shape == (2, 0, 300)  # an empty batch


@needs_bf16
def test_bf16_linear_is_the_exact_product_of_bf16_rounded_values():
    """bf16 inputs and weights, fp32 sums: equal to float64 arithmetic on the bf16-rounded values (up to fp32
    rounding of the sum and the bf16 rounding of the bias), and visibly different from fp32."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(300, 64, generator=g), torch.randn(300, generator=g)
    x = torch.randn(5, 64, generator=g)
    rounded = F.linear(x.bfloat16().double(), w.bfloat16().double(), b.bfloat16().double())
    got = pack_linear(w, b, "bf16")(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), rounded, rtol=1e-2, atol=2e-2)  # bf16 output rounding at most
    assert (got.double() - F.linear(x, w, b).double()).abs().max() > 1e-3  # it really is bf16


# kernel -> (its class, the input levels): fbgemm quantizes inputs to 7 bits; oneDNN to 8 bits where the CPU sums
# u8 x s8 products in 32 bits, else to 7 (on AVX2 two products are added into 16 bits with saturation)
INT8_KERNELS = {
    "fbgemm": pytest.param(Int8Linear, 127, marks=needs_int8, id="fbgemm"),
    "onednn": pytest.param(OneDnnInt8Linear, 255 if native_cpu_int8() else 127, marks=needs_onednn_int8, id="onednn"),
}


@pytest.mark.parametrize(("kernel", "levels"), INT8_KERNELS.values())
@pytest.mark.parametrize("relu", [False, True])
def test_int8_linear_error_stays_within_the_quantization_bound(kernel, levels, relu):
    """Weights: symmetric per row, step s_w[j] = max|W_j| / 127; inputs: affine over their range
    (0 included) with `levels` steps, s_x = (max(x, 0) - min(x, 0)) / levels. Rounding moves each by at
    most half a step, so |y_j - y*_j| <= sum_i (|x_i| s_w[j] + |W_ji| s_x + s_w[j] s_x / 2) / 2 (ReLU
    shrinks no error)."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(24, 40, generator=g), torch.randn(24, generator=g)
    x = torch.randn(7, 40, generator=g) * 3
    exact = F.linear(x, w, b)
    exact = exact.relu() if relu else exact
    got = kernel(w, b, relu=relu)(x)
    s_w = w.abs().amax(dim=1) / 127  # [out]
    s_x = (x.max().clamp(min=0) - x.min().clamp(max=0)) / levels
    bound = (x.abs().sum(1, keepdim=True) * s_w + w.abs().sum(1) * s_x + 40 * s_w * s_x / 2) / 2  # [7, out]
    err = (got - exact).abs()
    assert (err <= bound * 1.01 + 1e-5).all(), (err / bound).max()
    assert err.max() > 0  # it really is quantized (a test of fp32 against itself could not fail)
    assert kernel(w)(x).shape == (7, 24)
    torch.testing.assert_close(kernel(w, b, relu=relu)(x[None]), got[None])  # any leading dims
    assert kernel(w, b)(x[:0]).shape == (0, 24)  # an empty batch
    qweight, scale = kernel(w, b).int8_weight()  # what the kernel multiplies with is int8_rows' quantization
    expected_q, expected_scale = int8_rows(w)
    assert torch.equal(qweight, expected_q) and torch.allclose(scale, expected_scale)


@pytest.mark.parametrize(("kernel", "levels"), INT8_KERNELS.values())
def test_int8_linear_adds_the_largest_products_without_saturating(kernel, levels):
    """Inputs of ones through weights of ones are quantized without rounding (the top input level, weight 127)
    and sum to exactly the input width: the largest products there are. A kernel adding pairs of them into 16 bits
    with saturation (vpmaddubsw on CPUs without VNNI: 2 x 255 x 127 > 2^15 - 1) returns about half."""
    x, w, b = torch.ones(3, 64), torch.ones(5, 64), torch.arange(5.0)
    torch.testing.assert_close(kernel(w, b)(x), 64 + b.expand(3, 5), rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize(("flags", "native"), [({"avx2"}, False), ({"avx2", "avx512f", "avx512bw"}, False),
                                               ({"avx2", "avx_vnni"}, False), ({"avx512f", "avx512_vnni"}, True),
                                               ({"avx512f", "amx_tile", "amx_int8"}, True), (set(), False)])
def test_native_int8_is_vnni_or_amx_and_sets_the_onednn_input_levels(monkeypatch, flags, native):
    monkeypatch.setattr(device_module, "cpu_flags", lambda: frozenset(flags))
    assert device_module.native_cpu_int8() is native
    monkeypatch.setattr(packed_linear, "native_cpu_int8", device_module.native_cpu_int8)
    if onednn_int8_supported():
        assert OneDnnInt8Linear(torch.ones(2, 4)).input_levels == (255 if native else 127)


@needs_int8
def test_int8_packing_picks_onednn_for_wide_projections_only():
    g = torch.Generator().manual_seed(0)
    narrow = pack_linear(torch.randn(ONEDNN_INT8_MIN_OUT - 1, 8, generator=g), None, "int8")
    wide = pack_linear(torch.randn(ONEDNN_INT8_MIN_OUT, 8, generator=g), None, "int8")
    assert isinstance(narrow, Int8Linear)
    assert isinstance(wide, OneDnnInt8Linear if onednn_int8_supported() else Int8Linear)


def _model(**overrides) -> torch.nn.Module:
    return noisy_model(VOCAB, 0.1, 3, **{"d_model": 32, "heads": 4, "ffn_dim": 64, **overrides})


KINDS = {
    "standard": {},
    "mat-mean-sq": both_sides({"kind": "transformer", "attention_branches": 2, "ffn_branches": 3, "branch_merge": "mean_sq"}),
    "weighted": both_sides({"kind": "weighted"}),
    "mute": {"norm": "pre", "relative_positions": 4, "encoder": {"kind": "mute"}, "decoder": {"kind": "transformer"}},
    "muse": both_sides({"kind": "muse"}),
    "muse-simple": both_sides({"kind": "muse", "conv": False}),
    # a vocabulary wide enough for int8's oneDNN output layer (ONEDNN_INT8_MIN_OUT)
    "standard-wide-vocab": {"src_vocab_size": ONEDNN_INT8_MIN_OUT, "tgt_vocab_size": ONEDNN_INT8_MIN_OUT},
}


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (3, 8), generator=g)
    src[1, 5:] = 0
    prev = torch.randint(4, VOCAB, (3, 6), generator=g)
    prev[:, 0] = BOS
    return src, prev


# how far each packed copy may be from the model, relative to the spread of its logits: fp32 differs only by
# summation order; bf16 rounds inputs and weights to 8 bits of mantissa; int8 quantizes them (errors of a
# few percent of the spread). A wrong fold (merge constant, branch biases) would be off by the spread itself.
TOLERANCE = {"fp32": (1e-5, 1e-4), "bf16": (0.02, 0.1), "int8": (0.05, 0.3)}  # (mean, max) / spread


@pytest.mark.parametrize("precision", [pytest.param(p, marks=SUPPORTED[p]) for p in PACKINGS])
@pytest.mark.parametrize("name", list(KINDS))
def test_packed_copy_of_every_kind_is_close_to_the_model_in_full_and_step_by_step(name, precision):
    model = _model(**KINDS[name])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    packed = for_decoding(model, precision)
    assert packed is not model
    src, prev = _inputs()
    with torch.inference_mode():
        reference = model(src, prev)  # [B, T, V]
        full = packed(src, prev)
        enc, state = packed.encode(src), DecoderState()
        steps = torch.stack([packed.decode_step(prev[:, t : t + 1], enc, state) for t in range(prev.shape[1])], 1)
    # int8 quantizes inputs per call over the whole tensor, so a step (and a sentence) is not bit-equal to the
    # full forward (or to other batchings): both are held to the same distance from the model.
    spread = reference.std()
    mean_bound, max_bound = TOLERANCE[precision]
    for approx in (full, steps):
        err = (approx - reference).abs()
        assert err.mean() < mean_bound * spread and err.max() < max_bound * spread, (err.mean() / spread,
                                                                                      err.max() / spread)
        assert precision == "fp32" or err.mean() > 0  # int8 and bf16 really round
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is untouched
    assert all(getattr(m, "packed", None) is None for m in model.modules())


@pytest.mark.parametrize("precision", [pytest.param(p, marks=SUPPORTED[p]) for p in PACKINGS])
def test_training_mode_ignores_the_packed_weights(precision):
    model = _model()
    packed = for_decoding(model, precision).train()  # dropout 0: a deterministic training forward
    src, prev = _inputs()
    with torch.no_grad():
        assert torch.equal(packed(src, prev), model.train()(src, prev))


@pytest.mark.parametrize("precision", [pytest.param(p, marks=SUPPORTED[p]) for p in PACKINGS])
def test_the_copy_decodes_with_its_packed_weights_not_the_originals(precision):
    """Zeroing the copy's own projection weights after packing changes nothing in eval mode: every projection
    the search runs (attention, FFN, output layer) reads the packed weights."""
    model = _model(**KINDS["mat-mean-sq"])
    packed = for_decoding(model, precision)
    src, prev = _inputs()
    with torch.inference_mode():
        before = packed(src, prev)
        for name, param in packed.named_parameters():
            if name.endswith(("in_proj.weight", "out_proj.weight", "fc1.weight", "fc2.weight", "output_weight")):
                param.zero_()
        torch.testing.assert_close(packed(src, prev), before, rtol=0, atol=0)
        assert not torch.equal(packed.train()(src, prev), before)  # the training forward does use them


@pytest.mark.parametrize("precision", [pytest.param(p, marks=SUPPORTED[p]) for p in PACKINGS])
def test_packing_in_place_is_the_packed_copy_without_the_copy(precision):
    src, prev = _inputs()
    model = _model()
    with torch.inference_mode():
        expected = for_decoding(model, precision)(src, prev)
        packed = for_decoding(model, precision, in_place=True)
        assert packed is model and model.packed_output is not None and not model.training
        assert torch.equal(packed(src, prev), expected)


def test_fp32_without_onednn_is_the_model_itself(monkeypatch):
    monkeypatch.setattr(precision_module, "onednn_supported", lambda: False)
    model = _model()
    assert for_decoding(model, "fp32") is model


def test_unknown_precision_and_each_precision_off_its_devices_are_config_errors(monkeypatch):
    with pytest.raises(ConfigError, match="not one of"):
        check_precision("fp8", torch.device("cpu"))
    for precision in ("int8", "bf16", "fp16"):
        with pytest.raises(ConfigError, match="CPU or CUDA only"):
            check_precision(precision, torch.device("meta"))
    check_precision("fp32", torch.device("meta"))
    with pytest.raises(ConfigError, match="fp16 runs on CUDA only"):
        check_precision("fp16", torch.device("cpu"))
    with pytest.raises(ConfigError, match="int8 runs on the CPU only"):
        check_precision("int8", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100")
    with pytest.raises(ConfigError, match="V100 has no bf16 support; use fp16"):
        check_precision("bf16", torch.device("cuda"))
    check_precision("fp16", torch.device("cuda"))
    monkeypatch.setattr(precision_module, "bf16_supported", lambda: False)
    with pytest.raises(ConfigError, match="native bf16"):
        check_precision("bf16", torch.device("cpu"))


# the whole model in half precision (layer norms, softmax inputs and the residual stream too) is further
# from fp32 than packed bf16 linears with fp32 sums; a wrong cast (a buffer left in fp32, a mask of the wrong
# type) fails outright or is off by the spread itself
HALF_TOLERANCE = {"bf16": (0.05, 0.4), "fp16": (0.01, 0.1)}  # (mean, max) / spread of the fp32 logits


@pytest.mark.parametrize("precision", list(HALF_DTYPES))
@pytest.mark.parametrize("name", list(KINDS))
def test_half_precision_copy_of_every_kind_is_close_to_the_model_in_full_and_step_by_step(name, precision, device):
    """What bf16/fp16 decode with on CUDA (cast_for_decoding), on each device here: every layer kind runs
    in half precision, full forward and step by step, near the fp32 model; the model itself is untouched."""
    model = _model(**KINDS[name]).to(device)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    half = cast_for_decoding(model, HALF_DTYPES[precision])
    assert half is not model and {p.dtype for p in half.parameters()} == {HALF_DTYPES[precision]}
    src, prev = (t.to(device) for t in _inputs())
    with torch.inference_mode():
        reference = model(src, prev)  # [B, T, V]
        full = half(src, prev).float()
        enc, state = half.encode(src), DecoderState()
        steps = torch.stack([half.decode_step(prev[:, t : t + 1], enc, state) for t in range(prev.shape[1])], 1)
    assert steps.dtype == torch.float32  # the search's log-probabilities are computed in fp32
    spread = reference.std()
    mean_bound, max_bound = HALF_TOLERANCE[precision]
    for approx in (full, steps):
        err = (approx - reference).abs()
        assert 0 < err.mean() < mean_bound * spread and err.max() < max_bound * spread, (err.mean() / spread,
                                                                                         err.max() / spread)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: bf16/fp16 for_decoding casts on CUDA only")
@pytest.mark.parametrize("precision", list(HALF_DTYPES))
def test_for_decoding_on_cuda_casts_the_model_to_half_precision(precision):
    model = _model().cuda()
    half = for_decoding(model, precision)
    assert half is not model and next(half.parameters()).dtype == HALF_DTYPES[precision]
    assert next(model.parameters()).dtype == torch.float32
    in_place = for_decoding(model, precision, in_place=True)
    assert in_place is model and next(model.parameters()).dtype == HALF_DTYPES[precision]


@pytest.mark.parametrize("precision", [pytest.param(p, marks=SUPPORTED[p]) for p in ("int8", "bf16")])
def test_translate_and_serve_engine_decode_in_int8_and_bf16(tmp_path, capsys, precision):
    """`translate --precision P` and the serve engine run the packed copy; every line is answered."""
    import io
    import random

    import sentencepiece as spm

    from multibranch.checkpoint.format import save_checkpoint
    from multibranch.cli import main
    from multibranch.data.tokenizer import Tokenizer
    from multibranch.experiment import ExperimentConfig
    from multibranch.serve.engine import TorchEngine
    from tests.helpers.translation import translator_of

    rng = random.Random(0)
    words = ["".join(rng.choice(["ka", "lo", "mi", "ne", "su", "ta"]) for _ in range(rng.randint(1, 3)))
             for _ in range(30)]
    corpus = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) for _ in range(200)]
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=buffer, vocab_size=VOCAB,
                                   model_type="unigram", pad_id=0, unk_id=1, bos_id=2, eos_id=3,
                                   character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    tokenizer = Tokenizer(buffer.getvalue(), buffer.getvalue())
    model = _model()
    config = ExperimentConfig(model=model.config)
    config.decode.beam, config.decode.max_len_b = 2, 4
    ckpt = tmp_path / "m.pt"
    save_checkpoint(ckpt, {"config": config.to_dict(), "model": model.state_dict(),
                           "tokenizer": tokenizer.to_state(), "meta": {}})
    lines = corpus[:5]
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["translate", "--ckpt", str(ckpt), "-i", str(src), "-o", str(out), "--precision", precision,
                 "--device", "cpu", "--no-progress"]) == 0
    translations = out.read_text(encoding="utf-8").splitlines()
    assert len(translations) == 5
    assert translator_of(str(ckpt), precision=precision).translate(lines) == translations
    engine = TorchEngine.from_checkpoint(str(ckpt), "cpu", precision=precision)
    assert engine.info()["precision"] == precision
    assert [h[0][0] for h in engine.translate(lines, beam=2, nbest=1)] == translations
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["translate", "--ckpt", str(ckpt), "-i", str(src), "-o", str(tmp_path / "x.txt"), "--precision", "int4"])
    assert "invalid choice" in capsys.readouterr().err
