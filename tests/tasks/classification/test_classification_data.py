"""Classification data: the TSV/CSV/TREC/JSONL readers, every bad-input case, the stratified holdout,
`prepare_classification` round trips and the `ClassificationData` loader's corruption checks."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from multibranch.config import ConfigError, from_dict
from multibranch.errors import DataError
from multibranch.tasks.classification.dataset import ClassificationData, ClassificationSplit
from multibranch.tasks.classification.prepare import (
    ClassifyPrepareConfig,
    prepare_classification,
    stratified_holdout,
)
from multibranch.tasks.classification.readers import ReadOptions, detect_format, read_labeled


def _write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


# --------------------------------------------------------------------------------------- readers


def test_tsv_crlf_bom_and_header_detected(tmp_path):
    path = _write(tmp_path / "train.tsv", b"\xef\xbb\xbflabel\tsentence\r\n1\ta fine film \r\n0\tdull\r\n")
    read = read_labeled(path)
    assert read.header and read.format == "tsv"
    assert read.labels == ["1", "0"]
    assert read.texts == ["a fine film ", "dull"]  # byte-exact text, only the CR removed
    assert read.line_numbers == [2, 3]


def test_tsv_without_header_and_forced_header_modes(tmp_path):
    path = _write(tmp_path / "t.tsv", "pos\tgreat\nneg\tawful\n")
    assert read_labeled(path).labels == ["pos", "neg"]  # 'pos' is not a header word
    assert read_labeled(path, ReadOptions(header="yes")).labels == ["neg"]
    headed = _write(tmp_path / "h.tsv", "label\ttext\npos\tgreat\n")
    assert read_labeled(headed, ReadOptions(header="no")).labels == ["label", "pos"]
    by_text_cell = _write(tmp_path / "s.tsv", "polarity\tSentence\npos\tgreat\n")  # unknown label word
    assert read_labeled(by_text_cell).labels == ["pos"]


def test_columns_by_index_and_by_name(tmp_path):
    path = _write(tmp_path / "t.tsv", "id\tsentence\tlabel\n7\tgood\tpos\n8\tbad\tneg\n")
    by_name = read_labeled(path, ReadOptions(label_column="label", text_column="sentence"))
    by_index = read_labeled(path, ReadOptions(label_column=2, text_column=1, header="yes"))
    by_digits = read_labeled(path, ReadOptions(label_column="2", text_column="1", header="yes"))  # CLI strings
    assert by_name.labels == by_index.labels == by_digits.labels == ["pos", "neg"]
    assert by_name.texts == by_index.texts == by_digits.texts == ["good", "bad"]
    with pytest.raises(DataError, match=r"t\.tsv:1: no text column named 'text' in the header \(id, sentence, label\)"):
        read_labeled(path, ReadOptions(label_column="label", text_column="text"))
    with pytest.raises(DataError, match="text column 5 does not exist: rows have 3"):
        read_labeled(path, ReadOptions(text_column=5))
    with pytest.raises(ConfigError, match="need a header"):
        read_labeled(path, ReadOptions(header="no", label_column="label"))


def test_csv_with_quotes(tmp_path):
    path = _write(tmp_path / "d.csv", 'label,text\r\npos,"fine, really"\r\nneg,"she said ""no"""\r\npos,plain\r\n')
    read = read_labeled(path)
    assert read.format == "csv" and read.header
    assert read.texts == ["fine, really", 'she said "no"', "plain"]
    assert read.labels == ["pos", "neg", "pos"]


def test_csv_unterminated_quote_names_the_line(tmp_path):
    path = _write(tmp_path / "d.csv", 'pos,ok\nneg,"open\nquote"\n')
    with pytest.raises(DataError, match=r"d\.csv:2: bad CSV row"):
        read_labeled(path)


@pytest.mark.parametrize("name,content,line", [
    ("t.tsv", "label\ttext\npos\tgood\nneg\tbad\tsurplus\n", 3),
    ("t.tsv", "pos\tgood\nneg\n", 2),
    ("d.csv", "pos,good\nneg,bad,more\n", 2),
])
def test_wrong_column_count_names_the_line(tmp_path, name, content, line):
    path = _write(tmp_path / name, content)
    with pytest.raises(DataError, match=rf"{name.replace('.', '[.]')}:{line}: \d column\(s\) but line 1 has 2"):
        read_labeled(path)


