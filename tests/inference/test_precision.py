"""int8 decoding (`--precision int8`): the int8 linear against a hand-derived error bound, the int8
copy of every layer kind against its fp32 model, and the plumbing (Translator, CLI, serve engine)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from multibranch.config import ConfigError, from_dict
from multibranch.inference.precision import check_precision, for_decoding
from multibranch.models import ModelConfig, build_model
from multibranch.modules.int8 import Int8Linear, int8_supported
from multibranch.modules.state import DecoderState

pytestmark = [pytest.mark.skipif(not int8_supported(), reason="this PyTorch build has no fbgemm (x86) kernels"),
              pytest.mark.usefixtures("one_thread")]

VOCAB, BOS = 40, 2



def test_int8_linear_error_stays_within_the_quantization_bound():
    """Weights: symmetric per row, step s_w[j] = max|W_j| / 127; inputs: affine over their range
    with 7 bits (reduce_range), step s_x = (max(x, 0) - min(x, 0)) / 127. Rounding moves each by at
    most half a step, so |y_j - y*_j| <= sum_i (|x_i| s_w[j] + |W_ji| s_x + s_w[j] s_x / 2) / 2."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(24, 40, generator=g), torch.randn(24, generator=g)
    x = torch.randn(7, 40, generator=g) * 3
    exact = F.linear(x, w, b)
    got = Int8Linear(w, b)(x)
    s_w = w.abs().amax(dim=1) / 127  # [out]
    s_x = (x.max().clamp(min=0) - x.min().clamp(max=0)) / 127
    bound = (x.abs().sum(1, keepdim=True) * s_w + w.abs().sum(1) * s_x + 40 * s_w * s_x / 2) / 2  # [7, out]
    err = (got - exact).abs()
    assert (err <= bound * 1.01 + 1e-5).all(), (err / bound).max()
    assert err.max() > 0  # it really is quantized (a test of fp32 against itself could not fail)
    assert Int8Linear(w)(x).shape == (7, 24)
    torch.testing.assert_close(Int8Linear(w, b)(x[None]), got[None])  # any leading dims


def _model(**overrides) -> torch.nn.Module:
    values = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0,
              "max_positions": 64, "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB, **overrides}
    torch.manual_seed(3)
    model = build_model(from_dict(ModelConfig, values))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _both(layer: dict) -> dict:
    return {"encoder": dict(layer), "decoder": dict(layer)}


KINDS = {
    "standard": {},
    "mat-mean-sq": _both({"kind": "transformer", "attention_branches": 2, "ffn_branches": 3, "branch_merge": "mean_sq"}),
    "weighted": _both({"kind": "weighted"}),
    "mute": {"norm": "pre", "relative_positions": 4, "encoder": {"kind": "mute"}, "decoder": {"kind": "transformer"}},
    "muse": _both({"kind": "muse"}),
    "muse-simple": _both({"kind": "muse", "conv": False}),
}


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (3, 8), generator=g)
    src[1, 5:] = 0
    prev = torch.randint(4, VOCAB, (3, 6), generator=g)
    prev[:, 0] = BOS
    return src, prev


@pytest.mark.parametrize("name", list(KINDS))
def test_int8_copy_of_every_kind_is_close_to_fp32_in_full_and_step_by_step(name):
    model = _model(**KINDS[name])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    quantized = for_decoding(model, "int8")
    assert quantized is not model
    src, prev = _inputs()
    with torch.inference_mode():
        reference = model(src, prev)  # [B, T, V]
        full = quantized(src, prev)
        enc, state = quantized.encode(src), DecoderState()
        steps = torch.stack([quantized.decode_step(prev[:, t : t + 1], enc, state) for t in range(prev.shape[1])], 1)
    # int8 is an approximation of fp32 (errors of a few percent of the logits' spread), not a copy of it;
    # a wrong fold (merge constant, branch biases) would be off by the size of the logits themselves
    # Inputs are quantized per call over the whole tensor, so a step (and a sentence) is not bit-equal
    # to the full forward (or to other batchings): both are held to the same distance from fp32.
    spread = reference.std()
    for approx in (full, steps):
        err = (approx - reference).abs()
        assert 0 < err.mean() < 0.05 * spread and err.max() < 0.3 * spread, (err.mean() / spread, err.max() / spread)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the fp32 model is untouched
    assert all(getattr(m, "int8", None) is None for m in model.modules())


def test_fp32_is_the_model_itself_and_training_mode_ignores_the_int8_weights():
    model = _model()
    assert for_decoding(model, "fp32") is model
    quantized = for_decoding(model, "int8").train()  # dropout 0: a deterministic training forward
    src, prev = _inputs()
    with torch.no_grad():
        assert torch.equal(quantized(src, prev), model.train()(src, prev))


def test_unknown_precision_and_int8_off_the_cpu_are_config_errors():
    with pytest.raises(ConfigError, match="not one of"):
        check_precision("fp8", torch.device("cpu"))
    with pytest.raises(ConfigError, match="CPU only"):
        check_precision("int8", torch.device("meta"))


def test_translate_and_serve_engine_decode_in_int8(tmp_path, capsys):
    """`translate --precision int8` and the serve engine run the int8 copy; every line is answered."""
    import io
    import random

    import sentencepiece as spm

    from multibranch.checkpoint.format import save_checkpoint
    from multibranch.cli import main
    from multibranch.data.tokenizer import Tokenizer
    from multibranch.experiment import ExperimentConfig
    from multibranch.serve.engine import TorchEngine
    from multibranch.tasks.translation.loading import load_translator

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
    assert main(["translate", "--ckpt", str(ckpt), "-i", str(src), "-o", str(out), "--precision", "int8",
                 "--device", "cpu", "--no-progress"]) == 0
    translations = out.read_text(encoding="utf-8").splitlines()
    assert len(translations) == 5
    assert load_translator(str(ckpt), precision="int8").translate(lines) == translations
    engine = TorchEngine.from_checkpoint(str(ckpt), "cpu", precision="int8")
    assert engine.info()["precision"] == "int8"
    assert [h[0][0] for h in engine.translate(lines, beam=2, nbest=1)] == translations
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["translate", "--ckpt", str(ckpt), "-i", str(src), "-o", str(tmp_path / "x.txt"), "--precision", "int4"])
    assert "invalid choice" in capsys.readouterr().err
