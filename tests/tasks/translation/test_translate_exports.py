"""`multibranch translate --ckpt DIR` on the two export directories: `convert export` (a release read
back by checkpoint/export.py) translates exactly as the original checkpoint; `convert ct2` (decoded by
CTranslate2) equals CTranslate2's own `translate_batch` on the directory, and our beam search on the
original checkpoint wherever it ends before the length limit. A directory missing a file is one line,
exit 2, nothing written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from multibranch.cli import main
from tests.helpers.translation import corpus_lines

DECODE_ARGS = ("--min-len", "0", "--max-len-a", "1", "--max-len-b", "6", "--nbest", "3", "--beam", "3")


@pytest.fixture(scope="module")
def lines(tokenizer) -> list[str]:
    """Inputs whose translations fit the tiny model's 24 learned positions (at most 9 pieces: output limit
    1 * 10 + 6), with an empty line among them."""
    short = [line for line in corpus_lines(80, seed=31) if len(tokenizer.encode_src([line])[0]) <= 9][:10]
    assert len(short) == 10
    return [*short[:3], "", *short[3:]]


@pytest.fixture(scope="module")
def ending(checkpoint, lines, tmp_path_factory) -> tuple[Path, dict[int, list[tuple[str, float]]]]:
    """The tiny random model with its EOS output bias raised until our beam search ends before the
    length limit on at least 4 lines with non-empty output (random models either stop at once or
    never), saved as a checkpoint; with those lines' n-best by our beam search."""
    from multibranch.checkpoint.format import load_checkpoint, save_checkpoint

    payload = load_checkpoint(checkpoint)
    eos = payload["config"]["model"]["eos_id"]
    path = tmp_path_factory.mktemp("ending") / "ending.pt"
    for raise_by in (2.0 + 0.25 * i for i in range(9)):  # below 2 it never stops, above 4 at once
        bias = payload["model"]["output_bias"].clone()
        bias[eos] += raise_by
        save_checkpoint(path, {**payload, "model": {**payload["model"], "output_bias": bias}})
        natural = _natural_ends(path, lines)
        if sum(1 for entries in natural.values() if entries[0][0]) >= 4:
            return path, natural
    raise AssertionError("no EOS bias gives natural ends; the test needs other inputs")


def _translate(ckpt: Path, lines: list[str], tmp_path: Path, name: str, *extra: str,
               decode: tuple[str, ...] = DECODE_ARGS) -> list[str]:
    """`translate` of `lines` with `decode` and `extra` options; the output lines."""
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / name
    assert main(["translate", "--ckpt", str(ckpt), "-i", str(source), "-o", str(out), "--device", "cpu",
                 "--no-progress", *decode, *extra]) == 0
    return out.read_text(encoding="utf-8").splitlines()


def _rows(lines: list[str]) -> dict[int, list[tuple[str, float]]]:
    """n-best rows 'index ||| text ||| score' grouped by input line."""
    rows: dict[int, list[tuple[str, float]]] = {}
    for line in lines:
        index, text, score = line.split(" ||| ")
        rows.setdefault(int(index), []).append((text, float(score)))
    return rows


def test_convert_export_directory_translates_as_its_checkpoint(ending, lines, tmp_path):
    checkpoint, _ = ending
    release = tmp_path / "release"
    assert main(["convert", "export", "--ckpt", str(checkpoint), "--out", str(release)]) == 0
    assert _translate(release, lines, tmp_path, "export.txt") == _translate(checkpoint, lines, tmp_path, "ckpt.txt")
    one_best = _translate(release, lines, tmp_path, "export1.txt", "--nbest", "1", "--precision", "int8")
    assert len(one_best) == len(lines) and one_best[3] == ""


def test_fp16_export_directory_translates_as_its_checkpoint_rounded_to_fp16(ending, lines, tmp_path):
    """`convert export --dtype fp16` stores rounded weights: translating the directory equals translating a
    checkpoint whose floating-point weights were rounded to fp16 by hand (an independent rounding)."""
    from multibranch.checkpoint.format import load_checkpoint, save_checkpoint

    checkpoint, _ = ending
    release = tmp_path / "release16"
    assert main(["convert", "export", "--ckpt", str(checkpoint), "--out", str(release), "--dtype", "fp16"]) == 0
    payload = load_checkpoint(checkpoint)
    rounded = tmp_path / "rounded.pt"
    save_checkpoint(rounded, {**payload, "model": {k: v.half().float() if v.is_floating_point() else v
                                                   for k, v in payload["model"].items()}})
    assert _translate(release, lines, tmp_path, "fp16.txt") == _translate(rounded, lines, tmp_path, "rounded.txt")


