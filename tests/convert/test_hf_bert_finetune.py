"""Fine-tuning an imported BERT / RoBERTa: its own tokenizer in `prepare`, MAT proximal init, train + classify."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
from multibranch.checkpoint.format import load_checkpoint  # noqa: E402
from multibranch.cli import main  # noqa: E402
from multibranch.loading.checkpoint import load_model  # noqa: E402
from multibranch.tasks.classification.dataset import ClassificationData  # noqa: E402
from multibranch.tasks.classification.task import encode_batch  # noqa: E402
from tests.helpers.hf_bert import bert_dir, padded_batches, roberta_dir, sentences  # noqa: E402


def write_tsv(path, texts: list[str]) -> list[str]:
    """label<TAB>text lines; the label says whether the text mentions an animal."""
    labels = ["animal" if ("cat" in t or "dog" in t) else "other" for t in texts]
    path.write_text("".join(f"{label}\t{text}\n" for label, text in zip(labels, texts)), encoding="utf-8")
    return labels


@pytest.mark.parametrize("build", [bert_dir, roberta_dir], ids=["bert", "roberta"])
def test_prepared_ids_equal_the_hf_tokenizer(tmp_path, build, capsys):
    """prepare --hf-tokenizer: CLS/<s> + stored ids + SEP/</s> == the HF tokenizer's input_ids, per text."""
    _, tok = build(tmp_path / "hf")
    texts = sentences(30, seed=5) + ["The Cat SAT, far-away!!", "zebra ünïcode quux"]
    write_tsv(tmp_path / "train.tsv", texts)
    assert main(["prepare", "--task", "classify", "--train", str(tmp_path / "train.tsv"), "--holdout", "4",
                 "--hf-tokenizer", str(tmp_path / "hf"), "--out", str(tmp_path / "data")]) == 0
    assert "Hugging Face tokenizer" in capsys.readouterr().out
    data = ClassificationData.load(tmp_path / "data")
    meta = json.loads((tmp_path / "data" / "data.json").read_text())
    assert meta["spm"] is None and meta["hf_tokenizer"]["bos"] == tok.cls_token_id
    ours = data.tokenizer()
    assert (ours.pad_id, ours.bos_id, ours.eos_id, ours.src_vocab_size) == (tok.pad_token_id, tok.cls_token_id,
                                                                            tok.sep_token_id, len(tok))
    checked = 0
    for name in ("train", "valid"):
        split = data.split(name)
        for i, text in enumerate(split.raw_lines()):
            src = encode_batch([split.ids(i)], ours.pad_id, ours.bos_id, ours.eos_id)[0].tolist()
            assert src == tok(text)["input_ids"], text
            checked += 1
    assert checked == len(texts)
    data.verify()  # the fingerprint covers tokenizer.json
    (tmp_path / "data" / "tokenizer.json").write_text("{}")
    with pytest.raises(Exception, match="fingerprint"):
        data.verify()


