"""The minilm presets describe what `convert from-hf-bert` makes of all-MiniLM-L6-v2, and fine-tune it.

A random BERT of all-MiniLM-L6-v2's shape (6 layers, d=384, 12 heads, FFN 1536, 512 positions; a tiny
vocabulary) stands in for the pretrained model, which the tests do not download.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
from multibranch.checkpoint.format import load_checkpoint  # noqa: E402
from multibranch.cli import main  # noqa: E402
from multibranch.experiment import resolve_config  # noqa: E402
from tests.helpers.hf_bert import bert_tokenizer, sentences  # noqa: E402

DATA_FILLED = {"src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id", "eos_id"}  # `train` takes them from the data
PRESETS = ["trec6-minilm", "trec6-minilm-drophead", "trec6-minilm-mat", "sst2-minilm", "sst2-minilm-drophead",
           "sst2-minilm-mat", "rte-minilm", "rte-minilm-drophead", "rte-minilm-mat", "mrpc-minilm",
           "mrpc-minilm-drophead", "mrpc-minilm-mat"]


@pytest.fixture(scope="module")
def minilm_import(tmp_path_factory):
    """(directory of a MiniLM-shaped random BERT with its tokenizer, its `convert from-hf-bert` checkpoint)."""
    from transformers import BertConfig, BertModel

    root = tmp_path_factory.mktemp("minilm")
    tok = bert_tokenizer()
    config = BertConfig(vocab_size=len(tok), hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512, hidden_act="gelu")
    torch.manual_seed(0)
    BertModel(config).save_pretrained(root / "hf")
    tok.save_pretrained(root / "hf")
    ckpt = root / "import.pt"
    assert main(["convert", "from-hf-bert", "--model-dir", str(root / "hf"), "--labels", "animal,other",
                 "--out", str(ckpt)]) == 0
    return root / "hf", ckpt


def _model(config: dict) -> dict:
    return {k: v for k, v in config["model"].items() if k not in DATA_FILLED}


def test_the_minilm_preset_is_the_imported_model(minilm_import):
    _, ckpt = minilm_import
    imported = load_checkpoint(ckpt)["config"]
    preset = resolve_config("minilm-l6").to_dict()
    assert _model(preset) == _model(imported)
    assert preset["classifier"]["pooling"] == imported["classifier"]["pooling"] == "first"
    assert preset["task"] == "classification"


def test_dataset_presets_change_only_the_regularisation_of_the_model():
    base = _model(resolve_config("minilm-l6").to_dict())
    for name in PRESETS:
        model = _model(resolve_config(name).to_dict())
        if name.endswith("-drophead"):
            assert model["drophead"]["rate"] == {**base["drophead"]["rate"], "schedule": "v", "rate": 0.1,
                                                 "warmup_ratio": 0.1}
            model["drophead"] = base["drophead"]
        if name.endswith("-mat"):
            assert model["encoder"]["attention_branches"] == 2 and model["encoder"]["drop_branch"]["rate"] == 0.1
            model["encoder"] = base["encoder"]
        assert model == base, name


def test_fine_tune_the_import_with_the_presets(minilm_import, tmp_path, capsys):
    """trec6-minilm-drophead from the import; trec6-minilm-mat from its proximal MAT (and not from the
    import itself: one line naming the branch count); both start from the imported weights."""
    hf, ckpt = minilm_import
    lines = "".join(f"{'animal' if 'cat' in t or 'dog' in t else 'other'}\t{t}\n" for t in sentences(40, seed=4))
    (tmp_path / "train.tsv").write_text(lines, encoding="utf-8")
    data = tmp_path / "data"
    assert main(["prepare", "--task", "classify", "--train", str(tmp_path / "train.tsv"), "--holdout", "8",
                 "--hf-tokenizer", str(hf), "--out", str(data)]) == 0
    short = ["--max-steps", "2", "--valid-every", "2", "--warmup", "1", "--no-progress", "--threads", "1",
             "--set", "train.max_sentences=8"]
    assert main(["train", "--preset", "trec6-minilm-drophead", "--data", str(data), "--out", str(tmp_path / "dh"),
                 "--init-from", str(ckpt), *short]) == 0
    capsys.readouterr()
    assert main(["train", "--preset", "trec6-minilm-mat", "--data", str(data), "--out", str(tmp_path / "no"),
                 "--init-from", str(ckpt), *short]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "attention_branches" in err
    assert not (tmp_path / "no").exists()
    mat = tmp_path / "mat.pt"
    assert main(["convert", "proximal", "--ckpt", str(ckpt), "--branches", "2", "--out", str(mat)]) == 0
    assert main(["train", "--preset", "trec6-minilm-mat", "--data", str(data), "--out", str(tmp_path / "mat"),
                 "--init-from", str(mat), *short]) == 0
    start = load_checkpoint(ckpt)["model"]
    for run, key in (("dh", "encoder.layers.0.ffn.fc1.weight"), ("mat", "encoder.layers.0.ffn.fc1.weight")):
        trained = load_checkpoint(tmp_path / run / "last.pt")
        assert trained["config"]["classifier"]["labels"] == ["animal", "other"]
        difference = (trained["model"][key] - start[key]).abs().max().item()
        assert 0 < difference < 0.05, (run, difference)  # fine-tuned from the import, not re-initialised
