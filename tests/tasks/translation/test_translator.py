"""Translator (text in, text out) and the `translate` command, on a tiny random model whose
SentencePiece model is trained in a fixture on generated text."""

from __future__ import annotations

import copy
import dataclasses
import io
import logging
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from multibranch.cli import main
from multibranch.config import ConfigError
from multibranch.data.tokenizer import EOS_ID
from multibranch.experiment.decoding import DecodeConfig
from multibranch.tasks.translation import translator as translator_module
from multibranch.tasks.translation.translator import Translator, make_batches
from tests.helpers.translation import MAX_POSITIONS, corpus_lines, translator_of

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py



@pytest.fixture
def translator(tokenizer, experiment) -> Translator:
    config, model = experiment
    return Translator(model, tokenizer, config.decode)


LINES = corpus_lines(12, seed=5)


def _on(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The fixture's model for `device`: itself on the CPU, else a copy there (a Translator moves the model it
    is given, and the module's other tests share this one on the CPU)."""
    return model if device.type == "cpu" else copy.deepcopy(model).to(device)


# ---- the library ---------------------------------------------------------------------------------


def test_order_is_restored_and_batching_does_not_change_results(tokenizer, experiment, device):
    config, model = experiment
    translator = Translator(_on(model, device), tokenizer, config.decode, device)
    batched = translator.translate(LINES)
    assert len(batched) == len(LINES)
    one_by_one = [translator.translate([line])[0] for line in LINES]
    assert batched == one_by_one
    assert len(set(batched)) > 1  # different inputs, different outputs (the test can tell order apart)


def test_either_engine_runs_anywhere_and_searches_alike(tokenizer, experiment, device):
    """decode.fixed_shapes picks the engine on any device: "on" and "off" find the same n-best lists (scores
    to float rounding), "auto" picks the fixed shapes on CUDA only; the sampler follows the same choice."""
    config, model = experiment
    model = _on(model, device)
    results = {}
    for engine in ("on", "off", "auto"):
        cfg = DecodeConfig(**{**config.decode.__dict__, "beam": 3, "nbest": 2, "fixed_shapes": engine})
        translator = Translator(model, tokenizer, cfg, device)
        fixed = engine == "on" or (engine == "auto" and device.type == "cuda")
        assert (translator.searcher is not None) == fixed and (translator.sampler is not None) == fixed
        results[engine] = translator.translate_nbest(LINES[:6], 2)
    for on, off in zip(results["on"], results["off"], strict=True):
        assert [text for text, _ in on] == [text for text, _ in off]
        assert [score for _, score in on] == pytest.approx([score for _, score in off], abs=1e-4)
    assert DecodeConfig(fixed_shapes="on").validate() is None
    with pytest.raises(ConfigError, match=r"fixed_shapes: 'sometimes' is not one of \['auto', 'on', 'off'\]"):
        DecodeConfig(fixed_shapes="sometimes").validate()  # type: ignore[arg-type]


def test_a_beam_wider_than_the_target_vocabulary_is_refused_and_one_as_wide_decodes(tokenizer, experiment):
    config, model = experiment
    vocabulary = model.config.tgt_vocab_size
    with pytest.raises(ConfigError, match=f"beam={vocabulary + 1} is more than the model's {vocabulary} target tokens"):
        Translator(model, tokenizer, dataclasses.replace(config.decode, beam=vocabulary + 1, nbest=1))
    widest = Translator(model, tokenizer, dataclasses.replace(config.decode, beam=vocabulary, nbest=vocabulary))
    (hypotheses,) = widest.translate_nbest(LINES[:1], vocabulary)
    assert 1 <= len(hypotheses) <= vocabulary


def test_empty_and_whitespace_lines_give_empty_outputs_without_the_model(translator, monkeypatch):
    def no_search(*args, **kwargs):
        raise AssertionError("the model must not run for empty input")

    monkeypatch.setattr(translator_module, "search", no_search)
    assert translator.translate(["", "   ", "\t", "\u3000"]) == ["", "", "", ""]
    assert translator.translate_nbest(["", " "], 2) == [[("", 0.0)], [("", 0.0)]]


def test_one_output_per_input_with_mixed_empty_lines(translator):
    lines = ["", LINES[0], " ", LINES[1], ""]
    out = translator.translate(lines)
    assert len(out) == 5 and out[0] == out[2] == out[4] == ""
    assert out[1] == translator.translate([LINES[0]])[0] and out[3] == translator.translate([LINES[1]])[0]


def test_over_long_inputs_are_truncated_with_one_warning_naming_the_lines(translator, caplog):
    long_line = " ".join(LINES)  # far more than MAX_POSITIONS pieces
    keep, ids, truncated = translator.encode([long_line, LINES[0], long_line])
    assert truncated == [0, 2] and [len(x) for x in ids][0] == MAX_POSITIONS and ids[0][-1] == EOS_ID
    with caplog.at_level(logging.WARNING, logger="multibranch.tasks.translation.translator"):
        out = translator.translate([long_line, LINES[0], long_line], first_line=41)
    assert len(out) == 3 and out[0] == out[2]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("input lines 41, 43: ")
    assert f"limit of {MAX_POSITIONS} tokens" in warnings[0]


def test_sinusoidal_positions_limit_the_input_at_max_positions_too(tokenizer, experiment):
    """A sinusoidal model takes max_positions source tokens, as a learned one: its table would extend, but the
    model never saw such positions (and a line of thousands of tokens took minutes)."""
    import dataclasses

    config, model = experiment
    sinusoidal = dataclasses.replace(config.model, positions="sinusoidal", max_positions=10)
    limits = [translator_module.input_limit(sinusoidal, DecodeConfig(max_input_tokens=n)) for n in (None, 6, 40)]
    assert limits == [10, 6, 10]
    assert translator_module.input_limit(dataclasses.replace(sinusoidal, positions="none"), DecodeConfig()) == 10


def test_a_stream_names_a_long_line_by_its_number_in_the_whole_input(translator, caplog):
    """Chunks of 2 lines: the long line 5 is named 5, not 1 (its place in its chunk)."""
    from multibranch.tasks.translation.files import translate_stream

    short = min(LINES, key=len)
    text = "\n".join([short, short, short, short, " ".join(LINES), short]) + "\n"
    sink = io.BytesIO()
    with caplog.at_level(logging.WARNING):
        assert translate_stream(translator, io.BytesIO(text.encode()), sink, "in.txt", "strict", 1,
                                chunk_lines=2) == 6
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("input line 5: ")
    assert len(sink.getvalue().decode().splitlines()) == 6


def test_max_input_tokens_setting(tokenizer, experiment):
    config, model = experiment
    short = Translator(model, tokenizer, DecodeConfig(beam=2, max_input_tokens=5))
    _, ids, truncated = short.encode([LINES[0]])
    assert len(ids[0]) == 5 and truncated == [0]


def test_nbest_is_sorted_and_starts_with_the_best(translator):
    nbest = translator.translate_nbest(LINES[:4], 3)
    best = translator.translate(LINES[:4])
    for entries, top in zip(nbest, best, strict=True):
        assert 1 <= len(entries) <= 3 and entries[0][0] == top
        scores = [score for _, score in entries]
        assert scores == sorted(scores, reverse=True)
    with pytest.raises(ValueError):
        translator.translate_nbest(LINES[:1], 4)


@given(
    lengths=st.lists(st.integers(1, 50), max_size=40).map(lambda xs: sorted(xs, reverse=True)),
    beam=st.integers(1, 5),
    batch_tokens=st.integers(1, 400),
    batch_size=st.integers(1, 10),
)
def test_make_batches_covers_everything_within_budget(lengths, beam, batch_tokens, batch_size):
    batches = make_batches(lengths, beam, batch_tokens, batch_size)
    assert [i for b in batches for i in b] == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= batch_size
        assert len(b) == 1 or lengths[b[0]] * len(b) * beam <= batch_tokens


# ---- the command ---------------------------------------------------------------------------------


def test_cli_file_to_file_matches_the_library(checkpoint, tokenizer, experiment, tmp_path, device):
    config, model = experiment
    raw = "\r\n".join([LINES[0], "", LINES[1] + " \u2028 " + LINES[2], "   ", LINES[3]]).encode() + b"\r\n"
    src = tmp_path / "in.txt"
    src.write_bytes(raw)
    out = tmp_path / "out.txt"
    assert main(["translate", "--ckpt", str(checkpoint), "-i", str(src), "-o", str(out), "--beam", "2",
                 "--device", device.type]) == 0
    lines = out.read_bytes().decode().split("\n")
    assert lines[-1] == "" and len(lines) == 6  # 5 lines, each ending in "\n"
    expected = Translator(_on(model, device), tokenizer, DecodeConfig(**{**config.decode.__dict__,
                                                                         "beam": 2}),
                          device).translate(
        [LINES[0], "", LINES[1] + " \u2028 " + LINES[2], "   ", LINES[3]])
    assert lines[:-1] == expected


def test_cli_fixed_shapes_on_and_off_translate_alike(checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES[:5]) + "\n", encoding="utf-8")
    outputs = {}
    for engine in ("on", "off"):
        out = tmp_path / f"out.{engine}.txt"
        assert main(["translate", "--ckpt", str(checkpoint), "-i", str(src), "-o", str(out), "--beam", "3",
                     "--device", "cpu", "--fixed-shapes", engine]) == 0
        outputs[engine] = out.read_text(encoding="utf-8")
    assert outputs["on"] == outputs["off"] and len(outputs["on"].splitlines()) == 5


