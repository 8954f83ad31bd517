"""HF BERT / RoBERTa import: the imported classifier computes HF's logits (eval mode), bad input is one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")
from multibranch.checkpoint.format import CheckpointError, load_state_strict  # noqa: E402
from multibranch.cli import main  # noqa: E402
from multibranch.config import ConfigError  # noqa: E402
from multibranch.convert.hf_bert import import_bert  # noqa: E402
from multibranch.experiment import ExperimentConfig  # noqa: E402
from multibranch.loading.checkpoint import load_model  # noqa: E402
from multibranch.tasks import build_task_model  # noqa: E402
from multibranch.tasks.classification.inference import classify_lines  # noqa: E402
from tests.helpers.hf_bert import bert_dir, padded_batches, roberta_dir, sentences  # noqa: E402

TEXTS = sentences(10, seed=3) + ["The CAT sat, far away!", "zebra quux"]  # upper case, punctuation, unknown words


def ours(payload: dict) -> torch.nn.Module:
    net = build_task_model(ExperimentConfig.from_dict(payload["config"]))
    load_state_strict(net, payload["model"], "import")
    return net.eval()


def assert_same_logits(hf, net, tok, texts=TEXTS, rows=None) -> None:
    """Padded batches of 4 (several lengths each): our logits == HF's within 1e-5."""
    for ids in padded_batches(tok, texts, 4):
        assert ids.eq(tok.pad_token_id).any() or len(ids) == 1  # really padded
        with torch.no_grad():
            expected = hf(input_ids=ids, attention_mask=ids.ne(tok.pad_token_id)).logits  # [B, C]
            got = net(ids)
        expected = expected if rows is None else expected[:, rows]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_bert_logits_equal_hf(tmp_path):
    hf, tok = bert_dir(tmp_path, num_labels=3)
    payload = import_bert(tmp_path)
    cfg = ExperimentConfig.from_dict(payload["config"])
    assert cfg.task == "classification" and cfg.classifier.labels == ["LABEL_0", "LABEL_1", "LABEL_2"]
    m = cfg.model
    assert (m.embedding_norm, m.norm_eps, m.scale_embedding, m.positions, m.activation) == (True, 1e-12, False,
                                                                                             "learned", "gelu")
    assert (m.pad_id, m.bos_id, m.eos_id) == (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id)
    assert_same_logits(hf, ours(payload), tok)


def test_roberta_logits_equal_hf(tmp_path):
    """RoBERTa: positions start at padding_idx + 1 = 2, pad id 1, <s>/</s>, its own classification head."""
    hf, tok = roberta_dir(tmp_path, num_labels=2)
    payload = import_bert(tmp_path)
    m = ExperimentConfig.from_dict(payload["config"]).model
    assert (m.pad_id, m.bos_id, m.eos_id, m.max_positions) == (1, 0, 2, 40 - 2)
    assert_same_logits(hf, ours(payload), tok)


def test_labels_reorder_the_hf_head(tmp_path):
    """--labels naming exactly the HF head's labels keeps the head with its rows in --labels order."""
    hf, tok = bert_dir(tmp_path, num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"},
                       label2id={"neg": 0, "neu": 1, "pos": 2})
    payload = import_bert(tmp_path, labels=["pos", "neg", "neu"])
    assert ExperimentConfig.from_dict(payload["config"]).classifier.labels == ["pos", "neg", "neu"]
    assert_same_logits(hf, ours(payload), tok, rows=[2, 0, 1])


def test_base_model_gets_a_new_head_on_the_hf_pooler(tmp_path):
    """A BertModel (no head): the pooler becomes our dense layer (tanh(dense(CLS)) == HF's pooler_output);
    without --labels/--num-labels the import is refused."""
    hf, tok = bert_dir(tmp_path, head=False)
    with pytest.raises(ConfigError, match="has no classification head"):
        import_bert(tmp_path)
    payload = import_bert(tmp_path, num_labels=4)
    net = ours(payload)
    assert net.out.out_features == 4
    (ids,) = padded_batches(tok, TEXTS[:4], 4)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=ids.ne(tok.pad_token_id)).pooler_output  # [B, d]
        got = torch.tanh(net.dense(net.encoder(ids).out[:, 0]))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # a new head is seeded: the same seed gives the same head, another seed another
    assert torch.equal(import_bert(tmp_path, num_labels=4)["model"]["out.weight"], payload["model"]["out.weight"])
    assert not torch.equal(import_bert(tmp_path, num_labels=4, seed=2)["model"]["out.weight"],
                           payload["model"]["out.weight"])


