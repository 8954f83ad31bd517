"""`prepare --spm-model` and `--pretokenized`: the ids are those of the given model / dictionary."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import sentencepiece as spm

from multibranch import cli
from multibranch.tasks.translation.dataset import PreparedData
from tests.helpers.cli import one_error_line
from tests.helpers.translation import corpus_lines


def _corpus(root: Path, src: list[str], tgt: list[str]) -> dict[str, str]:
    root.mkdir(exist_ok=True)
    prefixes = {}
    for name, (a, b) in {"train": (0, len(src) - 20), "valid": (len(src) - 20, len(src))}.items():
        (root / f"{name}.en").write_text("".join(s + "\n" for s in src[a:b]), encoding="utf-8")
        (root / f"{name}.de").write_text("".join(t + "\n" for t in tgt[a:b]), encoding="utf-8")
        prefixes[name] = str(root / name)
    return prefixes


def _prepare(prefixes: dict[str, str], out: Path, *extra: str) -> int:
    return cli.main(["prepare", "--src", "en", "--tgt", "de", "--train", prefixes["train"], "--valid",
                     prefixes["valid"], "--out", str(out), "--max-len-ratio", "0", *extra])


def test_spm_model_ids_equal_sentencepiece_encode(tmp_path):
    src, tgt = corpus_lines(200, 1), corpus_lines(200, 2)
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(src + tgt), model_writer=writer, vocab_size=40,
                                   minloglevel=2)
    model = tmp_path / "given.model"
    model.write_bytes(writer.getvalue())
    prefixes = _corpus(tmp_path / "raw", src, tgt)
    assert _prepare(prefixes, tmp_path / "data", "--spm-model", str(model)) == 0
    data = PreparedData.load(tmp_path / "data")
    assert data.meta["vocabulary"] == "spm-model"
    sp = spm.SentencePieceProcessor(model_file=str(model))
    split = data.split("train")
    expected_src = sp.encode((tmp_path / "raw" / "train.en").read_text(encoding="utf-8").splitlines())
    assert [split.src(i).tolist() for i in range(len(split))] == expected_src
    assert data.meta["special_ids"]["pad"] == sp.get_piece_size()  # appended: the model had none


def test_pretokenized_with_dict_and_counted(tmp_path):
    src = ["the ne@@ ws is here", "a ne@@ w day", "the day"] * 10
    tgt = ["die nach@@ richt ist hier", "ein neu@@ er tag", "der tag"] * 10
    prefixes = _corpus(tmp_path / "raw", src, tgt)
    dictionary = tmp_path / "dict.txt"
    words = ["the", "day", "ne@@", "ws", "a", "w", "der", "tag", "die", "nach@@", "richt"]
    dictionary.write_text("".join(f"{w} {100 - i}\n" for i, w in enumerate(words)), encoding="utf-8")
    assert _prepare(prefixes, tmp_path / "dict", "--pretokenized", "--dict", str(dictionary)) == 0
    data = PreparedData.load(tmp_path / "dict")
    ids = {w: 4 + i for i, w in enumerate(words)}
    split = data.split("train")
    assert split.src(0).tolist() == [ids["the"], ids["ne@@"], ids["ws"], 1, 1]  # "is", "here" unknown
    assert split.tgt(2).tolist() == [ids["der"], ids["tag"]]
    tok = data.tokenizer()
    assert tok.decode_tgt([split.src(0).tolist()]) == ["the news <unk> <unk>"]

    assert _prepare(prefixes, tmp_path / "counted", "--pretokenized") == 0
    meta = json.loads((tmp_path / "counted" / "data.json").read_text())
    counted = PreparedData.load(tmp_path / "counted").tokenizer()
    vocabulary = {w for line in src[:-20] + tgt[:-20] for w in line.split()}
    assert meta["vocab_size"]["src"] == 4 + len(vocabulary) and meta["vocabulary"] == "pretokenized"
    assert counted.decode_tgt(counted.encode_src(["a ne@@ w tag"])) == ["a new tag"]


def test_report_describes_the_vocabulary_actually_used(tmp_path):
    src, tgt = corpus_lines(200, 1), corpus_lines(200, 2)
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(src + tgt), model_writer=writer, vocab_size=40,
                                   model_type="unigram", minloglevel=2)
    model = tmp_path / "given.model"
    model.write_bytes(writer.getvalue())
    assert _prepare(_corpus(tmp_path / "raw", src, tgt), tmp_path / "spm", "--spm-model", str(model)) == 0
    report = (tmp_path / "spm" / "report.md").read_text(encoding="utf-8")
    assert f"given model {model} (unigram, 41 pieces)" in report  # 40 + the appended pad
    assert "requested" not in report and "bpe" not in report

    bpe = ["the ne@@ ws is here", "a ne@@ w day", "the day"] * 10
    prefixes = _corpus(tmp_path / "bpe", bpe, bpe)
    dictionary = tmp_path / "dict.txt"
    dictionary.write_text("".join(f"{w} 9\n" for w in ["the", "ne@@", "ws", "a", "w", "day"]), encoding="utf-8")
    assert _prepare(prefixes, tmp_path / "dict", "--pretokenized", "--dict", str(dictionary)) == 0
    report = (tmp_path / "dict" / "report.md").read_text(encoding="utf-8")
    assert f"pre-tokenised BPE text (fairseq dict {dictionary}), joint, src 10 / tgt 10 ids" in report
    assert "requested" not in report and "SentencePiece: bpe" not in report
    assert _prepare(prefixes, tmp_path / "counted", "--pretokenized") == 0
    assert "(counted from train)" in (tmp_path / "counted" / "report.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(("extra", "message"), [
    (["--pretokenized", "--vocab-size", "100"], "--vocab-size"),
    (["--dict", "x.txt"], "--pretokenized"),
    (["--spm-model", "m.model", "--pretokenized"], "exclude"),
    (["--spm-model", "missing.model"], "missing.model: file not found"),
])
def test_reuse_options_refused_in_one_line(tmp_path, capsys, extra, message):
    prefixes = _corpus(tmp_path / "raw", corpus_lines(40, 1), corpus_lines(40, 2))
    assert _prepare(prefixes, tmp_path / "data", *extra) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "data").exists()


def test_translate_joins_bpe_continuations_of_pretokenized_data(tmp_path, capsys):
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions
    from tests.helpers.configs import tiny_experiment

    words = [w + ("@@" if i % 3 == 0 else "") for i, w in enumerate(corpus_lines(1, 4)[0].split() * 3)]
    src = [" ".join(words[i % 5 : i % 5 + 4]) for i in range(120)]
    prefixes = _corpus(tmp_path / "raw", src, src)
    assert _prepare(prefixes, tmp_path / "data", "--pretokenized") == 0
    train(tiny_experiment(max_steps=3), RunOptions(tmp_path / "data", tmp_path / "run"))
    out = tmp_path / "hyp.txt"
    capsys.readouterr()
    assert cli.main(["translate", "--ckpt", str(tmp_path / "run" / "last.pt"), "-i", prefixes["valid"] + ".en",
                     "-o", str(out), "--beam", "1", "--max-len-a", "0", "--max-len-b", "12"]) == 0
    hypotheses = out.read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == 20 and not any("@@" in line for line in hypotheses)
    stems = {w.removesuffix("@@") for w in words if w.endswith("@@")}  # pieces that continue into the next
    finals = {w for w in words if not w.endswith("@@")}

    def joined(word: str) -> bool:  # continuation stems, then a final piece (or nothing at the line's end)
        return word in finals or word in stems or any(word.startswith(s) and joined(word[len(s):]) for s in stems)

    output_words = [word for line in hypotheses for word in line.split()]
    assert all(word == "<unk>" or joined(word) for word in output_words)
    assert any(word not in finals | stems for word in output_words)  # some pieces were joined


def test_ct2_directory_of_pretokenized_data_decodes_as_the_checkpoint(tmp_path):
    """A `convert ct2` directory of a word-vocabulary model reads words as the checkpoint does (one <unk> per
    unknown word, where SentencePiece would merge a run) and joins `@@ ` in its output."""
    pytest.importorskip("ctranslate2")
    from multibranch.tasks import train
    from multibranch.tasks.translation.ct2 import Ct2Translator
    from multibranch.train.trainer import RunOptions
    from tests.helpers.configs import tiny_experiment
    from tests.helpers.translation import translator_of

    words = [w + ("@@" if i % 3 == 0 else "") for i, w in enumerate(corpus_lines(1, 4)[0].split() * 3)]
    src = [" ".join(words[i % 5 : i % 5 + 4]) for i in range(120)]
    prefixes = _corpus(tmp_path / "raw", src, src)
    assert _prepare(prefixes, tmp_path / "data", "--pretokenized") == 0
    train(tiny_experiment(max_steps=3), RunOptions(tmp_path / "data", tmp_path / "run"))
    ckpt, ct2_dir = tmp_path / "run" / "last.pt", tmp_path / "ct2"
    assert cli.main(["convert", "ct2", "--ckpt", str(ckpt), "--out", str(ct2_dir)]) == 0
    ours, theirs = translator_of(ckpt, "cpu"), Ct2Translator(ct2_dir, "cpu")
    lines = [src[0], "zzunknown yyunknown " + src[1]]  # two unknown words in a row: two <unk>
    assert theirs.count_tokens(lines) == [len(ids) + 1 for ids in ours.tokenizer.encode_src(lines)]
    assert theirs.count_tokens(lines)[1] == len(src[1].split()) + 3
    for text in theirs.translate(lines):
        assert "@@" not in text
    references = [src[2], src[3]]
    for a, b in zip(theirs.score(lines, references), ours.score(lines, references), strict=True):
        assert a.tokens == b.tokens and a.log_prob == pytest.approx(b.log_prob, abs=1e-3)