def test_trec_coarse_and_fine_labels(tmp_path):
    path = _write(tmp_path / "train.label", "NUM:dist How far is it ?\nLOC:city Which city is it ?\n")
    read = read_labeled(path)
    assert read.format == "trec"
    assert read.labels == ["NUM", "LOC"]
    assert read.texts == ["How far is it ?", "Which city is it ?"]
    assert read_labeled(path, ReadOptions(fine_labels=True)).labels == ["NUM:dist", "LOC:city"]


@pytest.mark.parametrize("bad", ["NUMdist How far ?", ":dist How far ?", "NUM: How far ?"])
def test_trec_bad_label_names_the_line(tmp_path, bad):
    path = _write(tmp_path / "train.label", f"NUM:dist How far ?\n{bad}\n")
    with pytest.raises(DataError, match=r"train\.label:2: expected 'COARSE:fine text'"):
        read_labeled(path)


def test_jsonl_keys_integer_labels_and_joined_lines(tmp_path):
    rows = [{"y": 1, "body": "two\r\nlines\n\nhere"}, {"y": "neg", "body": "one line", "extra": None}]
    path = _write(tmp_path / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    read = read_labeled(path, ReadOptions(label_key="y", text_key="body"))
    assert read.labels == ["1", "neg"]
    assert read.texts == ["two lines here", "one line"]
    assert read.joined_lines == 1


def test_jsonl_integer_and_string_spellings_of_a_label_are_one_class(tmp_path):
    rows = [{"label": 1, "text": "a"}, {"label": "1", "text": "b"}, {"label": " 1 ", "text": "c"}]
    path = _write(tmp_path / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert read_labeled(path).labels == ["1", "1", "1"]


@pytest.mark.parametrize("line,message", [
    ('{"label": "a", "text": "x"', r"d\.jsonl:2: invalid JSON"),
    ('["a", "x"]', r"d\.jsonl:2: expected a JSON object, got list"),
    ('{"label": "a"}', r"d\.jsonl:2: missing key 'text' \(keys: label\)"),
    ('{"label": 1.5, "text": "x"}', r"d\.jsonl:2: label 1\.5 must be a string or an integer"),
    ('{"label": "a", "text": 3}', r"d\.jsonl:2: text 3 must be a string"),
])
def test_jsonl_bad_rows_name_the_line(tmp_path, line, message):
    path = _write(tmp_path / "d.jsonl", '{"label": "a", "text": "fine"}\n' + line + "\n")
    with pytest.raises(DataError, match=message):
        read_labeled(path)


def test_format_detection(tmp_path):
    assert [detect_format(f"x{ext}") for ext in (".tsv", ".CSV", ".label", ".jsonl")] == ["tsv", "csv", "trec", "jsonl"]
    assert detect_format("x.txt", "trec") == "trec"
    with pytest.raises(DataError, match=r"x\.txt: cannot tell the format .* pass --format"):
        detect_format("x.txt")
    path = _write(tmp_path / "questions.txt", "HUM:ind Who is it ?\n")
    assert read_labeled(path, ReadOptions(format="trec")).labels == ["HUM"]


def test_empty_text_is_an_error_or_dropped_and_counted(tmp_path):
    path = _write(tmp_path / "t.tsv", "pos\tgood\nneg\t  \npos\tfine\n\n")
    with pytest.raises(DataError, match=r"t\.tsv:2: empty text \(pass --empty-text drop"):
        read_labeled(path)
    read = read_labeled(path, ReadOptions(empty_text="drop"))
    assert read.texts == ["good", "fine"] and read.line_numbers == [1, 3]
    assert read.dropped == {"blank": 1, "empty": 1}


def test_empty_label_and_invalid_utf8_name_the_line(tmp_path):
    with pytest.raises(DataError, match=r"t\.tsv:2: empty label"):
        read_labeled(_write(tmp_path / "t.tsv", "pos\tgood\n \tbad\n"))
    with pytest.raises(DataError, match=r"u\.tsv:3: invalid UTF-8 \(byte 0xff"):
        read_labeled(_write(tmp_path / "u.tsv", b"pos\tgood\nneg\tbad\nneg\tbr\xffken\n"))
    replaced = read_labeled(tmp_path / "u.tsv", ReadOptions(encoding_errors="replace"))
    assert replaced.texts[2] == "br\ufffdken" and replaced.replaced_lines == 1


# --------------------------------------------------------------------------------------- holdout


def test_holdout_is_stratified_deterministic_and_disjoint():
    labels = ["a"] * 50 + ["b"] * 30 + ["c"] * 20
    random.Random(0).shuffle(labels)
    kept, held = stratified_holdout(labels, 0.2, seed=5)
    assert Counter(labels[i] for i in held) == {"a": 10, "b": 6, "c": 4}  # 20% of each label
    assert sorted(kept + held) == list(range(100)) and not set(kept) & set(held)
    assert kept == sorted(kept) and held == sorted(held)
    assert stratified_holdout(labels, 0.2, seed=5) == (kept, held)
    assert stratified_holdout(labels, 0.2, seed=6)[1] != held
    _, by_count = stratified_holdout(labels, 10, seed=5)
    assert Counter(labels[i] for i in by_count) == {"a": 5, "b": 3, "c": 2}


def test_holdout_keeps_every_label_in_train():
    labels = ["a", "a", "b", "a", "a"]
    # quotas a 2.4, b 0.6: b has the larger remainder but its only example must stay in train
    kept, held = stratified_holdout(labels, 0.6, seed=1)
    assert len(held) == 3 and 2 in kept
    with pytest.raises(DataError, match=r"asks for 4 of 5 .* \(at most 3\)"):
        stratified_holdout(labels, 4, seed=1)
    with pytest.raises(DataError, match="asks for 0 of 5"):
        stratified_holdout(labels, 0.01, seed=1)


# --------------------------------------------------------------------------------------- prepare

WORDS = "the a film movie plot actor scene good bad dull great long short story music ends".split()


def _examples(seed: int, n: int, labels: list[str]) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [(labels[i % len(labels)], " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))) for i in range(n)]


@pytest.fixture
def raw(tmp_path) -> dict[str, list[tuple[str, str]]]:
    """train.tsv (header, CRLF), valid.csv and test.jsonl with labels pos/neg/mixed."""
    data = {"train": _examples(1, 90, ["pos", "neg", "mixed"]), "valid": _examples(2, 12, ["neg", "pos"]),
            "test": _examples(3, 9, ["mixed", "pos"])}
    _write(tmp_path / "train.tsv", "label\ttext\r\n" + "".join(f"{y}\t{x}\r\n" for y, x in data["train"]))
    _write(tmp_path / "valid.csv", "".join(f"{y},{x}\n" for y, x in data["valid"]))
    _write(tmp_path / "test.jsonl", "".join(json.dumps({"label": y, "text": x}) + "\n" for y, x in data["test"]))
    return data


def _cfg(tmp_path: Path, **overrides) -> ClassifyPrepareConfig:
    values = dict(train=str(tmp_path / "train.tsv"), valid=str(tmp_path / "valid.csv"),
                  test=[str(tmp_path / "test.jsonl")], out=str(tmp_path / "data"), vocab_size=60)
    values.update(overrides)
    return ClassifyPrepareConfig(**values)


def test_prepare_round_trip(tmp_path, raw):
    meta = prepare_classification(_cfg(tmp_path))
    data = ClassificationData.load(tmp_path / "data")
    data.verify()
    assert meta["format"] == "multibranch-classification-data" and data.fingerprint == meta["fingerprint"]
    assert data.labels == ["mixed", "neg", "pos"] and data.split_names == ["train", "valid", "test"]
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "data" / "spm.model"))
    for name, examples in raw.items():
        split = data.split(name)
        assert len(split) == len(examples)
        assert [data.labels[i] for i in split.labels] == [y for y, _ in examples]
        assert split.raw_lines() == [x for _, x in examples]
        assert [processor.decode(split.ids(i).tolist()) for i in range(len(split))] == [x for _, x in examples]
        assert split.lengths.tolist() == [len(split.ids(i)) for i in range(len(split))]
        expected = Counter(y for y, _ in examples)
        assert meta["splits"][name]["label_counts"] == {label: expected.get(label, 0) for label in data.labels}
    assert data.tokenizer().encode_src([raw["test"][0][1]])[0] == data.split("test").ids(0).tolist()
    report = (tmp_path / "data" / "report.md").read_text(encoding="utf-8")
    assert "| 0 | `mixed` | 30 | 0 | 5 |" in report  # 90 / 3 in train, none in valid, 5 of 9 in test


def test_prepare_with_holdout(tmp_path, raw):
    raw["train"][1] = raw["train"][0]  # a duplicate text: with seed 4, example 1 is held out and 0 kept
    _write(tmp_path / "train.tsv", "".join(f"{y}\t{x}\n" for y, x in raw["train"]))
    meta = prepare_classification(_cfg(tmp_path, valid=None, test=[], holdout=0.2, seed=4))
    kept, held = stratified_holdout([y for y, _ in raw["train"]], 0.2, seed=4)
    data = ClassificationData.load(tmp_path / "data")
    assert data.split("valid").raw_lines() == [raw["train"][i][1] for i in held]
    assert data.split("train").raw_lines() == [raw["train"][i][1] for i in kept]
    assert meta["splits"]["valid"]["label_counts"] == {"mixed": 6, "neg": 6, "pos": 6}
    assert meta["holdout"] == {"size": 0.2, "seed": 4, "examples": 18}
    train_texts = {raw["train"][i][1] for i in kept}
    assert 1 in held and 0 in kept
    assert meta["splits"]["valid"]["in_train"] == sum(raw["train"][i][1] in train_texts for i in held) >= 1
    assert meta["splits"]["train"]["in_train"] is None


def test_over_long_texts_truncated_or_dropped(tmp_path, raw):
    prepare_classification(_cfg(tmp_path, max_len=None))
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "data" / "spm.model"))
    full = {name: [len(ids) for ids in processor.encode([x for _, x in ex])] for name, ex in raw.items()}
    max_len = 4
    meta = prepare_classification(_cfg(tmp_path, max_len=max_len, force=True))
    data = ClassificationData.load(tmp_path / "data")
    for name, lengths in full.items():
        assert data.split(name).lengths.tolist() == [min(n, max_len) for n in lengths]
        assert meta["splits"][name]["truncated"] == sum(n > max_len for n in lengths)
    assert data.split("valid").raw_lines() == [x for _, x in raw["valid"]]  # raw text is kept whole

    meta = prepare_classification(_cfg(tmp_path, max_len=max_len, too_long="drop", force=True))
    data = ClassificationData.load(tmp_path / "data")
    long_train = sum(n > max_len for n in full["train"])
    assert 0 < long_train < len(raw["train"])
    assert meta["splits"]["train"]["dropped"]["too_long"] == long_train
    assert len(data.split("train")) == len(raw["train"]) - long_train
    assert data.split("train").raw_lines() == [x for (_, x), n in zip(raw["train"], full["train"]) if n <= max_len]
    assert len(data.split("valid")) == len(raw["valid"])  # never dropped, only truncated
    assert meta["splits"]["valid"]["truncated"] == sum(n > max_len for n in full["valid"])