def test_cli_import_then_classify_raw_text_like_hf(tmp_path, capsys):
    """The checkpoint alone (stored HF tokenizer, CLS/SEP) labels raw text with HF's probabilities."""
    hf, tok = roberta_dir(tmp_path / "hf", num_labels=2)
    capsys.readouterr()  # save_pretrained's progress bar
    out = tmp_path / "roberta.pt"
    assert main(["convert", "from-hf-bert", "--model-dir", str(tmp_path / "hf"), "--out", str(out)]) == 0
    assert "HF roberta 2 layers" in capsys.readouterr().out  # summary line
    loaded = load_model(out, task="classification")
    probs = classify_lines(loaded.model, loaded.tokenizer, TEXTS, batch_size=3)
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = hf(**enc).logits.softmax(-1)
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=0)
    # an existing output is kept without --force
    assert main(["convert", "from-hf-bert", "--model-dir", str(tmp_path / "hf"), "--out", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err


def _one_error_line(capsys, argv: list[str], expected: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert expected in err, err


def test_bad_input_is_one_clear_line(tmp_path, capsys):
    good = tmp_path / "good"
    bert_dir(good)
    capsys.readouterr()  # save_pretrained's progress bar
    out = str(tmp_path / "out.pt")

    def convert(directory, *extra):
        return ["convert", "from-hf-bert", "--model-dir", str(directory), "--out", out, *extra]

    _one_error_line(capsys, convert(tmp_path / "nowhere"), "no such directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_error_line(capsys, convert(empty), "no config.json")

    def variant(name: str) -> object:
        d = tmp_path / name
        shutil.copytree(good, d)
        return d

    gpt = variant("gpt")
    (gpt / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    _one_error_line(capsys, convert(gpt), "model_type='gpt2'; `convert from-hf-bert` imports only BERT and RoBERTa")

    no_weights = variant("no_weights")
    (no_weights / "model.safetensors").unlink()
    _one_error_line(capsys, convert(no_weights), "no weights (model.safetensors")

    corrupt = variant("corrupt")
    (corrupt / "model.safetensors").write_bytes(b"not safetensors")
    _one_error_line(capsys, convert(corrupt), "cannot read the weights")

    deeper = variant("deeper")  # config.json says 3 layers, the weights have 2
    config = json.loads((deeper / "config.json").read_text())
    (deeper / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    _one_error_line(capsys, convert(deeper), "the weights have no 'encoder.layer.2.attention.self.query.weight'")

    wider = variant("wider")  # config.json says FFN 32, the weights have 24
    (wider / "config.json").write_text(json.dumps({**config, "intermediate_size": 32}))
    _one_error_line(capsys, convert(wider), "encoder.layer.0.intermediate.dense.weight has shape (24, 16) but "
                                            "config.json implies (32, 16)")

    no_tok = variant("no_tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tok / name).unlink()
    _one_error_line(capsys, convert(no_tok), "no Hugging Face tokenizer (tokenizer.json, vocab.txt, vocab.json)")

    bad_tok = variant("bad_tokenizer")
    (bad_tok / "tokenizer.json").write_text("{not json")
    _one_error_line(capsys, convert(bad_tok), "transformers cannot load its tokenizer")

    relative = variant("relative")
    (relative / "config.json").write_text(json.dumps({**config, "position_embedding_type": "relative_key"}))
    _one_error_line(capsys, convert(relative), "only 'absolute' positions")

    _one_error_line(capsys, convert(good, "--labels", "a"), "at least two distinct labels")
    assert not (tmp_path / "out.pt").exists()


def test_library_errors_are_typed(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        import_bert(tmp_path)