# ---- CTranslate2 --------------------------------------------------------------------------------


def _ct2_dir(checkpoint: Path, tmp_path: Path) -> Path:
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'multibranch[ct2]')")
    directory = tmp_path / "ct2"
    assert main(["convert", "ct2", "--ckpt", str(checkpoint), "--out", str(directory)]) == 0
    return directory


@pytest.fixture
def ct2_dir(checkpoint, tmp_path) -> Path:
    return _ct2_dir(checkpoint, tmp_path)


def _natural_ends(checkpoint: Path, lines: list[str]) -> dict[int, list[tuple[str, float]]]:
    """Our beam search on the checkpoint, one line at a time: the n-best of every line whose hypotheses
    all end before the length limit (at the limit ours forces EOS, CTranslate2 keeps its best tokens)."""
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.inference.search import search
    from multibranch.loading.checkpoint import load_model

    loaded = load_model(checkpoint, "cpu", task="translation")
    decode = DecodeConfig(beam=3, length_penalty=loaded.config.decode.length_penalty, max_len_a=1, max_len_b=6,
                          min_len=0)
    out = {}
    for index, line in enumerate(lines):
        if not line:
            continue
        ids = loaded.tokenizer.encode_src([line])[0]
        with torch.inference_mode():
            hyps = search(loaded.model, torch.tensor([[*ids, loaded.config.model.eos_id]]), decode, nbest=3)[0]
        if all(len(h.tokens) < len(ids) + 1 + 6 for h in hyps):
            out[index] = [(text, h.score) for text, h in zip(loaded.tokenizer.decode_tgt([h.tokens for h in hyps]),
                                                             hyps, strict=True)]
    return out


def test_ct2_directory_equals_ctranslate2_and_our_beam_search(ending, lines, tmp_path):
    import ctranslate2
    import sentencepiece as spm

    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.tasks.translation.ct2 import max_decoding_length, translate_options

    checkpoint, ours = ending
    ct2_dir = _ct2_dir(checkpoint, tmp_path)
    got = _rows(_translate(ct2_dir, lines, tmp_path, "ct2.txt"))
    assert got[3] == [("", 0.0)]  # the empty line: one empty row, the model never ran

    # independent: CTranslate2 itself on the directory, one sentence at a time
    settings = json.loads((ct2_dir / "multibranch_ct2.json").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(ct2_dir / settings["tokenizer"]["src"]))
    direct = ctranslate2.Translator(str(ct2_dir), intra_threads=1)
    decode = DecodeConfig(**{**settings["decode"], "beam": 3, "nbest": 3, "min_len": 0, "max_len_a": 1,
                             "max_len_b": 6})
    for index, line in enumerate(lines):
        if not line:
            continue
        pieces = sp.encode(line, out_type=str)
        result = direct.translate_batch([pieces], max_decoding_length=max_decoding_length(decode, len(pieces)),
                                        **translate_options(decode))[0]
        texts = [sp.decode_pieces(h[:-1] if h[-1] == "</s>" else h) for h in result.hypotheses]
        assert [text for text, _ in got[index]] == texts, index
        assert all(math.isclose(a, b, abs_tol=1e-5) for (_, a), b in zip(got[index], result.scores)), index

    # the library's loader gives the same translator
    from tests.helpers.translation import translator_of

    loaded = translator_of(ct2_dir, "cpu", beam=3, min_len=0, max_len_a=1, max_len_b=6)
    direct_rows = {i: [(text, round(score, 6)) for text, score in entries]
                   for i, entries in enumerate(loaded.translate_nbest(lines, 3))}
    assert direct_rows == got  # the CLI prints scores with 6 decimals

    # our beam search on the original checkpoint: same n-best, token for token, same scores
    for index, expected in ours.items():
        assert [text for text, _ in got[index]] == [text for text, _ in expected], index
        assert all(math.isclose(a, b, abs_tol=1e-4) for (_, a), (_, b) in zip(got[index], expected)), index


