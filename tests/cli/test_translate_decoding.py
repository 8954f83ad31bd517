"""`multibranch translate` with ensembles, sampling, prefixes and alignments (docs/decoding.md), and
their bad inputs: one clear line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from multibranch.checkpoint.format import load_checkpoint, save_checkpoint
from multibranch.cli import main
from multibranch.modules.packed_linear import int8_supported
from tests.helpers.cli import one_error_line
from tests.helpers.translation import corpus_lines

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

LINES = corpus_lines(6, seed=11)


def translate(*args: str) -> int:
    return main(["translate", "--device", "cpu", "--no-progress", *args])


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "src.txt"
    path.write_text("\n".join(LINES[:3] + [""] + LINES[3:]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def other_checkpoint(checkpoint, tmp_path_factory) -> Path:
    """The `checkpoint` model with perturbed weights (same tokenizer and vocabulary)."""
    payload = load_checkpoint(checkpoint)
    torch.manual_seed(1)
    payload["model"] = {k: v + 0.3 * torch.randn_like(v) if v.is_floating_point() else v
                        for k, v in payload["model"].items()}
    path = tmp_path_factory.mktemp("other") / "other.pt"
    save_checkpoint(path, payload)
    return path


def run(tmp_path: Path, name: str, *args: str) -> list[str]:
    out = tmp_path / name
    assert translate(*args, "-o", str(out)) == 0
    return out.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("extra", [[], ["--nbest", "3"], ["--precision", "int8"]])
def test_an_ensemble_of_one_or_two_copies_equals_the_model(checkpoint, source, tmp_path, extra):
    if "int8" in extra and not int8_supported():
        pytest.skip("no fbgemm int8 kernels")
    base = ["-i", str(source), "--beam", "3", *extra]
    single = run(tmp_path, "single", "--ckpt", str(checkpoint), *base)
    copies = run(tmp_path, "copies", "--ckpt", str(checkpoint), str(checkpoint), *base)
    assert [line.rsplit(" ||| ", 1)[0] for line in copies] == [line.rsplit(" ||| ", 1)[0] for line in single]
    assert len(single) == len(LINES) * (3 if "--nbest" in extra else 1) + 1


def test_an_ensemble_scores_a_reference_as_the_log_mean_probability(checkpoint, other_checkpoint, source, tmp_path):
    reference = tmp_path / "ref.txt"
    reference.write_text("\n".join(["ka lo", "mi ne su", "ta", "", "ri po ve", "da ka", "lo lo"]) + "\n",
                         encoding="utf-8")
    base = ["-i", str(source), "--score-reference", str(reference), "--lenpen", "0"]
    single = run(tmp_path, "a", "--ckpt", str(checkpoint), *base)
    other = run(tmp_path, "b", "--ckpt", str(other_checkpoint), *base)
    both = run(tmp_path, "ab", "--ckpt", str(checkpoint), str(other_checkpoint), *base)
    two = run(tmp_path, "aa", "--ckpt", str(checkpoint), str(checkpoint), *base)
    for copy_line, line in zip(two, single, strict=True):  # two copies: the model's log-probability, to rounding
        assert copy_line.split("\t")[2:] == line.split("\t")[2:]
        if line:
            assert float(copy_line.split("\t")[1]) == pytest.approx(float(line.split("\t")[1]), abs=1e-5)
    # per token log((p + q) / 2) >= (log p + log q) / 2 (concavity), so the sum is too; strict for distinct models
    for a, b, ab in zip(single, other, both, strict=True):
        if a:
            assert float(ab.split("\t")[1]) > (float(a.split("\t")[1]) + float(b.split("\t")[1])) / 2


def test_ensemble_members_of_another_vocabulary_are_refused(checkpoint, source, tmp_path, capsys):
    payload = load_checkpoint(checkpoint)
    payload["config"]["model"]["src_vocab_size"] += 4
    payload["config"]["model"]["tgt_vocab_size"] += 4
    torch.manual_seed(0)
    payload["model"] = {k: torch.randn(v.shape[0] + 4, *v.shape[1:]) if v.shape and v.shape[0] == 48 else v
                        for k, v in payload["model"].items()}
    bigger = tmp_path / "bigger.pt"
    save_checkpoint(bigger, payload)
    out = tmp_path / "out.txt"
    assert translate("--ckpt", str(checkpoint), str(bigger), "-i", str(source), "-o", str(out)) == 2
    err = one_error_line(capsys)
    assert "share one vocabulary" in err and "bigger.pt" in err
    assert not out.exists()


@pytest.mark.parametrize("kind", ["checkpoint", "ct2"])
def test_ensemble_mean_without_an_ensemble_is_refused(checkpoint, source, tmp_path, capsys, kind):
    from multibranch.tasks.translation.ct2 import CT2_SETTINGS_FILE

    model = checkpoint
    if kind == "ct2":  # the settings file is what marks a `convert ct2` directory; refused before loading
        model = tmp_path / "ct2"
        model.mkdir()
        (model / CT2_SETTINGS_FILE).write_text("{}", encoding="utf-8")
    out = tmp_path / "out.txt"
    code = translate("--ckpt", str(model), "--ensemble-mean", "log-prob", "-i", str(source), "-o", str(out))
    assert code == 2
    err = one_error_line(capsys)
    assert "--ensemble-mean log-prob" in err and ("ensemble" in err.split(":", 2)[-1])
    assert not out.exists()


def test_sampling_is_reproducible_for_a_seed_and_gives_n_samples(checkpoint, source, tmp_path):
    base = ["--ckpt", str(checkpoint), "-i", str(source), "--sampling", "--nbest", "4", "--top-k", "10"]
    first = run(tmp_path, "s1", *base, "--seed", "5")
    again = run(tmp_path, "s2", *base, "--seed", "5")
    other = run(tmp_path, "s3", *base, "--seed", "6")
    assert first == again and first != other
    assert len(first) == 4 * len(LINES) + 1  # the empty line gives one row
    indices = [int(line.split(" ||| ")[0]) for line in first]
    assert indices == sorted(indices)


@pytest.mark.parametrize("args,message", [
    (["--sampling", "--top-p", "0"], "--top-p 0.0: must be in (0, 1]"),
    (["--sampling", "--temperature", "-1"], "--temperature -1.0: must be in [0.001, 1000]"),
    (["--top-k", "5"], "--top-k applies only to --sampling; add --sampling or drop it"),
    (["--top-k", "5", "--seed", "1"], "--top-k, --seed apply only to --sampling; add --sampling or drop them"),
    (["--sampling", "--beam", "4"], "drop --beam"),
])
def test_bad_sampling_options_are_one_line_exit_2_nothing_written(checkpoint, source, tmp_path, capsys, args,
                                                                  message):
    out = tmp_path / "out.txt"
    assert translate("--ckpt", str(checkpoint), "-i", str(source), "-o", str(out), *args) == 2
    assert message in one_error_line(capsys)
    assert not out.exists()


def test_prefixes_start_the_translations_and_an_empty_prefix_changes_nothing(checkpoint, source, tmp_path):
    plain = run(tmp_path, "plain", "--ckpt", str(checkpoint), "-i", str(source), "--beam", "3")
    prefixes = tmp_path / "prefix.txt"
    lines = source.read_text(encoding="utf-8").splitlines()
    wanted = ["ka", "", "lo mi", "", "", "ne", ""]
    prefixes.write_text("\n".join(wanted) + "\n", encoding="utf-8")
    got = run(tmp_path, "prefixed", "--ckpt", str(checkpoint), "-i", str(source), "--beam", "3",
              "--prefix", str(prefixes))
    assert len(got) == len(lines)
    for line, prefix, plain_out, out in zip(lines, wanted, plain, got, strict=True):
        if not line:
            assert out == ""
        elif prefix:
            assert out.startswith(prefix)
        else:
            assert out == plain_out


def test_bad_prefix_files_are_one_line_exit_2_nothing_written(checkpoint, source, tmp_path, capsys):
    out = tmp_path / "out.txt"
    short = tmp_path / "short.txt"
    short.write_text("ka\nlo\n", encoding="utf-8")
    assert translate("--ckpt", str(checkpoint), "-i", str(source), "-o", str(out), "--prefix", str(short)) == 2
    assert "line counts differ" in one_error_line(capsys)
    long = tmp_path / "long.txt"
    long.write_text("\n".join(["ka lo mi ne su ta ri po ve da " * 3] * 7) + "\n", encoding="utf-8")
    assert translate("--ckpt", str(checkpoint), "-i", str(source), "-o", str(out), "--prefix", str(long)) == 2
    assert "prefix line 1 has" in one_error_line(capsys)
    assert translate("--ckpt", str(checkpoint), "-i", str(source), "--prefix", str(long), "--max-len-b", "500") == 2
    assert "prefix line 1" in one_error_line(capsys)  # stdout too: nothing printed before the check
    assert not out.exists() and capsys.readouterr().out == ""


def test_print_alignment_writes_the_pairs_of_the_chosen_layer(checkpoint, source, tmp_path):
    """Each pair i-j: for output piece j, the source piece (EOS excluded) with the largest head-mean
    cross-attention of layer 0, as the analysis extractor captures it for the sentence alone."""
    from multibranch.analysis.attention_maps import capture_maps
    from multibranch.analysis.heads import attention_sites
    from multibranch.inference.search import search
    from tests.helpers.translation import translator_of

    got = run(tmp_path, "aligned", "--ckpt", str(checkpoint), "-i", str(source), "--beam", "3", "--print-alignment",
              "--alignment-layer", "0")
    plain = run(tmp_path, "plain", "--ckpt", str(checkpoint), "-i", str(source), "--beam", "3")
    translator = translator_of(checkpoint, beam=3)
    model, cfg = translator.model, translator.model.config
    site = next(s for s in attention_sites(model) if s.role == "cross" and s.layer == 0)
    lines = source.read_text(encoding="utf-8").splitlines()
    for line, out, text in zip(lines, got, plain, strict=True):
        translation, pairs = out.split(" ||| ")
        assert translation == text
        if not line:
            assert pairs == ""
            continue
        src_ids = translator.encode([line])[1][0][:-1]  # as translated (truncated), without EOS
        tgt_ids = search(model, torch.tensor([[*src_ids, cfg.eos_id]]), translator.cfg)[0][0].tokens
        probs = capture_maps(model, src_ids, tgt_ids, [site])[site.name].mean(dim=0)  # [T + 1, S + 1]
        expected = [f"{int(probs[j, : len(src_ids)].argmax())}-{j}" for j in range(len(tgt_ids))]
        assert pairs.split() == expected


def test_alignment_layer_out_of_range_or_alone_is_one_line(checkpoint, source, capsys):
    assert translate("--ckpt", str(checkpoint), "-i", str(source), "--print-alignment", "--alignment-layer", "5") == 2
    assert "--alignment-layer: alignment layer 5: the decoder has layers 0..1" in one_error_line(capsys)
    assert translate("--ckpt", str(checkpoint), "-i", str(source), "--alignment-layer", "0") == 2
    assert "add --print-alignment" in one_error_line(capsys)
    assert capsys.readouterr().out == ""


def test_ensemble_members_with_another_tokenizer_are_refused(checkpoint, source, tmp_path, capsys):
    import io

    import sentencepiece as spm

    from multibranch.data.tokenizer import Tokenizer

    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines(300, seed=99)), model_writer=buffer, vocab_size=48, model_type="bpe",
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    payload = load_checkpoint(checkpoint)
    payload["tokenizer"] = Tokenizer(buffer.getvalue(), buffer.getvalue()).to_state()
    retokenized = tmp_path / "retokenized.pt"
    save_checkpoint(retokenized, payload)
    out = tmp_path / "out.txt"
    assert translate("--ckpt", str(checkpoint), str(retokenized), "-i", str(source), "-o", str(out)) == 2
    err = one_error_line(capsys)
    assert "retokenized.pt has a different tokenizer" in err
    assert not out.exists()


def test_every_decode_setting_has_its_translate_option():
    """DecodeConfig's fields, the table of their options and translate's parser stay in step."""
    import dataclasses

    from multibranch.cli import build_parser
    from multibranch.experiment.decoding import DECODE_OPTIONS, DecodeConfig

    assert set(DECODE_OPTIONS) == {f.name for f in dataclasses.fields(DecodeConfig)}
    parser = build_parser()
    translate = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith("translate"))
    flags = {flag for action in translate._actions for flag in action.option_strings}
    assert {option.flag for option in DECODE_OPTIONS.values()} <= flags
