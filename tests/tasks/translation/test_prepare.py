"""`prepare` end to end on tiny corpora: every bad-input case, drops by reason, file layout, round trips."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from multibranch import cli
from multibranch.config import ConfigError
from multibranch.data import parallel_prepare as prepare_module
from multibranch.data.batching import collate, token_batches
from multibranch.data.parallel_prepare import PrepareConfig
from multibranch.data.text import read_lines
from multibranch.errors import DataError
from multibranch.tasks.translation.dataset import PreparedData
from multibranch.tasks.translation.prepare import prepare
from multibranch.tasks.translation.synthetic import generate_pairs


def _write_pairs(directory: Path, name: str, pairs: list[tuple[str, str]], src="en", tgt="de") -> str:
    prefix = directory / name
    for side, lang in ((0, src), (1, tgt)):
        Path(f"{prefix}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    return str(prefix)


@pytest.fixture
def corpus(tmp_path) -> dict[str, list[tuple[str, str]]]:
    """A small synthetic corpus written as raw/{train,valid,test}.{en,de}."""
    raw = tmp_path / "raw"
    raw.mkdir()
    splits = {
        "train": generate_pairs(3, 300, "train"),
        "valid": generate_pairs(3, 30, "valid"),
        "test": generate_pairs(3, 20, "test"),
    }
    for name, pairs in splits.items():
        _write_pairs(raw, name, pairs)
    return splits


def _cfg(tmp_path: Path, **overrides) -> PrepareConfig:
    raw = tmp_path / "raw"
    values = dict(
        src_lang="en", tgt_lang="de", train=str(raw / "train"), valid=str(raw / "valid"),
        test=[str(raw / "test")], out=str(tmp_path / "data"), vocab_size=120,
    )
    values.update(overrides)
    return PrepareConfig(**values)


def test_layout_metadata_and_round_trip(tmp_path, corpus):
    meta = prepare(_cfg(tmp_path))
    out = tmp_path / "data"
    names = {p.name for p in out.iterdir()}
    expected = {"spm.model", "data.json", "report.md"}
    for split in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            expected |= {f"{split}.{side}.tokens.npy", f"{split}.{side}.offsets.npy", f"{split}.{side}.txt"}
    assert names == expected
    on_disk = json.loads((out / "data.json").read_text())
    assert on_disk == {k: v for k, v in meta.items() if k != "out"}
    assert on_disk["special_ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    assert on_disk["joint"] is True and on_disk["spm"] == {"src": "spm.model", "tgt": "spm.model"}
    assert len(on_disk["fingerprint"]) == 64
    for name, pairs in corpus.items():
        assert on_disk["splits"][name]["lines"] == len(pairs)

    data = PreparedData.load(out)
    data.verify()
    tok = data.tokenizer()
    assert tok.joint and (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 2, 3)
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    for name in ("valid", "test", "train"):
        split = data.split(name)
        src_lines, tgt_lines = split.raw_src_lines(), split.raw_tgt_lines()
        assert len(split) == len(src_lines) == meta["splits"][name]["pairs"]
        assert split.src_lengths.dtype == np.int64 and split.tgt_lengths.dtype == np.int64
        assert int(split.src_lengths.sum()) == meta["splits"][name]["tokens"]["src"]
        for i in range(0, len(split), 7):
            assert tok.decode_tgt([split.tgt(i).tolist()])[0] == sp.decode(sp.encode(tgt_lines[i]))
            assert split.src(i).tolist() == sp.encode(src_lines[i])
            assert len(split.src(i)) == split.src_lengths[i]
    # Valid/test are references: every input pair is kept, in order.
    assert data.split("valid").raw_tgt_lines() == [t for _, t in corpus["valid"]]
    assert "| valid |" in (out / "report.md").read_text()


def test_prepared_split_batches_and_collates(tmp_path, corpus):
    prepare(_cfg(tmp_path))
    split = PreparedData.load(tmp_path / "data").split("train")
    batches = token_batches(split.src_lengths, split.tgt_lengths, 512, seed=1, epoch=0)
    batch = collate(split, batches[0])
    i = int(batch.indices[0])
    n = len(split.tgt(i))
    assert batch.tgt[0, :n].tolist() == split.tgt(i).tolist() and batch.tgt[0, n] == 3
    assert batch.prev[0, 0] == 2 and batch.prev[0, 1 : n + 1].tolist() == split.tgt(i).tolist()


def test_empty_and_whitespace_pairs_are_dropped_and_counted(tmp_path, corpus):
    raw = tmp_path / "raw"
    train = list(corpus["train"])
    train[5] = ("", train[5][1])
    train[9] = (train[9][0], " \t ")
    train[11] = ("\u2028", train[11][1])  # U+2028 alone is whitespace
    _write_pairs(raw, "train", train)
    valid = list(corpus["valid"])
    valid[2] = ("   ", "")
    _write_pairs(raw, "valid", valid)
    meta = prepare(_cfg(tmp_path))
    assert meta["splits"]["train"]["dropped"]["empty"] == 3
    assert meta["splits"]["valid"]["dropped"] == {"empty": 1}
    assert meta["splits"]["valid"]["pairs"] == len(valid) - 1
    kept = read_lines(tmp_path / "data" / "valid.tgt.txt").lines
    assert kept == [t for i, (_, t) in enumerate(valid) if i != 2]
    report = (tmp_path / "data" / "report.md").read_text()
    assert f"| train | `{raw / 'train'}` | {len(train)} | {len(train) - 3} | 3 |" in report


def test_long_and_bad_ratio_training_pairs_are_dropped_and_counted(tmp_path, corpus):
    raw = tmp_path / "raw"
    train = list(corpus["train"])
    long_src = " ".join(w for s, _ in train[:8] for w in s.split())
    long_tgt = " ".join(w for _, t in train[:8] for w in t.split())
    train.append((long_src, long_tgt))  # too long on both sides
    short = min(train, key=lambda p: len(p[0]))
    train.append((short[0], " ".join([short[1]] * 5)))  # target 5x the source
    _write_pairs(raw, "train", train)
    _write_pairs(raw, "valid", list(corpus["valid"]) + [(long_src, long_tgt)])  # never filtered
    cfg = _cfg(tmp_path, max_len=60, max_len_ratio=2.0)
    meta = prepare(cfg)

    # Recompute the documented rule with the trained model.
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "data" / "spm.model"))
    ls = np.array([len(x) for x in sp.encode([s for s, _ in train])])
    lt = np.array([len(x) for x in sp.encode([t for _, t in train])])
    too_long = (ls > 60) | (lt > 60)
    ratio = ~too_long & (np.maximum(ls, lt) > 2.0 * np.minimum(ls, lt) + cfg.ratio_allowance)
    assert too_long[-2] and ratio[-1]
    dropped = meta["splits"]["train"]["dropped"]
    assert dropped == {"empty": 0, "too_long": int(too_long.sum()), "ratio": int(ratio.sum())}
    assert meta["splits"]["train"]["pairs"] == len(train) - int(too_long.sum()) - int(ratio.sum())
    assert max(meta["splits"]["train"]["length"]["src"]["max"], meta["splits"]["train"]["length"]["tgt"]["max"]) <= 60
    kept = read_lines(tmp_path / "data" / "train.src.txt").lines
    assert long_src not in kept
    assert meta["splits"]["valid"]["pairs"] == len(corpus["valid"]) + 1
    assert long_tgt in read_lines(tmp_path / "data" / "valid.tgt.txt").lines


def test_crlf_bom_and_u2028_inputs(tmp_path, corpus):
    raw = tmp_path / "raw"
    valid = corpus["valid"][:4]
    src = ("\ufeff" + "".join(s + "\r\n" for s, _ in valid[:2]) + "left\u2028right\r\n" + valid[3][0] + "\r\n")
    (raw / "valid.en").write_bytes(src.encode())
    (raw / "valid.de").write_text("".join(t + "\n" for _, t in valid), encoding="utf-8")
    meta = prepare(_cfg(tmp_path))
    assert meta["splits"]["valid"]["pairs"] == 4
    lines = PreparedData.load(tmp_path / "data").split("valid").raw_src_lines()
    assert lines == [valid[0][0], valid[1][0], "left\u2028right", valid[3][0]]


def test_invalid_utf8_strict_and_replace(tmp_path, corpus):
    raw = tmp_path / "raw"
    data = bytearray((raw / "train.de").read_bytes())
    third_line = data.index(b"\n", data.index(b"\n") + 1) + 1
    data[third_line : third_line + 1] = b"\xff"
    (raw / "train.de").write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"{raw / 'train.de'}:3: invalid UTF-8 \(byte 0xff at column 1\)"):
        prepare(_cfg(tmp_path))
    assert not (tmp_path / "data").exists()
    meta = prepare(_cfg(tmp_path, encoding_errors="replace"))
    assert meta["splits"]["train"]["replaced_lines"] == {"src": 0, "tgt": 1}
    assert meta["splits"]["train"]["pairs"] == len(corpus["train"])


def test_unequal_line_counts_and_missing_files(tmp_path, corpus):
    raw = tmp_path / "raw"
    _write_pairs(raw, "valid", corpus["valid"])
    with open(raw / "valid.de", "a", encoding="utf-8") as handle:
        handle.write("extra\n")
    n = len(corpus["valid"])
    with pytest.raises(DataError) as err:
        prepare(_cfg(tmp_path))
    message = str(err.value)
    assert f"{raw / 'valid.en'} has {n} lines, {raw / 'valid.de'} has {n + 1}" in message
    assert f"line {n + 1} exists only in {raw / 'valid.de'}" in message

    _write_pairs(raw, "valid", corpus["valid"])
    (raw / "test.de").unlink()
    with pytest.raises(DataError, match=rf"not found: {raw / 'test.de'}"):
        prepare(_cfg(tmp_path))


def test_existing_out_dir_refused_then_replaced_with_force(tmp_path, corpus):
    out = tmp_path / "data"
    prepare(_cfg(tmp_path))
    first = (out / "data.json").read_text()
    with pytest.raises(DataError, match="pass --force"):
        prepare(_cfg(tmp_path))
    assert (out / "data.json").read_text() == first
    prepare(_cfg(tmp_path, force=True, vocab_size=90))
    assert (out / "data.json").read_text() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "raw"]


@pytest.mark.parametrize("force", [False, True])
def test_a_directory_of_other_files_is_never_replaced(tmp_path, corpus, force):
    out = tmp_path / "data"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(DataError, match="is a directory of other files, not a prepared data directory; "
                                        "--force replaces only output of its own kind"):
        prepare(_cfg(tmp_path, force=force))
    assert [p.name for p in out.iterdir()] == ["old.txt"]


def test_failure_with_force_keeps_old_dir_and_leaves_no_partial_dir(tmp_path, corpus, monkeypatch):
    out = tmp_path / "data"
    prepare(_cfg(tmp_path))
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(prepare_module, "_report", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare(_cfg(tmp_path, force=True, vocab_size=90))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "raw"]


def test_force_refuses_to_delete_its_own_inputs(tmp_path, corpus):
    with pytest.raises(DataError, match="holds the input"):
        prepare(_cfg(tmp_path, out=str(tmp_path / "raw"), force=True))
    assert (tmp_path / "raw" / "train.en").exists()


def test_separate_vocabularies(tmp_path, corpus):
    meta = prepare(_cfg(tmp_path, joint=False, model_type="unigram", vocab_size=100))
    out = tmp_path / "data"
    assert meta["spm"] == {"src": "spm.src.model", "tgt": "spm.tgt.model"}
    assert (out / "spm.src.model").exists() and (out / "spm.tgt.model").exists()
    assert not (out / "spm.model").exists()
    tok = PreparedData.load(out).tokenizer()
    assert not tok.joint
    assert tok.src_vocab_size == meta["vocab_size"]["src"] and tok.tgt_vocab_size == meta["vocab_size"]["tgt"]


def test_deterministic_fingerprint(tmp_path, corpus):
    first = prepare(_cfg(tmp_path))
    second = prepare(_cfg(tmp_path, out=str(tmp_path / "again")))
    assert first["fingerprint"] == second["fingerprint"]
    assert first["splits"] == second["splits"]


def test_too_large_vocab_for_tiny_corpus_does_not_crash(tmp_path, corpus):
    meta = prepare(_cfg(tmp_path, vocab_size=50000))
    assert 4 < meta["vocab_size"]["src"] < 50000


def test_bad_config_values(tmp_path, corpus):
    with pytest.raises(ConfigError):
        prepare(_cfg(tmp_path, tgt_lang="en"))
    with pytest.raises(ConfigError):
        prepare(_cfg(tmp_path, max_len=0))


def test_load_errors(tmp_path, corpus):
    with pytest.raises(DataError, match="prepare"):
        PreparedData.load(tmp_path / "nowhere")
    prepare(_cfg(tmp_path))
    out = tmp_path / "data"
    data = PreparedData.load(out)
    with pytest.raises(DataError, match="available: train, valid, test"):
        data.split("dev")
    meta = json.loads((out / "data.json").read_text())

    tokens = np.load(out / "valid.src.tokens.npy")
    np.save(out / "valid.src.tokens.npy", np.roll(tokens, 1))  # same shape, other ids
    with pytest.raises(DataError, match="fingerprint"):
        PreparedData.load(out).verify()
    (out / "valid.src.offsets.npy").write_bytes(b"garbage")
    with pytest.raises(DataError, match="corrupted"):
        PreparedData.load(out).split("valid")
    with pytest.raises(DataError, match="valid.src.offsets.npy"):
        PreparedData.load(out).verify()
    np.save(out / "test.tgt.offsets.npy", np.array([0, 1, 2], dtype=np.int64))
    with pytest.raises(DataError, match="corrupted"):
        PreparedData.load(out).split("test")

    (out / "data.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(DataError, match="format version 99"):
        PreparedData.load(out)
    (out / "data.json").write_text("{not json")
    with pytest.raises(DataError, match="corrupted"):
        PreparedData.load(out)


def test_cli_prepare(tmp_path, corpus, capsys):
    raw = tmp_path / "raw"
    args = ["prepare", "--src", "en", "--tgt", "de", "--train", str(raw / "train"), "--valid", str(raw / "valid"),
            "--test", str(raw / "test"), "--out", str(tmp_path / "data"), "--vocab-size", "120"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "train" in out and f"{len(corpus['train'])} pairs kept" in out and "report.md" in out
    assert cli.main(args) == 2  # exists, no --force
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--force" in err and "Traceback" not in err
    assert cli.main([*args, "--force", "--max-len", "0", "--max-len-ratio", "0"]) == 0
    meta = json.loads((tmp_path / "data" / "data.json").read_text())
    assert meta["config"]["max_len"] is None and meta["config"]["max_len_ratio"] is None


def test_several_test_sets_and_directory_permissions(tmp_path, corpus, capsys):
    raw = tmp_path / "raw"
    _write_pairs(raw, "test_b", corpus["valid"][:5])
    args = ["prepare", "--src", "en", "--tgt", "de", "--train", str(raw / "train"), "--valid", str(raw / "valid"),
            "--test", str(raw / "test"), "--test", str(raw / "test_b"), "--out", str(tmp_path / "data"),
            "--vocab-size", "120"]
    assert cli.main(args) == 0
    data = PreparedData.load(tmp_path / "data")
    assert data.split_names == ["train", "valid", "test", "test1"]
    assert data.meta["splits"]["test1"]["prefix"] == str(raw / "test_b")
    assert len(data.split("test1")) == 5
    (tmp_path / "plain").mkdir()
    assert (tmp_path / "data").stat().st_mode == (tmp_path / "plain").stat().st_mode