def test_unknown_label_in_test_is_an_error_before_writing(tmp_path, raw):
    with open(tmp_path / "test.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"label": "sarcastic", "text": "oh great"}) + "\n")
    with pytest.raises(DataError, match=r"test\.jsonl:10: label 'sarcastic' never occurs in the training data "
                                        r"\(known labels: mixed, neg, pos\)"):
        prepare_classification(_cfg(tmp_path))
    assert not (tmp_path / "data").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".data")]


def test_refuses_to_overwrite_without_force(tmp_path, raw):
    out = tmp_path / "data"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for force in (False, True):  # a directory of other files is never replaced
        with pytest.raises(DataError, match="is a directory of other files, not a prepared data directory"):
            prepare_classification(_cfg(tmp_path, force=force))
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    (out / "keep.txt").unlink()
    prepare_classification(_cfg(tmp_path))
    with pytest.raises(DataError, match="exists and is not empty; pass --force"):
        prepare_classification(_cfg(tmp_path))
    prepare_classification(_cfg(tmp_path, force=True))
    assert (out / "data.json").is_file()
    inside = out / "train.tsv"
    inside.write_bytes((tmp_path / "train.tsv").read_bytes())
    with pytest.raises(DataError, match="holds the input"):
        prepare_classification(_cfg(tmp_path, train=str(inside), force=True))
    with pytest.raises(DataError, match="not found: .*missing.tsv"):
        prepare_classification(_cfg(tmp_path, train=str(tmp_path / "missing.tsv"), force=True))


