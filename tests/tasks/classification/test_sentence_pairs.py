"""`prepare --task classify` with two text columns: sentence pairs encoded as Hugging Face encodes them
(ids and token-type ids), `longest_first` truncation, SentencePiece pairs, bad input, GLUE RTE / MRPC."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

pytest.importorskip("transformers")
from multibranch.cli import main  # noqa: E402
from multibranch.models.encoder import segment_ids  # noqa: E402
from multibranch.tasks.classification.dataset import ClassificationData  # noqa: E402
from multibranch.tasks.classification.pairs import longest_first  # noqa: E402
from multibranch.tasks.classification.task import encode_batch  # noqa: E402
from tests.helpers.cli import one_error_line  # noqa: E402
from tests.helpers.hf_bert import WORDS, bert_dir, bert_tokenizer, roberta_dir, sentences  # noqa: E402

FIRSTS = sentences(24, seed=5) + ["the cat sat on a red mat far far away from the blue house " * 2]
SECONDS = sentences(24, seed=6)[::-1] + ["a dog"]
LABELS = ["yes" if i % 3 else "no" for i in range(len(FIRSTS))]


def _write_pairs(path, firsts=FIRSTS, seconds=SECONDS, labels=LABELS) -> None:
    rows = ["id\tsentence1\tsentence2\tlabel"] + [f"{i}\t{a}\t{b}\t{y}" for i, (a, b, y) in
                                                   enumerate(zip(firsts, seconds, labels))]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def _prepare(tmp_path, *extra: str, train=None) -> int:
    train = train or tmp_path / "pairs.tsv"
    if not train.exists():
        _write_pairs(train)
    return main(["prepare", "--task", "classify", "--train", str(train), "--valid", str(train), "--label-column",
                 "label", "--text-column", "sentence1", "--text-column", "sentence2", "--out",
                 str(tmp_path / "data"), *extra])


def test_longest_first_cuts_as_hugging_face_does():
    """Every (n1, n2, budget) up to 9 tokens: our lengths are those HF's tokenizer keeps (one word = one id)."""
    tok = bert_tokenizer()
    word = WORDS[0]
    for n1, n2, budget in itertools.product(range(1, 10), range(1, 10), range(2, 12)):
        enc = tok(" ".join([word] * n1), " ".join([word] * n2), truncation="longest_first", max_length=budget + 3)
        types = enc["token_type_ids"]
        kept = (types.count(0) - 2, types.count(1) - 1)  # minus [CLS] a... [SEP] and the final [SEP]
        assert longest_first(n1, n2, budget) == kept, (n1, n2, budget)


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_pairs_equal_the_hugging_face_pair_encoding(tmp_path, kind, capsys):
    """BOS + stored ids + EOS == tokenizer(a, b, truncation='longest_first')'s input ids, and the model's
    segment ids == its token-type ids (BERT), with several pairs cut to max_len."""
    _, tok = (bert_dir if kind == "bert" else roberta_dir)(tmp_path / "hf")
    max_len = 12
    assert _prepare(tmp_path, "--hf-tokenizer", str(tmp_path / "hf"), "--max-len", str(max_len)) == 0
    data = ClassificationData.load(tmp_path / "data")
    split = data.split("train")
    assert data.pairs and len(split) == len(FIRSTS)
    assert data.meta["splits"]["train"]["truncated"] >= 2  # the test really cuts pairs
    for i, (a, b) in enumerate(zip(FIRSTS, SECONDS)):
        enc = tok(a, b, truncation="longest_first", max_length=max_len + 2, return_token_type_ids=True)
        src = encode_batch([split.ids(i)], tok.pad_token_id, tok.cls_token_id, tok.sep_token_id)  # [1, S]
        assert src[0].tolist() == enc["input_ids"], i
        if kind == "bert":
            assert segment_ids(src, tok.sep_token_id)[0].tolist() == enc["token_type_ids"], i
    report = (tmp_path / "data" / "report.md").read_text(encoding="utf-8")
    assert "Sentence pairs" in report and "longest_first" in report
    raw = (tmp_path / "data" / "train.txt").read_text(encoding="utf-8").splitlines()
    assert raw[0] == f"{FIRSTS[0]}\t{SECONDS[0]}"


def test_sentencepiece_pairs_use_eos_as_separator(tmp_path):
    assert _prepare(tmp_path, "--vocab-size", "60", "--max-len", "12") == 0
    data = ClassificationData.load(tmp_path / "data")
    tokenizer = data.tokenizer()
    assert data.meta["pair_separator"] == [tokenizer.eos_id]
    split = data.split("valid")
    for i, (a, b) in enumerate(zip(FIRSTS, SECONDS)):
        ids_a, ids_b = tokenizer.encode_src([a, b])
        k1, k2 = longest_first(len(ids_a), len(ids_b), 12 - 1)
        assert split.ids(i).tolist() == ids_a[:k1] + [tokenizer.eos_id] + ids_b[:k2]


def _refused(tmp_path, capsys, expected: str, *extra: str, train=None) -> None:
    assert _prepare(tmp_path, *extra, train=train) == 2
    assert expected in one_error_line(capsys)
    assert not (tmp_path / "data").exists()


