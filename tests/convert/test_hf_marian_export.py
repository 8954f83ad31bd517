"""`multibranch convert to-hf`: the written folder is a MarianMTModel that `transformers` loads with
`from_pretrained` and whose logits equal ours; its MarianTokenizer gives our ids; `convert from-hf` of it
gives the original model back; models Marian cannot represent are refused in one line."""

from __future__ import annotations

import io

import pytest
import sentencepiece as spm
import torch

transformers = pytest.importorskip("transformers")
from transformers import MarianMTModel, MarianTokenizer  # noqa: E402

from multibranch.checkpoint.format import load_state_strict, save_checkpoint  # noqa: E402
from multibranch.cli import main  # noqa: E402
from multibranch.convert.hf_marian import import_marian  # noqa: E402
from multibranch.convert.hf_marian_export import export_marian  # noqa: E402
from multibranch.data.tokenizer import Tokenizer  # noqa: E402
from multibranch.data.vocabulary import word_model  # noqa: E402
from multibranch.experiment import ExperimentConfig  # noqa: E402
from multibranch.models import build_model  # noqa: E402
from tests.helpers.configs import tiny_model_dict  # noqa: E402
from tests.helpers.translation import corpus_lines  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


def random_payload(tok: Tokenizer, **model) -> dict:
    """A random model over the tokenizer's vocabularies, every parameter perturbed (biases and norms too)."""
    overrides = {"src_vocab_size": tok.src_vocab_size, "tgt_vocab_size": tok.tgt_vocab_size, "output_bias": True,
                 "max_positions": 64, **model}
    cfg = ExperimentConfig.from_dict({"model": tiny_model_dict(**overrides)})
    torch.manual_seed(3)
    net = build_model(cfg.model)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return {"config": cfg.to_dict(), "model": net.state_dict(), "tokenizer": tok.to_state(), "meta": {}}


def ours(payload: dict) -> torch.nn.Module:
    net = build_model(ExperimentConfig.from_dict(payload["config"]).model)
    load_state_strict(net, payload["model"], "payload")
    return net.eval()


def assert_same_logits(payload: dict, directory, tok: Tokenizer) -> None:
    """Logits of a padded batch of real sentences (source and target of different lengths), ours vs HF's."""
    cfg = ExperimentConfig.from_dict(payload["config"]).model
    hf = MarianMTModel.from_pretrained(str(directory)).eval()
    lines = corpus_lines(4, seed=9)
    sources = [ids + [cfg.eos_id] for ids in tok.encode_src(lines)]
    targets = [[cfg.bos_id, *ids] for ids in tok.encode_tgt(lines[::-1])]
    src = torch.full((4, max(map(len, sources))), cfg.pad_id)
    prev = torch.full((4, max(map(len, targets))), cfg.pad_id)
    for row, (s, t) in enumerate(zip(sources, targets, strict=True)):
        src[row, : len(s)], prev[row, : len(t)] = torch.tensor(s), torch.tensor(t)
    with torch.no_grad():
        expected = ours(payload)(src, prev)  # [B, T, V]
        got = hf(input_ids=src, attention_mask=src.ne(cfg.pad_id), decoder_input_ids=prev).logits
    assert got.shape == expected.shape
    real = prev.ne(cfg.pad_id)  # padded target positions are not compared
    assert torch.allclose(got[real], expected[real], atol=1e-4, rtol=0), (got[real] - expected[real]).abs().max()


def _spm(seed: int, size: int) -> bytes:
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines(300, seed=seed)), model_writer=buffer, vocab_size=size,
        model_type="unigram", pad_id=0, unk_id=1, bos_id=2, eos_id=3, character_coverage=1.0,
        hard_vocab_limit=False, minloglevel=2)
    return buffer.getvalue()