def test_prepare_hf_tokenizer_bad_input(tmp_path, capsys):
    write_tsv(tmp_path / "train.tsv", sentences(10))
    base = ["prepare", "--task", "classify", "--train", str(tmp_path / "train.tsv"), "--holdout", "2",
            "--out", str(tmp_path / "data")]
    assert main([*base, "--hf-tokenizer", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([*base, "--hf-tokenizer", str(tmp_path / "empty")]) == 2
    assert "no Hugging Face tokenizer" in capsys.readouterr().err
    assert main([*base, "--hf-tokenizer", str(tmp_path / "empty"), "--vocab-size", "100"]) == 2
    assert "--vocab-size: SentencePiece settings, not used with --hf-tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_proximal_init_of_an_imported_bert_keeps_its_logits(tmp_path, capsys):
    """convert proximal on the imported checkpoint: N_a=3 branches (drop-branch 0.3, eval mode) == imported."""
    hf, tok = bert_dir(tmp_path / "hf", num_labels=3)
    imported, mat = tmp_path / "bert.pt", tmp_path / "mat.pt"
    assert main(["convert", "from-hf-bert", "--model-dir", str(tmp_path / "hf"), "--out", str(imported)]) == 0
    assert main(["convert", "proximal", "--ckpt", str(imported), "--branches", "3", "--drop-branch", "0.3",
                 "--out", str(mat)]) == 0
    capsys.readouterr()
    std, mat_model = load_model(imported, task="classification"), load_model(mat, task="classification")
    assert mat_model.config.model.encoder.attention_branches == 3
    d = std.config.model.d_model
    assert mat_model.payload["model"]["encoder.layers.0.self_attn.in_proj.weight"].shape == (3 * 3 * d, d)
    assert mat_model.payload["tokenizer"].keys() == std.payload["tokenizer"].keys()
    texts = sentences(8, seed=7)
    for ids in padded_batches(tok, texts, 4):
        with torch.no_grad():
            expected = hf(input_ids=ids, attention_mask=ids.ne(tok.pad_token_id)).logits
            torch.testing.assert_close(std.model(ids), expected, atol=1e-5, rtol=0)
            torch.testing.assert_close(mat_model.model(ids), expected, atol=1e-5, rtol=0)


def test_fine_tune_an_imported_bert_end_to_end(tmp_path, capsys):
    """Import (new 2-label head), prepare with its tokenizer, train a few updates with the checkpoint's own
    config (--init-from only), classify raw text; the run starts from the imported encoder."""
    bert_dir(tmp_path / "hf", num_labels=3)
    write_tsv(tmp_path / "train.tsv", sentences(60, seed=11))
    write_tsv(tmp_path / "test.tsv", sentences(12, seed=12))
    ckpt, data, run = tmp_path / "bert.pt", tmp_path / "data", tmp_path / "run"
    assert main(["convert", "from-hf-bert", "--model-dir", str(tmp_path / "hf"), "--out", str(ckpt),
                 "--labels", "animal,other"]) == 0
    assert main(["prepare", "--task", "classify", "--train", str(tmp_path / "train.tsv"), "--holdout", "10",
                 "--test", str(tmp_path / "test.tsv"), "--hf-tokenizer", str(tmp_path / "hf"), "--out", str(data),
                 "--max-len", "40"]) == 0
    assert main(["train", "--data", str(data), "--out", str(run), "--init-from", str(ckpt), "--max-steps", "4",
                 "--valid-every", "2", "--lr", "1e-3", "--warmup", "1", "--no-progress",
                 "--set", "train.max_sentences=8"]) == 0
    capsys.readouterr()
    # SentencePiece sampling cannot resegment for a Hugging Face tokenizer: refused before the run starts
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "sampled"), "--init-from", str(ckpt),
                 "--max-steps", "4", "--no-progress", "--set", "classifier.subword_sampling=0.1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "classifier.subword_sampling samples SentencePiece segmentations" in err
    assert not (tmp_path / "sampled").exists()
    assert sorted(p.name for p in (run / "tokenizer").iterdir()) == ["special_ids.json", "tokenizer.json"]
    best = load_checkpoint(run / "best.pt")
    start = load_checkpoint(ckpt)
    assert best["config"]["model"] == start["config"]["model"]  # the imported architecture was fine-tuned
    assert best["tokenizer"].keys() == start["tokenizer"].keys()
    assert all(torch.equal(best["tokenizer"][k], start["tokenizer"][k]) for k in best["tokenizer"])
    moved = [k for k in start["model"] if not torch.equal(start["model"][k], best["model"][k])]
    assert "encoder.layers.0.self_attn.in_proj.weight" in moved  # trained, from the imported weights

    lines = sentences(5, seed=13)
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["classify", "--ckpt", str(run / "best.pt"), "-i", str(tmp_path / "in.txt"),
                 "-o", str(tmp_path / "out.txt"), "--probs"]) == 0
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert len(out) == 5 and all(line.split("\t")[0] in ("animal", "other") for line in out)
    probs = np.array([[float(x.split("=")[1]) for x in line.split("\t")[1].split()] for line in out])
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-3)


