"""Reused vocabularies: an existing SentencePiece model keeps its ids; a fairseq dict.txt becomes a word
vocabulary whose decoding joins `@@ ` continuations."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import pytest
import sentencepiece as spm

from multibranch.data.tokenizer import Tokenizer, undo_bpe
from multibranch.data.vocabulary import adapt_spm_model, ranked_words, read_dict, word_model
from multibranch.errors import DataError
from tests.helpers.translation import corpus_lines


@pytest.fixture(scope="module")
def default_spm(tmp_path_factory) -> Path:
    """A model trained with SentencePiece's defaults: unk=0, bos=1, eos=2 and no pad."""
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus_lines(300, 1)), model_writer=writer,
                                   vocab_size=40, minloglevel=2)
    path = tmp_path_factory.mktemp("spm") / "default.model"
    path.write_bytes(writer.getvalue())
    return path


def test_adapted_model_keeps_every_id_and_gains_a_pad(default_spm):
    original = spm.SentencePieceProcessor(model_file=str(default_spm))
    assert original.pad_id() == -1
    proto = adapt_spm_model(default_spm)
    tok = Tokenizer(proto, proto)
    lines = corpus_lines(50, 9)
    assert tok.encode_src(lines) == original.encode(lines)
    assert tok.pad_id == original.get_piece_size() and tok.src_vocab_size == original.get_piece_size() + 1
    assert (tok.bos_id, tok.eos_id, tok.unk_id) == (original.bos_id(), original.eos_id(), original.unk_id())
    ids = original.encode(lines[0])
    assert tok.decode_tgt([[tok.bos_id, *ids, tok.eos_id, tok.pad_id]]) == [original.decode(ids)]


def test_not_a_model_is_refused(tmp_path):
    bad = tmp_path / "x.model"
    bad.write_bytes(b"\xff\x00 not a proto")
    with pytest.raises(DataError, match="not a SentencePiece model"):
        adapt_spm_model(bad)


def test_dict_txt_words_get_ids_after_the_specials(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("the 120\nne@@ 40\nws 39\n, 30 #fairseq:overwrite\n", encoding="utf-8")
    words = read_dict(path)
    assert words == ["the", "ne@@", "ws", ","]
    proto = word_model(words)
    tok = Tokenizer(proto, proto)
    assert tok.encode_src(["the ne@@ ws , zebra the"]) == [[4, 5, 6, 7, 1, 4]]  # hand-computed
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id, tok.src_vocab_size) == (0, 1, 2, 3, 8)
    assert tok.pretokenized
    assert tok.decode_tgt([[2, 4, 5, 6, 7, 1, 3]]) == ["the news , <unk>"]


@pytest.mark.parametrize(("text", "line"), [("the 1\nthe 2\n", 2), ("the\n", 1), ("the x\n", 1)])
def test_bad_dict_lines_name_file_and_line(tmp_path, text, line):
    path = tmp_path / "dict.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=f"dict.txt:{line}:"):
        read_dict(path)


def test_dict_txt_overwrite_flag_repeats_a_word_as_fairseq_does(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("the 120\nne@@ 40\nws 39\nthe 30 #fairseq:overwrite\n, 20\n", encoding="utf-8")
    words = read_dict(path)
    assert words == ["the", "ne@@", "ws", "the", ","]
    tok = Tokenizer(word_model(words), word_model(words))
    # fairseq: "the" takes the new id 7 (4 + its line), the ids after it stay fairseq's, id 4 stays taken
    assert tok.encode_src(["the ne@@ ws , the"]) == [[7, 5, 6, 8, 7]]
    assert tok.src.encode("the ne@@ ws , the") == [7, 5, 6, 8, 7]
    assert tok.src_vocab_size == 9
    assert tok.decode_tgt([[7, 5, 6, 8, 4]]) == ["the news ,"]


def test_counted_words_rank_by_count_then_alphabet():
    assert ranked_words(Counter({"b": 2, "a": 2, "c": 5, "<unk>": 9})) == ["c", "a", "b"]


def test_undo_bpe_as_fairseq():
    assert undo_bpe("the ne@@ ws ti@@ me@@") == "the news time"
    assert undo_bpe("plain text") == "plain text"


def test_a_word_vocabulary_survives_the_checkpoint_form():
    proto = word_model(["a", "ne@@", "w"])
    restored = Tokenizer.from_state(Tokenizer(proto, proto).to_state())
    assert restored.pretokenized and restored.encode_src(["a ne@@ w x y"]) == [[4, 5, 6, 1, 1]]
    assert restored.decode_tgt([[4, 5, 6]]) == ["a new"]