def test_bad_pair_input_is_one_clear_line(tmp_path, capsys):
    one_column = tmp_path / "one.tsv"
    one_column.write_text("label\tsentence1\nyes\ta cat\n", encoding="utf-8")
    _refused(tmp_path, capsys, "no text column named 'sentence2'", train=one_column)
    one_by_index = tmp_path / "one-index.tsv"
    one_by_index.write_text("yes\ta cat\nno\ta dog\n", encoding="utf-8")
    assert main(["prepare", "--task", "classify", "--train", str(one_by_index), "--holdout", "1", "--text-column",
                 "1", "--text-column", "2", "--out", str(tmp_path / "data")]) == 2
    assert "text column 2 does not exist: rows have 2 column(s)" in one_error_line(capsys)
    empty_second = tmp_path / "empty.tsv"
    _write_pairs(empty_second, seconds=SECONDS[:3] + [" "] + SECONDS[4:])
    _refused(tmp_path, capsys, f"{empty_second}:5: empty second text of the pair", train=empty_second)
    assert main(["prepare", "--task", "classify", "--train", str(tmp_path / "pairs.tsv"), "--holdout", "2",
                 "--text-column", "0", "--text-column", "1", "--text-column", "2", "--out",
                 str(tmp_path / "data")]) == 2
    assert "3 text columns (0, 1, 2): give one text column, or two for sentence pairs" in one_error_line(capsys)
    assert not (tmp_path / "data").exists()
    # --empty-text drop drops (and counts) the pair instead
    assert _prepare(tmp_path, "--empty-text", "drop", "--vocab-size", "60", train=empty_second) == 0
    meta = json.loads((tmp_path / "data" / "data.json").read_text(encoding="utf-8"))
    assert meta["splits"]["train"]["dropped"]["empty"] == 1
    assert meta["splits"]["train"]["examples"] == len(FIRSTS) - 1


def test_jsonl_with_two_text_keys_is_refused_not_read_as_single_texts(tmp_path, capsys):
    train = tmp_path / "pairs.jsonl"
    train.write_text("".join(json.dumps({"label": y, "premise": a, "hypothesis": b}) + "\n"
                             for a, b, y in zip(FIRSTS, SECONDS, LABELS)), encoding="utf-8")
    assert main(["prepare", "--task", "classify", "--train", str(train), "--holdout", "2", "--text-key", "premise",
                 "--text-key", "hypothesis", "--vocab-size", "60", "--out", str(tmp_path / "data")]) == 2
    err = one_error_line(capsys)
    assert "--text-key given 2 times (premise, hypothesis)" in err and "--text-column A --text-column B" in err
    assert not (tmp_path / "data").exists()
    assert main(["prepare", "--task", "classify", "--train", str(train), "--holdout", "2", "--text-key", "premise",
                 "--vocab-size", "60", "--out", str(tmp_path / "data")]) == 0  # one key: single texts, as before


def _head(path, rows: int, out) -> None:
    """The first `rows` lines of a corpus file (bytes, BOM included) into a temporary file."""
    with open(path, "rb") as handle:
        out.write_bytes(b"".join(itertools.islice(handle, rows)))


def test_glue_rte_and_mrpc_read_as_pairs(tmp_path, rte, mrpc):
    """GLUE's TSVs: no quoting (texts keep their `"`), MRPC's BOM before the header, columns by header name."""
    for name, folder, label, first, second in (("rte", rte, "label", "sentence1", "sentence2"),
                                               ("mrpc", mrpc, "Quality", "#1 String", "#2 String")):
        sample = tmp_path / f"{name}.tsv"
        _head(folder / "train.tsv", 301, sample)
        out = tmp_path / name
        assert main(["prepare", "--task", "classify", "--train", str(sample), "--holdout", "0.2", "--label-column",
                     label, "--text-column", first, "--text-column", second, "--vocab-size", "300",
                     "--max-len", "64", "--out", str(out)]) == 0
        data = ClassificationData.load(out)
        assert data.pairs and sum(s["examples"] for s in data.meta["splits"].values()) == 300
        assert data.labels == (["entailment", "not_entailment"] if name == "rte" else ["0", "1"])
        raw = data.split("train").raw_lines() + data.split("valid").raw_lines()
        assert all(len(line.split("\t")) == 2 for line in raw)
        if name == "mrpc":  # MRPC's sentences start with `"` in places: the quote is text, not quoting
            assert any(line.startswith('"') or '\t"' in line for line in raw)
        tokenizer = data.tokenizer()
        eos = tokenizer.eos_id
        src = encode_batch([data.split("train").ids(0)], tokenizer.pad_id, tokenizer.bos_id, eos)
        assert int(src.eq(eos).sum()) == 2 and segment_ids(src, eos).max() == 1


def test_segment_ids_follow_the_first_separator():
    src = torch.tensor([[2, 5, 6, 3, 7, 3, 0], [2, 5, 3, 0, 0, 0, 0]])  # [CLS] a a [SEP] b [SEP] pad; single text
    assert segment_ids(src, 3).tolist() == [[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]]