def test_init_from_an_import_needs_its_tokenizer(tmp_path, capsys):
    """Data tokenized with SentencePiece would feed the imported embeddings other ids: refused, one line."""
    bert_dir(tmp_path / "hf", num_labels=2)
    write_tsv(tmp_path / "train.tsv", sentences(40, seed=11))
    ckpt = tmp_path / "bert.pt"
    assert main(["convert", "from-hf-bert", "--model-dir", str(tmp_path / "hf"), "--out", str(ckpt)]) == 0
    assert main(["prepare", "--task", "classify", "--train", str(tmp_path / "train.tsv"), "--holdout", "4",
                 "--vocab-size", "40", "--out", str(tmp_path / "data")]) == 0
    capsys.readouterr()
    assert main(["train", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run"), "--init-from", str(ckpt),
                 "--max-steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "its weights expect the ids of its Hugging Face tokenizer" in err and "--hf-tokenizer" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_exported_import_keeps_its_tokenizer(tmp_path, capsys):
    """convert export writes tokenizer.json + its ids; the exported directory classifies like the checkpoint."""
    bert_dir(tmp_path / "hf", num_labels=3)
    ckpt, out = tmp_path / "bert.pt", tmp_path / "export"
    assert main(["convert", "from-hf-bert", "--model-dir", str(tmp_path / "hf"), "--out", str(ckpt)]) == 0
    assert main(["convert", "export", "--ckpt", str(ckpt), "--out", str(out)]) == 0
    capsys.readouterr()
    assert (out / "tokenizer.json").is_file()
    from multibranch.tasks.classification.inference import classify_lines

    texts = sentences(6, seed=4)
    a, b = load_model(ckpt, task="classification"), load_model(out, task="classification")
    assert type(a.tokenizer) is type(b.tokenizer) and a.tokenizer.describe() == b.tokenizer.describe()
    torch.testing.assert_close(classify_lines(b.model, b.tokenizer, texts), classify_lines(a.model, a.tokenizer, texts))


def test_a_tokenizer_saved_with_padding_and_truncation_gives_each_text_its_own_ids(tmp_path, capsys):
    """sentence-transformers save tokenizer.json with fixed padding (to 128) and truncation: `prepare` must
    store each text's own ids (no pad ids, nothing cut but by --max-len), as the plain tokenizer gives them."""
    from transformers import AutoTokenizer

    _, tok = bert_dir(tmp_path / "hf")
    fast = AutoTokenizer.from_pretrained(str(tmp_path / "hf"), local_files_only=True).backend_tokenizer
    fast.enable_padding(length=24, pad_id=tok.pad_token_id, pad_token="[PAD]")
    fast.enable_truncation(max_length=5)
    fast.save(str(tmp_path / "hf" / "tokenizer.json"))
    texts = sentences(12, seed=3) + ["the cat sat on a red mat far away from the blue house"]
    write_tsv(tmp_path / "train.tsv", texts)
    assert main(["prepare", "--task", "classify", "--train", str(tmp_path / "train.tsv"), "--holdout", "3",
                 "--hf-tokenizer", str(tmp_path / "hf"), "--out", str(tmp_path / "data")]) == 0
    data = ClassificationData.load(tmp_path / "data")
    ours = data.tokenizer()
    seen = []
    for name in ("train", "valid"):
        split = data.split(name)
        for i, text in enumerate(split.raw_lines()):
            src = encode_batch([split.ids(i)], ours.pad_id, ours.bos_id, ours.eos_id)[0].tolist()
            assert src == tok(text)["input_ids"], text
            seen.append(len(src))
    assert max(seen) > 7 and min(seen) < 7  # neither cut to 5 + specials nor padded to 24
    assert ours.encode_src(["the cat"]) == [tok("the cat", add_special_tokens=False)["input_ids"]]


def test_init_from_a_head_for_other_labels(tmp_path, capsys, caplog):
    """The head's rows belong to the checkpoint's labels: the data's labels in another order are refused
    (one line, nothing written); other label names train with a warning naming both."""
    bert_dir(tmp_path / "hf", num_labels=2)
    write_tsv(tmp_path / "train.tsv", sentences(30, seed=21))
    data = tmp_path / "data"
    assert main(["prepare", "--task", "classify", "--train", str(tmp_path / "train.tsv"), "--holdout", "6",
                 "--hf-tokenizer", str(tmp_path / "hf"), "--out", str(data)]) == 0
    short = ["--max-steps", "1", "--valid-every", "1", "--no-progress", "--threads", "1"]
    for labels in ("other,animal", "animal,other", "cats,rest"):
        assert main(["convert", "from-hf-bert", "--model-dir", str(tmp_path / "hf"), "--labels", labels,
                     "--out", str(tmp_path / f"{labels}.pt")]) == 0
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "swapped"), "--init-from",
                 str(tmp_path / "other,animal.pt"), *short]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "labels in another order (other, animal vs the data's animal, other)" in err
    assert "--labels animal,other" in err and not (tmp_path / "swapped").exists()
    caplog.clear()
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "same"), "--init-from",
                 str(tmp_path / "animal,other.pt"), *short]) == 0
    assert "head was made for the labels" not in caplog.text
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "renamed"), "--init-from",
                 str(tmp_path / "cats,rest.pt"), *short]) == 0
    assert "head was made for the labels cats, rest; the data's animal, other" in caplog.text
