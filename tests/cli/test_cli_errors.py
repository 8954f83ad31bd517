"""User errors of the commands: one clear line on stderr, exit 2, nothing written."""

from __future__ import annotations

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