def test_empty_files_are_errors(tmp_path, raw):
    _write(tmp_path / "test.jsonl", "\n")
    with pytest.raises(DataError, match=r"test\.jsonl: no examples \(the test split would be empty\)"):
        prepare_classification(_cfg(tmp_path))
    _write(tmp_path / "train.tsv", "label\ttext\r\n")
    with pytest.raises(DataError, match=r"train\.tsv: no training examples"):
        prepare_classification(_cfg(tmp_path))


def test_config_validation():
    base = {"train": "t.tsv", "out": "o"}
    with pytest.raises(ConfigError, match="exactly one of valid"):
        from_dict(ClassifyPrepareConfig, base)
    with pytest.raises(ConfigError, match="exactly one of valid"):
        from_dict(ClassifyPrepareConfig, {**base, "valid": "v.tsv", "holdout": 0.1})
    with pytest.raises(ConfigError, match="holdout=1.5"):
        from_dict(ClassifyPrepareConfig, {**base, "holdout": 1.5})
    cfg = from_dict(ClassifyPrepareConfig, {**base, "holdout": 500, "read": {"label_column": "label",
                                                                             "text_column": "sentence"}})
    assert cfg.holdout == 500 and cfg.read.text_column == "sentence"
    with pytest.raises(ConfigError, match="read.empty_text"):
        from_dict(ClassifyPrepareConfig, {**base, "holdout": 0.1, "read": {"empty_text": "skip"}})


