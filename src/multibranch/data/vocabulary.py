"""Vocabularies that `prepare` reuses instead of training one: an existing SentencePiece model, or the
words of already tokenised and BPE-split text (fairseq's IWSLT14 / WMT14 preparation, `@@ ` markers).

Both become SentencePiece model protos, so the rest of the toolkit (checkpoints, translate, serve)
handles them like a model `prepare` trained:

- `adapt_spm_model`: a given model keeps every id; a special piece it lacks (pad, bos or eos: models
  trained with SentencePiece's defaults have no pad) is appended after its last piece.
- `word_model`: a WORD model whose pieces are the words of a fairseq `dict.txt` (or counted from the
  training text) after pad=0, unk=1, bos=2, eos=3, in the dictionary's order. Encoding splits on
  whitespace, an unknown word is `<unk>`; the model is marked (`PRETOKENIZED_MARK`) so that decoding
  joins `@@ ` continuations and does no detokenisation (data/tokenizer.py). As in fairseq's
  `Dictionary.add_from_file`, a line `WORD COUNT #fairseq:overwrite` may repeat a word: the word gets
  the new line's id, and the earlier id stays taken (an unused control piece) so that the ids after it
  remain fairseq's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from sentencepiece import sentencepiece_model_pb2 as model_pb2

from multibranch.data.text import read_lines
from multibranch.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, PRETOKENIZED_MARK, UNK_ID
from multibranch.errors import DataError

SPECIALS = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}
WORD_BOUNDARY = "\u2581"  # SentencePiece's whitespace symbol
OVERWRITE_FLAG = "#fairseq:overwrite"
Piece = model_pb2.ModelProto.SentencePiece


def adapt_spm_model(path: str | Path) -> bytes:
    """The serialized model at `path`, with pad / bos / eos control pieces appended where it has none."""
    path = Path(path)
    model = model_pb2.ModelProto()
    try:
        model.ParseFromString(path.read_bytes())
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror or err})") from None
    except Exception:  # protobuf's DecodeError: not a SentencePiece model
        raise DataError(f"{path}: not a SentencePiece model file") from None
    if not model.pieces:
        raise DataError(f"{path}: not a SentencePiece model file (no pieces)")
    index = {piece.piece: i for i, piece in enumerate(model.pieces)}
    spec = model.trainer_spec
    if spec.unk_id < 0 or spec.unk_id >= len(model.pieces):
        raise DataError(f"{path}: the SentencePiece model has no <unk> piece")
    for name in ("pad", "bos", "eos"):
        piece_id = getattr(spec, f"{name}_id")
        if 0 <= piece_id < len(model.pieces):
            continue
        piece = getattr(spec, f"{name}_piece") or SPECIALS[name]
        if piece in index:
            raise DataError(f"{path}: {name} piece {piece!r} is an ordinary piece of the model; cannot add a {name}")
        model.pieces.append(Piece(piece=piece, score=0.0, type=Piece.CONTROL))
        index[piece] = len(model.pieces) - 1
        setattr(spec, f"{name}_id", index[piece])
        setattr(spec, f"{name}_piece", piece)
    return model.SerializeToString()


def read_dict(path: str | Path) -> list[str]:
    """The words of a fairseq `dict.txt` (`WORD COUNT [#fairseq:overwrite]` per line), in order; a word
    repeated with the overwrite flag appears again at its new position (see `word_model`)."""
    path = Path(path)
    words: list[str] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(read_lines(path).lines, start=1):
        fields = line.rstrip().split(" ")
        overwrite = fields[-1] == OVERWRITE_FLAG
        if fields[-1].startswith("#fairseq:"):
            fields = fields[:-1]
        if len(fields) < 2 or not fields[-1].lstrip("-").isdigit() or not fields[0]:
            raise DataError(f"{path}:{number}: expected 'WORD COUNT' (a fairseq dict.txt line), got {line[:60]!r}")
        word = " ".join(fields[:-1])
        if word in seen and not overwrite:
            raise DataError(f"{path}:{number}: {word!r} repeats line {seen[word]} (a repeated word needs the "
                            f"{OVERWRITE_FLAG} flag)")
        if word in SPECIALS.values():
            continue  # fairseq writes its own specials first; ours come from the model
        if any(c.isspace() for c in word):
            raise DataError(f"{path}:{number}: word {word!r} contains whitespace")
        seen[word] = number
        words.append(word)
    if not words:
        raise DataError(f"{path}: no words; expected fairseq dict.txt lines 'WORD COUNT'")
    return words


def count_words(lines: Iterable[str], counts: Counter[str] | None = None) -> Counter[str]:
    """Whitespace-separated word counts of `lines`, added to `counts`."""
    counts = Counter() if counts is None else counts
    for line in lines:
        counts.update(line.split())
    return counts


def ranked_words(counts: Counter[str]) -> list[str]:
    """Words by count, most frequent first, ties alphabetically (fairseq's dict.txt order)."""
    return [word for word, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
            if word not in SPECIALS.values()]


def word_model(words: list[str]) -> bytes:
    """A SentencePiece WORD model over `words` (ids 4, 5, ... in order) marked as pre-tokenised BPE text.
    A word listed again (fairseq's overwrite) has the id of its last position; each earlier position
    becomes a control piece that encoding never produces and decoding drops."""
    model = model_pb2.ModelProto()
    spec = model.trainer_spec
    spec.model_type = model_pb2.TrainerSpec.WORD
    spec.model_prefix = PRETOKENIZED_MARK
    spec.vocab_size = len(words) + len(SPECIALS)
    spec.unk_surface = " " + SPECIALS["unk"]  # an unknown word decodes as fairseq writes it
    for name, piece_id in (("pad", PAD_ID), ("unk", UNK_ID), ("bos", BOS_ID), ("eos", EOS_ID)):
        setattr(spec, f"{name}_id", piece_id)
        setattr(spec, f"{name}_piece", SPECIALS[name])
    normalizer = model.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = True
    normalizer.remove_extra_whitespaces = True
    normalizer.escape_whitespaces = True
    for piece_id in sorted((PAD_ID, UNK_ID, BOS_ID, EOS_ID)):
        name = next(n for n in SPECIALS if getattr(spec, f"{n}_id") == piece_id)
        kind = Piece.UNKNOWN if name == "unk" else Piece.CONTROL
        model.pieces.append(Piece(piece=SPECIALS[name], score=0.0, type=kind))
    last = {word: i for i, word in enumerate(words)}
    for i, word in enumerate(words):
        if last[word] == i:
            model.pieces.append(Piece(piece=WORD_BOUNDARY + word, score=0.0, type=Piece.NORMAL))
        else:
            model.pieces.append(Piece(piece=f"<overwritten:{word}:{len(model.pieces)}>", score=0.0,
                                      type=Piece.CONTROL))
    return model.SerializeToString()
