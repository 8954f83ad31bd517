"""HF Marian import: the imported model computes HF's logits (weights-only and with SentencePiece ids)."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

transformers = pytest.importorskip("transformers")
from transformers import MarianConfig, MarianMTModel, MarianTokenizer  # noqa: E402

from multibranch.checkpoint.format import CheckpointError, load_state_strict  # noqa: E402
from multibranch.cli import main  # noqa: E402
from multibranch.config import ConfigError  # noqa: E402
from multibranch.convert.hf_marian import FILLER_BIAS, import_marian  # noqa: E402
from multibranch.data.tokenizer import Tokenizer  # noqa: E402
from multibranch.experiment import ExperimentConfig  # noqa: E402
from multibranch.loading.checkpoint import load_model  # noqa: E402
from multibranch.models import build_model  # noqa: E402

WORDS = "a man woman dog runs sits on the red blue house street".split()
WORTE = "ein Mann Frau Hund läuft sitzt auf der rote blaue Haus Straße".split()


def hf_model(directory: Path, activation: str = "relu", logits_bias: bool = True, share: bool = True,
             tie: bool = True, vocab: int = 60, dec_vocab: int | None = None, pad: int | None = None,
             eos: int = 0, **extra) -> MarianMTModel:
    """A tiny random MarianMTModel (every weight random, biases and norms too) saved to `directory`."""
    pad = vocab - 1 if pad is None else pad
    config = MarianConfig(
        vocab_size=vocab, decoder_vocab_size=dec_vocab or vocab, d_model=24, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=2 if not share else 4, encoder_ffn_dim=40,
        decoder_ffn_dim=40, max_position_embeddings=64, pad_token_id=pad, eos_token_id=eos,
        decoder_start_token_id=pad, activation_function=activation, scale_embedding=True,
        share_encoder_decoder_embeddings=share, tie_word_embeddings=tie, dropout=0.1, **extra,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.add_(torch.randn_like(p) * 0.2)
        if logits_bias:
            model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
    model.save_pretrained(directory)
    return model.eval()


def ours(payload: dict) -> torch.nn.Module:
    net = build_model(ExperimentConfig.from_dict(payload["config"]).model)
    load_state_strict(net, payload["model"], "import")
    return net.eval()


@pytest.mark.parametrize(
    "activation,logits_bias,share,tie,expected",
    [
        ("relu", True, True, True, "all"),
        ("swish", False, True, True, "all"),
        ("relu", False, False, True, "decoder"),
        ("swish", True, True, False, "none"),
        ("gelu", True, False, False, "none"),
    ],
)
def test_weights_only_import_matches_hf_logits(tmp_path, activation, logits_bias, share, tie, expected):
    dec_vocab = None if share else 50
    hf = hf_model(tmp_path, activation, logits_bias, share, tie, dec_vocab=dec_vocab, pad=49 if not share else None)
    payload = import_marian(tmp_path)
    cfg = ExperimentConfig.from_dict(payload["config"]).model
    assert (cfg.share_embeddings, cfg.output_bias, cfg.activation) == (expected, logits_bias, activation.replace("silu", "swish"))
    assert payload["tokenizer"] is None and cfg.bos_id == cfg.pad_id == hf.config.pad_token_id
    net = ours(payload)

    g = torch.Generator().manual_seed(0)
    src = torch.randint(1, 45, (3, 9), generator=g)
    src[1, 6:] = hf.config.pad_token_id  # padding at the end of a source
    tgt = torch.randint(1, 45, (3, 7), generator=g)
    tgt[:, 0] = hf.config.decoder_start_token_id
    with torch.no_grad():
        reference = hf(input_ids=src, attention_mask=src.ne(hf.config.pad_token_id).long(), decoder_input_ids=tgt).logits
        torch.testing.assert_close(net(src, tgt), reference, atol=1e-5, rtol=1e-5)


def marian_spm(lines: list[str], size: int) -> bytes:
    """SentencePiece trained the way Marian does it: </s> = 0, <unk> = 1, no <s>, no <pad>."""
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buffer, vocab_size=size, eos_id=0, unk_id=1, bos_id=-1,
        pad_id=-1, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
    )
    return buffer.getvalue()


def marian_dir_with_tokenizer(directory: Path, joint: bool) -> tuple[MarianMTModel, list[str], list[str]]:
    rng = random.Random(0)
    en = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) for _ in range(300)]
    de = [" ".join(rng.choice(WORTE) for _ in range(rng.randint(3, 8))) for _ in range(300)]
    src_spm = marian_spm(en + de, 60)  # bigger than the target's: the target side gets gap rows
    tgt_spm = src_spm if joint else marian_spm(de, 50)
    pieces = []
    for proto in (src_spm, tgt_spm):
        sp = spm.SentencePieceProcessor(model_proto=proto)
        pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.id_to_piece(i) not in pieces]
    rng.shuffle(pieces)  # HF ids are NOT SentencePiece ids
    vocab = {p: i for i, p in enumerate(pieces)}
    vocab["<pad>"] = len(vocab)
    hf = hf_model(directory, "swish", True, vocab=len(vocab), pad=vocab["<pad>"], eos=vocab["</s>"])
    (directory / "source.spm").write_bytes(src_spm)
    (directory / "target.spm").write_bytes(tgt_spm)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    return hf, en[:4], de[:4]


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
@pytest.mark.parametrize("joint", [True, False])
def test_import_with_marian_tokenizer_translates_spm_ids(tmp_path, joint):
    hf, en, de = marian_dir_with_tokenizer(tmp_path, joint)
    payload = import_marian(tmp_path)
    cfg = ExperimentConfig.from_dict(payload["config"]).model
    assert cfg.share_embeddings == ("all" if joint else "decoder")
    tok = Tokenizer.from_state(payload["tokenizer"])
    hf_src_of, hf_tgt_of = (payload["meta"]["conversion"]["hf_id_of"][k] for k in ("src", "tgt"))

    # 1. our SentencePiece ids name the same tokens as HF's tokenizer ids
    hf_tok = MarianTokenizer(str(tmp_path / "source.spm"), str(tmp_path / "target.spm"), str(tmp_path / "vocab.json"))
    src_ids = [ids + [cfg.eos_id] for ids in tok.encode_src(en)]
    tgt_ids = [ids + [cfg.eos_id] for ids in tok.encode_tgt(de)]
    assert [hf_src_of[torch.tensor(ids)].tolist() for ids in src_ids] == hf_tok(en)["input_ids"]
    assert [hf_tgt_of[torch.tensor(ids)].tolist() for ids in tgt_ids] == hf_tok(text_target=de)["input_ids"]
    assert hf_tgt_of[cfg.pad_id] == hf.config.pad_token_id and hf_tgt_of[cfg.bos_id] == hf.config.decoder_start_token_id

    # 2. same logits on the same sentences (ours on SentencePiece ids, HF on vocab.json ids)
    def batch(rows: list[list[int]], pad: int) -> torch.Tensor:
        out = torch.full((len(rows), max(map(len, rows))), pad)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r)
        return out

    src = batch(src_ids, cfg.pad_id)
    prev = batch([[cfg.bos_id] + ids[:-1] for ids in tgt_ids], cfg.pad_id)
    hf_src = batch(hf_tok(en)["input_ids"], hf.config.pad_token_id)
    hf_prev = hf_tgt_of[prev]
    with torch.no_grad():
        mine = ours(payload)(src, prev)  # [B, T, V_ours]
        theirs = hf(input_ids=hf_src, attention_mask=hf_src.ne(hf.config.pad_token_id).long(),
                    decoder_input_ids=hf_prev).logits  # [B, T, V_hf]
    real = payload["model"]["output_bias"] > FILLER_BIAS / 2  # target ids HF can produce
    keep = prev.ne(cfg.pad_id)  # compare non-pad decoder positions
    torch.testing.assert_close(mine[keep][:, real], theirs[keep][:, hf_tgt_of[real]], atol=1e-5, rtol=1e-5)
    assert (mine[keep][:, ~real] < FILLER_BIAS / 2).all()  # fillers are never generated
    if not joint:
        assert (~real).any()  # the smaller target SentencePiece leaves gap rows


def test_rejects_unsupported_configs(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        import_marian(tmp_path / "missing")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: corrupted, not valid JSON"):
        import_marian(tmp_path / "broken")
    hf_model(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    for key, value, message in [
        ("normalize_before", True, "pre-norm"),
        ("add_final_layer_norm", True, "final layer norm"),
        ("static_position_embeddings", False, "learned position"),
        ("model_type", "bart", "only 'marian'"),
        ("activation_function", "gelu_new", "not supported"),
        ("decoder_ffn_dim", 48, "one model-wide ffn_dim"),
    ]:
        (tmp_path / "config.json").write_text(json.dumps({**raw, key: value}))
        with pytest.raises(ConfigError, match=message):
            import_marian(tmp_path)


def test_cli_from_hf(tmp_path, capsys):
    model_dir, out = tmp_path / "hf", tmp_path / "marian.pt"
    hf = hf_model(model_dir)
    generation = json.loads((model_dir / "generation_config.json").read_text())
    (model_dir / "generation_config.json").write_text(json.dumps({**generation, "num_beams": 4, "length_penalty": 0.6}))
    assert main(["convert", "from-hf", "--model-dir", str(model_dir), "--out", str(out)]) == 0
    loaded = load_model(out)
    assert (loaded.config.decode.beam, loaded.config.decode.length_penalty) == (4, 0.6)
    src = torch.tensor([[5, 6, 7, 0]])
    tgt = torch.tensor([[59, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(src, tgt), hf(input_ids=src, decoder_input_ids=tgt).logits,
                                   atol=1e-5, rtol=1e-5)
    assert main(["convert", "from-hf", "--model-dir", str(model_dir), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