# ---------------------------------------------------------------------------------------- loader


@pytest.fixture
def prepared(tmp_path, raw) -> Path:
    prepare_classification(_cfg(tmp_path))
    return tmp_path / "data"


def test_loader_rejects_corruption(prepared, tmp_path):
    with pytest.raises(DataError, match=r"nowhere/data.json: not found \(the directory does not exist\)"):
        ClassificationData.load(tmp_path / "nowhere")
    meta = json.loads((prepared / "data.json").read_text(encoding="utf-8"))
    labels = np.load(prepared / "test.labels.npy")

    np.save(prepared / "test.labels.npy", np.full_like(labels, 3))  # only ids 0..2 exist
    with pytest.raises(DataError, match=r"test\.\*\.npy: corrupted"):
        ClassificationData.load(prepared).split("test")
    with pytest.raises(DataError, match="do not match data.json's fingerprint"):
        ClassificationData.load(prepared).verify()
    np.save(prepared / "test.labels.npy", labels[:-1])
    with pytest.raises(DataError, match=r"test\.\*\.npy: corrupted"):
        ClassificationData.load(prepared).split("test")
    np.save(prepared / "test.labels.npy", labels)
    ClassificationData.load(prepared).verify()

    (prepared / "valid.txt").write_text("one line\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"valid\.txt: 1 lines but the split has 12"):
        ClassificationData.load(prepared).split("valid").raw_lines()
    (prepared / "train.offsets.npy").unlink()
    with pytest.raises(DataError, match=r"train\.offsets\.npy: missing"):
        ClassificationData.load(prepared).split("train")
    with pytest.raises(DataError, match="no split 'test1'; available: train, valid, test"):
        ClassificationData.load(prepared).split("test1")

    for key, value, message in [("format", "multibranch-data", "not a classification data directory"),
                                ("format_version", 99, "format version 99"),
                                ("labels", ["a", "a"], "labels must be a list of distinct strings")]:
        (prepared / "data.json").write_text(json.dumps({**meta, key: value}), encoding="utf-8")
        with pytest.raises(DataError, match=message):
            ClassificationData.load(prepared)
    (prepared / "data.json").write_text("{", encoding="utf-8")
    with pytest.raises(DataError, match="corrupted"):
        ClassificationData.load(prepared)


def test_in_memory_split():
    split = ClassificationSplit.from_sequences([[5, 6, 7], [], [8]], [2, 0, 1])
    assert len(split) == 3 and split.lengths.tolist() == [3, 0, 1]
    assert split.ids(0).tolist() == [5, 6, 7] and split.ids(2).tolist() == [8] and split.labels.tolist() == [2, 0, 1]
    with pytest.raises(DataError, match="no raw text"):
        split.raw_lines()


# ------------------------------------------------------------------------------------- real data


def test_real_trec6_counts_and_prepare(tmp_path, trec6):
    path = trec6 / "train.label"
    read = read_labeled(path)
    assert len(read) == 5444 and read.lines == 5444
    assert sorted(set(read.labels)) == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    assert len(set(read_labeled(path, ReadOptions(fine_labels=True)).labels)) > 6
    meta = prepare_classification(ClassifyPrepareConfig(train=str(path), out=str(tmp_path / "trec"), holdout=500,
                                                        vocab_size=1000))
    assert meta["splits"]["train"]["examples"] + meta["splits"]["valid"]["examples"] == 5444
    assert meta["splits"]["valid"]["examples"] == 500
    assert ClassificationData.load(tmp_path / "trec").num_labels == 6


def test_real_sst2_counts(sst2):
    read = read_labeled(sst2 / "train.tsv")
    assert read.header and len(read) == 67349
    assert sorted(set(read.labels)) == ["0", "1"]
    assert not any(t.endswith("\r") for t in read.texts)
