"""`prepare` on the real Multi30k corpus (skipped when absent). No corpus text is copied here.

Uses the default 8000-piece joint BPE vocabulary: training SentencePiece and encoding the ~30k pairs
takes a few seconds on 2 CPU cores.
"""

from __future__ import annotations

import pytest

from multibranch.data.batching import collate, token_batches
from multibranch.data.parallel_prepare import PrepareConfig
from multibranch.data.text import read_parallel
from multibranch.tasks.translation.dataset import PreparedData
from multibranch.tasks.translation.prepare import prepare

pytestmark = pytest.mark.multi30k


def test_prepare_multi30k(multi30k, tmp_path):
    cfg = PrepareConfig(
        src_lang="en", tgt_lang="de", train=str(multi30k / "train"), valid=str(multi30k / "val"),
        test=[str(multi30k / "test_2016_flickr")], out=str(tmp_path / "data"),
    )
    meta = prepare(cfg)
    inputs = {
        "train": read_parallel(multi30k / "train.en", multi30k / "train.de"),
        "valid": read_parallel(multi30k / "val.en", multi30k / "val.de"),
        "test": read_parallel(multi30k / "test_2016_flickr.en", multi30k / "test_2016_flickr.de"),
    }
    for name, text in inputs.items():
        entry = meta["splits"][name]
        assert entry["lines"] == len(text)
        assert entry["pairs"] + sum(entry["dropped"].values()) == len(text)
        empty = sum(not (s.strip() and t.strip()) for s, t in zip(text.src.lines, text.tgt.lines, strict=True))
        assert entry["dropped"]["empty"] >= empty
    # References are never length-filtered, and the filters remove only a sliver of training data.
    assert meta["splits"]["valid"]["dropped"] == {"empty": 0} and meta["splits"]["test"]["dropped"] == {"empty": 0}
    assert meta["splits"]["train"]["pairs"] >= 0.99 * len(inputs["train"])
    assert meta["vocab_size"]["src"] == meta["vocab_size"]["tgt"] <= 8000
    assert meta["splits"]["test"]["unk_rate"]["tgt"] < 0.005

    data = PreparedData.load(tmp_path / "data")
    data.verify()
    tok = data.tokenizer()
    test = data.split("test")
    assert test.raw_tgt_lines() == inputs["test"].tgt.lines
    decoded = tok.decode_tgt([test.tgt(i).tolist() for i in range(len(test))])
    expected = tok.decode_tgt(tok.encode_tgt(test.raw_tgt_lines()))
    assert decoded == expected

    train = data.split("train")
    batches = token_batches(train.src_lengths, train.tgt_lengths, 4096, seed=1, epoch=0)
    assert sum(len(b) for b in batches) == len(train)
    batch = collate(train, batches[0])
    assert batch.src.shape[0] * batch.src.shape[1] <= 4096
