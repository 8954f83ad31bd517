"""User errors of the commands: one clear line on stderr, exit 2, nothing written."""

from __future__ import annotations

import pytest

from multibranch.cli import main


def test_prepare_names_a_directory_given_as_a_corpus_file(tmp_path, capsys):
    """A directory where PREFIX.LANG should be a file was reported as "not found"."""
    (tmp_path / "train.src").mkdir()
    for name in ("train.tgt", "valid.src", "valid.tgt"):
        (tmp_path / name).write_text("a b\n", encoding="utf-8")
    out = tmp_path / "data"
    code = main(["prepare", "--src", "src", "--tgt", "tgt", "--train", str(tmp_path / "train"),
                 "--valid", str(tmp_path / "valid"), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{tmp_path / 'train.src'}: is a directory" in err and "not found" not in err
    assert not out.exists()


def test_average_and_convert_never_overwrite_their_input(tmp_path, capsys):
    ckpt = tmp_path / "a.pt"
    ckpt.write_bytes(b"not read: the output check comes first")
    for argv in (["average", "--ckpts", str(ckpt), str(ckpt), "--out", str(ckpt), "--force"],
                 ["convert", "fold", "--ckpt", str(ckpt), "--out", str(tmp_path / "." / "a.pt"), "--force"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "same file as input" in err and len(err.strip().splitlines()) == 1
        assert ckpt.read_bytes() == b"not read: the output check comes first"


@pytest.mark.parametrize(("argv", "line"), [
    (["train", "--data", "d", "--out", "x", "--bogus"], "multibranch train: error: unrecognized arguments: --bogus"),
    (["convert", "fold", "--ckpt", "a.pt", "--out", "b.pt", "--bogus", "1"],
     "multibranch convert fold: error: unrecognized arguments: --bogus 1"),
    (["translate", "--beam", "x"], "multibranch translate: error: argument --beam: invalid int value: 'x'"),
    (["train"], "multibranch train: error: the following arguments are required: --data, --out"),
    (["nosuch"], "multibranch: error: argument COMMAND: invalid choice: 'nosuch'"),
])
def test_argument_errors_are_one_line_naming_the_command(argv, line, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(line) and err.endswith("--help` lists the options)")


def test_a_config_that_is_not_yaml_is_one_line_with_its_place(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("model: [\n", encoding="utf-8")
    assert main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "run"), "--config", str(config)]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err == (f"multibranch train: error: {config}:2:1: invalid YAML (expected the node content, but found "
                   "'<stream end>')")
    assert not (tmp_path / "run").exists()


def _corpus(folder, prefix, lines):  # noqa: ANN001, ANN202
    for lang, text in (("src", lines), ("tgt", [line.upper() for line in lines])):
        (folder / f"{prefix}.{lang}").write_text("".join(f"{line}\n" for line in text), encoding="utf-8")


def test_prepare_refuses_a_split_whose_two_sides_are_one_file(tmp_path, capsys):
    _corpus(tmp_path, "train", ["a b c", "d e f"])
    _corpus(tmp_path, "valid", ["a b", "c d"])
    (tmp_path / "valid.tgt").unlink()
    (tmp_path / "valid.tgt").symlink_to(tmp_path / "valid.src")
    out = tmp_path / "data"
    assert main(["prepare", "--src", "src", "--tgt", "tgt", "--train", str(tmp_path / "train"), "--valid",
                 str(tmp_path / "valid"), "--out", str(out), "--vocab-size", "20"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"{tmp_path / 'valid.src'} and {tmp_path / 'valid.tgt'} are the same file" in err
    assert not out.exists()


def test_prepare_warns_when_the_validation_split_is_the_training_data(tmp_path, caplog):
    import logging

    _corpus(tmp_path, "train", [f"w{i} w{i + 1} w{i + 2}" for i in range(40)])
    with caplog.at_level(logging.WARNING):
        assert main(["prepare", "--src", "src", "--tgt", "tgt", "--train", str(tmp_path / "train"), "--valid",
                     str(tmp_path / "train"), "--out", str(tmp_path / "data"), "--vocab-size", "60"]) == 0
    assert any("the valid split" in r.getMessage() and "is the training data" in r.getMessage()
               for r in caplog.records)


def test_prepare_refuses_a_test_set_without_a_pair_as_it_refuses_such_a_valid_set(tmp_path, capsys):
    _corpus(tmp_path, "train", [f"w{i} w{i + 1} w{i + 2}" for i in range(40)])
    _corpus(tmp_path, "valid", ["w1 w2", "w3 w4"])
    _corpus(tmp_path, "test", ["", "  "])
    out = tmp_path / "data"
    assert main(["prepare", "--src", "src", "--tgt", "tgt", "--train", str(tmp_path / "train"), "--valid",
                 str(tmp_path / "valid"), "--test", str(tmp_path / "test"), "--out", str(out), "--vocab-size", "60"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.endswith(f"{tmp_path / 'test'}.{{src,tgt}}: no non-empty test pairs; each --test needs at least one")
    assert not out.exists()


@pytest.mark.parametrize(("extra", "message"), [
    (["--holdout", "nan"], "holdout=nan must be a fraction in (0, 1) or a whole count >= 1"),
    (["--holdout", "1", "--label-column", "label", "--text-column", "text"],
     "2 columns are named 'text' in the header; name the text column by its number (from 0) instead"),
    (["--holdout", "1", "--max-len-ratio", "2"], "--max-len-ratio: not for --task classify"),
    (["--holdout", "1", "--separate-vocab"], "--separate-vocab: not for --task classify"),
])
def test_prepare_classify_refuses_what_it_cannot_honour_in_one_line(extra, message, tmp_path, capsys):
    table = tmp_path / "d.tsv"
    table.write_text("label\ttext\ttext\npos\ta b\tc d\nneg\te f\tg h\npos\ta c\tx\nneg\te g\ty\n", encoding="utf-8")
    out = tmp_path / "data"
    assert main(["prepare", "--task", "classify", "--train", str(table), "--out", str(out), "--vocab-size", "20",
                 *extra]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("multibranch prepare: error: ") and message in err
    assert not out.exists()


def test_prepare_code_refuses_a_holdout_that_is_not_a_number(tmp_path, capsys):
    assert main(["prepare", "--task", "code", "--train", str(tmp_path / "train"), "--valid", str(tmp_path / "valid"),
                 "--holdout", "nan", "--out", str(tmp_path / "data")]) == 2
    assert "holdout=nan must be a whole count >= 1, a fraction in (0, 1), or 0" in capsys.readouterr().err