def test_ct2_directory_scores_references_as_the_checkpoint(checkpoint, ct2_dir, lines, tmp_path):
    """--score-reference: CTranslate2's score_batch equals our forced decoding (min_len 0 on both)."""
    reference = tmp_path / "ref.txt"
    reference.write_text("\n".join(line[::-1] if line else "x" for line in lines) + "\n", encoding="utf-8")
    ours = _translate(checkpoint, lines, tmp_path, "ours.txt", "--score-reference", str(reference), "--nbest", "1")
    theirs = _translate(ct2_dir, lines, tmp_path, "theirs.txt", "--score-reference", str(reference), "--nbest", "1")
    assert ours[3] == theirs[3] == ""
    for a, b in zip(ours, theirs, strict=True):
        if a:
            (sa, la, ta), (sb, lb, tb) = a.split("\t"), b.split("\t")
            assert ta == tb and math.isclose(float(la), float(lb), abs_tol=1e-4), (a, b)
            assert math.isclose(float(sa), float(sb), abs_tol=1e-4), (a, b)


def _refused(directory, tmp_path, capsys, *argv: str) -> str:
    """`translate --ckpt directory` on one line: exit 2, nothing written; returns its one error line."""
    source = tmp_path / "in.txt"
    source.write_text("ka lo\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["translate", "--ckpt", str(directory), "-i", str(source), "-o", str(tmp_path / "out.txt"),
                 *argv]) == 2
    assert not (tmp_path / "out.txt").exists()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv", [["--precision", "int8"], ["--lenpen-kind", "gnmt"], ["--code-format", "source"]])
def test_ct2_directory_refuses_what_ctranslate2_cannot_do(argv, ct2_dir, tmp_path, capsys):
    err = _refused(ct2_dir, tmp_path, capsys, *argv)
    assert argv[0] in err and "CTranslate2" in err, err


@pytest.mark.parametrize("missing", ["model.bin", "shared_vocabulary.json", "sentencepiece.model", "config.json"])
def test_ct2_directory_missing_a_file_is_one_line(missing, ct2_dir, tmp_path, capsys):
    (ct2_dir / missing).unlink()
    err = _refused(ct2_dir, tmp_path, capsys)
    assert f"missing {missing}" in err and "incomplete CTranslate2 directory" in err, err


@pytest.mark.parametrize("missing", ["model.safetensors", "sentencepiece.model", "config.json"])
def test_export_directory_missing_a_file_is_one_line(missing, checkpoint, tmp_path, capsys):
    release = tmp_path / "release"
    assert main(["convert", "export", "--ckpt", str(checkpoint), "--out", str(release)]) == 0
    (release / missing).unlink()
    err = _refused(release, tmp_path, capsys)
    assert missing in err, err


@pytest.mark.slow
def test_trained_model_through_ct2_serve_engine_and_checkpoint(tiny_data, tmp_path):
    """A tiny transformer trained 100 updates: `translate` on its `convert ct2` directory equals serve's ct2
    engine on every line, and `translate` on the checkpoint on every line whose output ends before the limit."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'multibranch[ct2]')")
    from multibranch.serve.engine import Ct2Engine
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions
    from tests.helpers.configs import tiny_experiment
    from tests.helpers.translation import translator_of

    train(tiny_experiment(max_steps=100, valid_every=100), RunOptions(tiny_data, tmp_path / "run", device="cpu",
                                                                       progress=False))
    checkpoint = tmp_path / "run" / "last.pt"
    lines = (tiny_data.parent / "raw" / "test.src").read_text(encoding="utf-8").splitlines()[:16]
    decode = ("--beam", "4", "--min-len", "0", "--max-len-a", "1.2", "--max-len-b", "10", "--nbest", "1")
    directory = _ct2_dir(checkpoint, tmp_path)
    got = _translate(directory, lines, tmp_path, "ct2.txt", decode=decode)
    stored = _translate(directory, lines, tmp_path, "stored.txt", decode=())
    engine = Ct2Engine(str(directory))  # serve's engine: the directory's stored decode settings, as plain translate
    assert stored == [hyps[0][0] for hyps in engine.translate(lines, engine.default_beam, 1)]
    expected = _translate(checkpoint, lines, tmp_path, "ours.txt", decode=decode)
    ours = translator_of(checkpoint, "cpu", beam=4, min_len=0, max_len_a=1.2, max_len_b=10)
    limits = [int(1.2 * (len(ids) + 1) + 10) for ids in ours.tokenizer.encode_src(lines)]
    lengths = [len(ids) for ids in ours.tokenizer.encode_tgt(expected)]
    natural = [i for i, (n, limit) in enumerate(zip(lengths, limits, strict=True)) if n < limit - 2]
    assert len(natural) >= len(lines) // 2, "too few natural ends to compare"
    assert [got[i] for i in natural] == [expected[i] for i in natural]