def test_cli_stdin_to_stdout_stays_clean(checkpoint, monkeypatch, capsys, caplog):
    data = ("\n".join(LINES[:3]) + "\n").encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    with caplog.at_level(logging.INFO):
        assert main(["translate", "--ckpt", str(checkpoint), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.split("\n")) == 4 and "|" not in captured.out  # translations only
    assert any("sentences/s" in r.getMessage() and "tokens/s" in r.getMessage() for r in caplog.records)


def test_cli_nbest_format(checkpoint, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("\n".join([LINES[0], "", LINES[1]]) + "\n", encoding="utf-8")
    assert main(["translate", "--ckpt", str(checkpoint), "-i", str(src), "--nbest", "3", "--device", "cpu"]) == 0
    rows = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    assert all(len(r) == 3 for r in rows)
    indices = [int(r[0]) for r in rows]
    assert indices == sorted(indices) and set(indices) == {0, 1, 2}
    for i in (0, 2):
        scores = [float(r[2]) for r in rows if int(r[0]) == i]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert [r[1] for r in rows if r[0] == "1"] == [""]


def test_cli_invalid_utf8_names_the_line_or_is_replaced(checkpoint, tmp_path, capsys):
    src = tmp_path / "bad.txt"
    src.write_bytes(LINES[0].encode() + b"\nabc \xff\xfe def\n" + LINES[1].encode() + b"\n")
    assert main(["translate", "--ckpt", str(checkpoint), "-i", str(src), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"{src}:2: invalid UTF-8" in err and "--encoding-errors replace" in err
    out = tmp_path / "out.txt"
    assert main(["translate", "--ckpt", str(checkpoint), "-i", str(src), "-o", str(out), "--device", "cpu",
                 "--encoding-errors", "replace"]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3


def test_cli_user_errors(checkpoint, tmp_path, capsys):
    assert main(["translate", "--ckpt", str(tmp_path / "missing.pt")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    assert main(["translate", "--ckpt", str(checkpoint), "--beam", "2", "--nbest", "3", "--device", "cpu"]) == 2
    assert "nbest=3 must be between 1 and beam=2" in capsys.readouterr().err


def test_cli_subprocess_pipe(checkpoint):
    data = ("\n".join([LINES[0], "", LINES[1]]) + "\n").encode()
    proc = subprocess.run(
        [sys.executable, "-m", "multibranch", "translate", "--ckpt", str(checkpoint), "--device", "cpu", "--beam", "1", "--threads", "1"],
        input=data, capture_output=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().count("\n") == 3 and proc.stdout.decode().split("\n")[1] == ""
    assert b"sentences/s" in proc.stderr


def test_from_checkpoint_applies_overrides(checkpoint, translator):
    loaded = translator_of(str(checkpoint), device="cpu", beam=2)
    assert loaded.cfg.beam == 2 and loaded.cfg.max_len_b == translator.cfg.max_len_b
    direct = Translator(translator.model, translator.tokenizer, DecodeConfig(**{**translator.cfg.__dict__,
                                                                                "beam": 2}))
    assert loaded.translate(LINES[:3]) == direct.translate(LINES[:3])


# ---- outputs never lose data ----------------------------------------------------------------------


def _translate(checkpoint, *args: str) -> int:
    return main(["translate", "--ckpt", str(checkpoint), "--device", "cpu", "--beam", "1", *args])


def test_cli_refuses_output_equal_to_input_by_any_path(checkpoint, tmp_path, capsys):
    """Regression: `translate -i X -o X` emptied X and exited 0."""
    src = tmp_path / "in.txt"
    content = ("\n".join(LINES[:3]) + "\n").encode()
    src.write_bytes(content)
    (tmp_path / "link.txt").symlink_to(src)
    (tmp_path / "sub").mkdir()
    for out in (src, tmp_path / "link.txt", tmp_path / "sub" / ".." / "in.txt"):
        assert _translate(checkpoint, "-i", str(src), "-o", str(out)) == 2
        err = capsys.readouterr().err
        assert "same file as input" in err and len(err.strip().splitlines()) == 1
        assert src.read_bytes() == content


def test_cli_failure_leaves_an_existing_output_untouched(checkpoint, tmp_path, capsys):
    """Regression: an input encoding error with -o EXISTING truncated EXISTING."""
    src = tmp_path / "bad.txt"
    src.write_bytes(LINES[0].encode() + b"\nabc \xff def\n")
    out = tmp_path / "out.txt"
    out.write_bytes(b"previous translations\n")
    assert _translate(checkpoint, "-i", str(src), "-o", str(out)) == 2
    assert "invalid UTF-8" in capsys.readouterr().err
    assert out.read_bytes() == b"previous translations\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "out.txt"]  # no temporary left behind


def test_cli_user_errors_before_the_model_is_loaded(checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU-only build (CI's) on every machine
    assert _translate(checkpoint, "--device", "cuda") == 2
    err = capsys.readouterr().err
    assert "--device cuda: this PyTorch build" in err and len(err.strip().splitlines()) == 1
    assert _translate(checkpoint, "-i", str(tmp_path)) == 2
    assert f"{tmp_path}: is a directory" in capsys.readouterr().err
    assert _translate(checkpoint, "-i", str(tmp_path / "missing.txt")) == 2
    assert "file not found" in capsys.readouterr().err


# ---- progress bar, interactive mode -----------------------------------------------------------------


def test_progress_bar_only_when_asked(translator, capsys):
    translator.translate(LINES[:4])
    assert capsys.readouterr().err == ""
    translator.translate(LINES[:4], progress=True)
    assert "0/4 [" in capsys.readouterr().err  # tqdm's "done/total [elapsed<remaining" (the bar is cleared at the end)


def test_cli_progress_bar_on_a_terminal_only(checkpoint, tmp_path, capsys, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES[:5]) + "\n", encoding="utf-8")
    assert _translate(checkpoint, "-i", str(src)) == 0
    assert "/5" not in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert _translate(checkpoint, "-i", str(src), "-o", str(tmp_path / "out.txt")) == 0
    assert "0/5 [" in capsys.readouterr().err  # lines done / total known from the file
    assert _translate(checkpoint, "-i", str(src), "--no-progress", "-o", str(tmp_path / "out2.txt")) == 0
    assert "/5" not in capsys.readouterr().err


def _subprocess(checkpoint, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "multibranch", "translate", "--ckpt", str(checkpoint), "--device", "cpu",
         "--beam", "1", "--threads", "1", *args], **kwargs)


def test_cli_no_stray_progress_output_without_a_terminal(checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES[:5]) + "\n", encoding="utf-8")
    proc = _subprocess(checkpoint, "-i", str(src), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.decode().count("\n") == 5
    assert b"\r" not in err and b"5/5" not in err and b"it/s" not in err  # only log lines, no bar


def test_cli_interactive_answers_each_line_before_the_next_is_sent(checkpoint, translator):
    proc = _subprocess(checkpoint, "--interactive", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    expected = Translator(translator.model, translator.tokenizer,
                          DecodeConfig(**{**translator.cfg.__dict__, "beam": 1})).translate(LINES[:3] + [""])
    try:
        for line, want in zip(LINES[:3] + [""], expected, strict=True):
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            assert proc.stdout.readline().decode() == want + "\n"  # blocks unless the answer was flushed
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read() == b""
        assert b"Ctrl-D" in proc.stderr.read()  # the banner is on stderr only
    finally:
        proc.kill()
        proc.wait()


# ---- broken pipe --------------------------------------------------------------------------------------


def test_cli_closed_pipe_exits_quietly(checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES[:3]) + "\n", encoding="utf-8")
    proc = _subprocess(checkpoint, "-i", str(src), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader goes away before the first line is written (`| head -0`)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1
    assert b"Traceback" not in err and b"BrokenPipeError" not in err and b"Exception ignored" not in err


# ---- forced decoding (--score-reference) --------------------------------------------------------------


@pytest.mark.parametrize("alpha,kind", [(1.0, "fairseq"), (0.6, "gnmt")])
def test_forced_scores_reproduce_the_greedy_search(experiment, alpha, kind, device):
    from multibranch.inference.beam import forced_scores, greedy_search, length_penalty

    model = _on(experiment[1], device)
    torch.manual_seed(0)
    src = torch.randint(4, model.config.src_vocab_size, (5, 7))
    src[1, 4:] = model.config.pad_id  # a shorter sentence in the batch
    src[0, 6] = src[1, 3] = EOS_ID
    src = src.to(device)
    hyps = [h[0] for h in greedy_search(model, src, DecodeConfig(length_penalty=alpha,
                                                                 length_penalty_kind=kind, max_len_a=1.0, max_len_b=4))]
    assert len({len(h.tokens) for h in hyps}) > 1  # different lengths: padding in the forced batch matters
    lprobs = forced_scores(model, src, [h.tokens + [EOS_ID] for h in hyps])
    for hyp, forced in zip(hyps, lprobs, strict=True):
        assert forced == pytest.approx(hyp.positional_scores, abs=1e-5)
        total = sum(forced)
        assert total / length_penalty(len(forced), alpha, kind) == pytest.approx(hyp.score, abs=1e-5)


def test_cli_score_reference_of_the_greedy_output(checkpoint, tokenizer, translator, tmp_path):
    from multibranch.inference.search import search

    cfg = DecodeConfig(**{**translator.cfg.__dict__, "beam": 1})
    greedy = Translator(translator.model, tokenizer, cfg)
    lines = [line for line in corpus_lines(60, seed=11) if len(line.split()) <= 3][:6] + [""]  # outputs fit 24 positions
    _, sources, _ = greedy.encode(lines[:-1])
    hyps = [search(greedy.model, torch.tensor([ids]), cfg)[0][0] for ids in sources]
    texts = tokenizer.decode_tgt([h.tokens for h in hyps])
    src, ref, out = tmp_path / "in.txt", tmp_path / "ref.txt", tmp_path / "scores.tsv"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ref.write_text("".join(text + "\n" for text in texts) + "\n", encoding="utf-8")
    assert _translate(checkpoint, "-i", str(src), "--score-reference", str(ref), "-o", str(out)) == 0
    rows = out.read_text(encoding="utf-8").split("\n")
    assert len(rows) == len(lines) + 1 and rows[-2] == "" and rows[-1] == ""  # empty input -> empty line
    checked = 0
    for hyp, text, row in zip(hyps, texts, rows, strict=False):
        score, logprob, tokens = row.split("\t")
        if tokenizer.encode_tgt([text])[0] == hyp.tokens:  # the text encodes back to the searched ids
            assert int(tokens) == len(hyp.tokens) + 1
            assert float(logprob) == pytest.approx(sum(hyp.positional_scores), abs=1e-5)
            assert float(score) == pytest.approx(hyp.score, abs=1e-5)
            checked += 1
    assert checked >= 3


def test_cli_score_reference_line_count_mismatch_writes_nothing(checkpoint, tmp_path, capsys):
    src, ref, out = tmp_path / "in.txt", tmp_path / "ref.txt", tmp_path / "scores.tsv"
    src.write_text("\n".join(LINES[:3]) + "\n", encoding="utf-8")
    ref.write_text("\n".join(LINES[:2]) + "\n", encoding="utf-8")
    out.write_bytes(b"old\n")
    assert _translate(checkpoint, "-i", str(src), "--score-reference", str(ref), "-o", str(out)) == 2
    err = capsys.readouterr().err
    assert "line counts differ" in err and "has 3 lines" in err and "has 2" in err
    assert out.read_bytes() == b"old\n"


def test_cli_is_interactive_by_default_on_a_terminal_only(checkpoint, tmp_path, monkeypatch, capsys):
    def terminal_stdin() -> io.TextIOWrapper:
        stdin = io.TextIOWrapper(io.BytesIO(("\n".join(LINES[:2]) + "\n").encode()), encoding="utf-8")
        stdin.isatty = lambda: True  # type: ignore[method-assign]
        return stdin

    monkeypatch.setattr(sys, "stdin", terminal_stdin())
    assert _translate(checkpoint) == 0
    captured = capsys.readouterr()
    assert "Ctrl-D" in captured.err and captured.out.count("\n") == 2
    monkeypatch.setattr(sys, "stdin", terminal_stdin())
    assert _translate(checkpoint, "-o", str(tmp_path / "out.txt")) == 0  # -o: a batch run reading stdin
    assert "Ctrl-D" not in capsys.readouterr().err
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 2


def test_cli_no_repeat_ngram_size_reaches_the_search(checkpoint, experiment, tokenizer, tmp_path, capsys):
    config, model = experiment
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES[:4]) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    assert main(["translate", "--ckpt", str(checkpoint), "-i", str(src), "-o", str(out), "--beam", "2",
                 "--no-repeat-ngram-size", "1", "--device", "cpu"]) == 0
    decode = {**config.decode.__dict__, "beam": 2}
    blocked = Translator(model, tokenizer, DecodeConfig(**{**decode,
                                                           "no_repeat_ngram_size": 1})).translate(LINES[:4])
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == blocked
    assert blocked != Translator(model, tokenizer, DecodeConfig(**decode)).translate(LINES[:4])  # it mattered
    assert main(["translate", "--ckpt", str(checkpoint), "-i", str(src), "--no-repeat-ngram-size", "-1",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--no-repeat-ngram-size -1: must be >= 0" in err and "\n" not in err