CONFIGS = {
    "shared_all_relu": {"share_embeddings": "all"},
    "tied_decoder_gelu_no_bias": {"share_embeddings": "decoder", "activation": "gelu", "output_bias": False},
    "untied_swish_unscaled_decoder_heads": {"share_embeddings": "none", "activation": "swish",
                                            "scale_embedding": False, "decoder": {"kind": "transformer", "heads": 2}},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_and_from_hf_gives_the_model_back(name, tokenizer, tmp_path):
    payload = random_payload(tokenizer, **CONFIGS[name])
    directory = export_marian(payload, tmp_path / "hf")
    assert_same_logits(payload, directory, tokenizer)

    back = import_marian(directory)
    original = ExperimentConfig.from_dict(payload["config"]).model
    imported = ExperimentConfig.from_dict(back["config"]).model
    assert imported == original
    assert back["model"].keys() == payload["model"].keys()
    assert all(torch.equal(back["model"][k], v) for k, v in payload["model"].items())
    assert Tokenizer.from_state(back["tokenizer"]).src_proto == tokenizer.src_proto


def test_marian_tokenizer_gives_our_ids(tokenizer, tmp_path):
    directory = export_marian(random_payload(tokenizer), tmp_path / "hf")
    hf_tok = MarianTokenizer.from_pretrained(str(directory))
    lines = corpus_lines(8, seed=4)
    assert hf_tok(lines)["input_ids"] == [ids + [3] for ids in tokenizer.encode_src(lines)]
    ids = tokenizer.encode_tgt(lines)
    assert hf_tok.batch_decode(ids, skip_special_tokens=True) == tokenizer.decode_tgt(ids)


def test_separate_vocabularies(tmp_path):
    tok = Tokenizer(_spm(1, 48), _spm(2, 40))
    assert not tok.joint and tok.src_vocab_size != tok.tgt_vocab_size
    payload = random_payload(tok, share_embeddings="none")
    directory = export_marian(payload, tmp_path / "hf")
    assert_same_logits(payload, directory, tok)
    hf_tok = MarianTokenizer.from_pretrained(str(directory))
    lines = corpus_lines(4, seed=5)
    assert hf_tok(lines)["input_ids"] == [ids + [3] for ids in tok.encode_src(lines)]
    assert hf_tok(text_target=lines)["input_ids"] == [ids + [3] for ids in tok.encode_tgt(lines)]


def test_pretokenized_bpe_decodes_as_our_translate(tmp_path):
    from transformers import AutoTokenizer

    words = ["Sch@@", "utz@@", "helmen", "tragen", "die", "Arbei@@", "ter", "@@@", "-@@", "@"]
    proto = word_model(words)
    tok = Tokenizer(proto, proto)
    directory = export_marian(random_payload(tok), tmp_path / "hf")
    hf_tok = AutoTokenizer.from_pretrained(str(directory))
    ids = [[4 + words.index(w) for w in line.split()] for line in
           ("die Arbei@@ ter tragen Sch@@ utz@@ helmen", "Sch@@ utz@@ helmen", "die @@@ -@@ @ Arbei@@ ter")]
    ours = tok.decode_tgt(ids)
    assert ours[1] == "Schutzhelmen"
    assert hf_tok.batch_decode([line + [3] for line in ids], skip_special_tokens=True) == ours
    assert hf_tok(["die Arbei@@ ter"])["input_ids"] == [tok.encode_src(["die Arbei@@ ter"])[0] + [3]]


def test_mat_with_ffn_branches_is_folded(tokenizer, tmp_path):
    layer = {"kind": "transformer", "ffn_branches": 3, "branch_merge": "mean_sq"}
    payload = random_payload(tokenizer, encoder=layer, decoder={**layer, "ffn_branches": 2})
    directory = export_marian(payload, tmp_path / "hf")
    config = MarianMTModel.config_class.from_pretrained(str(directory))
    assert (config.encoder_ffn_dim, config.decoder_ffn_dim) == (3 * 64, 2 * 64)
    assert_same_logits(payload, directory, tokenizer)


# ---- the command --------------------------------------------------------------------------------


def test_cli_writes_and_refuses_a_non_empty_folder(tokenizer, tmp_path, capsys):
    ckpt = tmp_path / "m.pt"
    save_checkpoint(ckpt, random_payload(tokenizer))
    out = tmp_path / "hf"
    assert main(["convert", "to-hf", "--ckpt", str(ckpt), "--out", str(out)]) == 0
    assert {"config.json", "model.safetensors", "generation_config.json", "source.spm", "target.spm", "vocab.json",
            "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    capsys.readouterr()
    assert main(["convert", "to-hf", "--ckpt", str(ckpt), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--force" in err
    assert main(["convert", "to-hf", "--ckpt", str(ckpt), "--out", str(out), "--force"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "m.pt"]  # no temporary left behind


REFUSALS = {
    "muse": ({"encoder": {"kind": "muse"}, "decoder": {"kind": "muse"}}, "dynamic convolution"),
    "mute": ({"encoder": {"kind": "mute"}, "norm": "pre"}, "MUTE"),
    "weighted": ({"encoder": {"kind": "weighted"}, "decoder": {"kind": "weighted"}}, "kappa/alpha"),
    "mat": ({"encoder": {"kind": "transformer", "attention_branches": 2}}, "attention branches"),
    "pre_norm": ({"norm": "pre"}, "pre-norm"),
    "learned_positions": ({"positions": "learned"}, "sinusoidal"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_cli_refuses_what_marian_cannot_represent(name, tokenizer, tmp_path, capsys):
    model, reason = REFUSALS[name]
    cfg = ExperimentConfig.from_dict({"model": tiny_model_dict(src_vocab_size=tokenizer.src_vocab_size,
                                                               tgt_vocab_size=tokenizer.tgt_vocab_size, **model)})
    ckpt = tmp_path / "m.pt"
    save_checkpoint(ckpt, {"config": cfg.to_dict(), "model": build_model(cfg.model).state_dict(),
                           "tokenizer": tokenizer.to_state(), "meta": {}})
    out = tmp_path / "hf"
    assert main(["convert", "to-hf", "--ckpt", str(ckpt), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and reason in err and "Hugging Face Marian" in err, err
    assert not out.exists()


def test_hf_greedy_generate_equals_our_greedy_search(tokenizer, tmp_path):
    """`generate` with the written generation config (greedy, forced EOS at the last step) gives our
    beam-1 translations token for token: our search stops at floor(a * (n + 1) + b) tokens and forces
    EOS, HF's forced_eos_token_id does the same with max_new_tokens = that limit + 1. Two EOS biases:
    one where every line runs to the limit, one where some end on their own."""
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.inference.search import search

    lines = corpus_lines(20, seed=13)
    decode = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=5, min_len=0)
    natural = 0
    for eos_bias in (0.0, 4.5):
        payload = random_payload(tokenizer)
        payload["model"]["output_bias"][3] += eos_bias
        net = ours(payload)
        directory = export_marian(payload, tmp_path / f"hf{eos_bias}")
        hf = MarianMTModel.from_pretrained(str(directory)).eval()
        hf_tok = MarianTokenizer.from_pretrained(str(directory))
        for line, ids in zip(lines, tokenizer.encode_src(lines), strict=True):
            limit = len(ids) + 1 + 5
            with torch.no_grad():
                tokens = search(net, torch.tensor([[*ids, 3]]), decode)[0][0].tokens
                generated = hf.generate(**hf_tok([line], return_tensors="pt"), num_beams=1, do_sample=False,
                                        max_new_tokens=limit + 1)[0].tolist()
            assert generated == [2, *tokens, 3], line  # decoder start <s>, our tokens, EOS
            natural += len(tokens) < limit
    assert natural >= 1, "no line ended before the limit: the natural end was not compared"
