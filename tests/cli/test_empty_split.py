"""An empty validation split: `prepare` refuses an empty --valid (translation and code)
in one line naming the files; `train` and `analyze heads` refuse a prepared directory with an empty split
(one an older version wrote) in one line, before anything is written: no run directory, no report."""

from __future__ import annotations

from pathlib import Path

import pytest

import multibranch.data.parallel_prepare as parallel_prepare
import multibranch.tasks.translation.prepare as translation_prepare
from multibranch.cli import main
from multibranch.tasks.translation.synthetic import generate_synthetic_task
from tests.helpers.cli import TINY_MODEL, one_error_line

pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """Synthetic parallel text with an empty pair of valid files beside it."""
    root = tmp_path_factory.mktemp("raw")
    generate_synthetic_task(root, seed=3, n_train=200, n_valid=12, n_test=12)
    for name in ("empty.src", "empty.tgt", "empty.desc", "empty.code"):
        (root / name).write_text("", encoding="utf-8")
    (root / "blank.src").write_text("\n\n", encoding="utf-8")
    (root / "blank.tgt").write_text("\n\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def old_data(raw, tmp_path_factory) -> Path:
    """A data directory with an empty valid split, as `prepare` wrote it before it refused one (the check
    switched off; SentencePiece is trained on train only, so the vocabulary is that of `good_data`)."""
    out = tmp_path_factory.mktemp("old") / "data"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parallel_prepare, "require_valid_pairs", lambda *_: None, raising=False)
        translation_prepare.prepare(parallel_prepare.PrepareConfig(
            src_lang="src", tgt_lang="tgt", train=str(raw / "train"), valid=str(raw / "empty"), out=str(out),
            vocab_size=200))
    return out


@pytest.mark.parametrize("valid", ["empty", "blank"])
def test_prepare_refuses_an_empty_valid_for_translation(raw, tmp_path, capsys, valid):
    out = tmp_path / "data"
    code = main(["prepare", "--src", "src", "--tgt", "tgt", "--train", str(raw / "train"),
                 "--valid", str(raw / valid), "--out", str(out), "--vocab-size", "200"])
    err = one_error_line(capsys)
    assert code == 2
    assert f"{raw / valid}.{{src,tgt}}: no non-empty validation pairs" in err
    assert not out.exists()


def test_prepare_refuses_an_empty_valid_for_code(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    functions = [f"def f{i} ( x ) : DCNL DCSP return x + {i}" for i in range(40)]
    (raw / "train.desc").write_text("".join(f"'add {i}'\n" for i in range(40)), encoding="utf-8")
    (raw / "train.code").write_text("".join(f"{f}\n" for f in functions), encoding="utf-8")
    (raw / "valid.desc").write_text("", encoding="utf-8")
    (raw / "valid.code").write_text("", encoding="utf-8")
    out = tmp_path / "data"
    code = main(["prepare", "--task", "code", "--train", str(raw / "train"), "--valid", str(raw / "valid"),
                 "--holdout", "0", "--out", str(out), "--vocab-size", "60"])
    err = one_error_line(capsys)
    assert code == 2
    assert f"{raw / 'valid'}.{{desc,code}}: no non-empty validation pairs" in err
    assert not out.exists()


def test_train_refuses_an_empty_valid_split_before_creating_the_run(old_data, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--data", str(old_data), "--out", str(run), "--preset", "transformer-tiny", *TINY_MODEL,
                 "--max-steps", "2", "--valid-every", "1", "--no-progress"])
    err = one_error_line(capsys)
    assert code == 2
    assert f"{old_data}: the valid split is empty (0 examples)" in err and "--valid" in err
    assert not run.exists()


def test_analyze_heads_refuses_an_empty_split(raw, old_data, tmp_path, capsys):
    good = tmp_path / "good"
    assert main(["prepare", "--src", "src", "--tgt", "tgt", "--train", str(raw / "train"),
                 "--valid", str(raw / "valid"), "--out", str(good), "--vocab-size", "200"]) == 0
    run = tmp_path / "run"
    assert main(["train", "--data", str(good), "--out", str(run), "--preset", "transformer-tiny", *TINY_MODEL,
                 "--max-steps", "1", "--valid-every", "1", "--no-progress", "--set", "train.valid_bleu=false"]) == 0
    capsys.readouterr()
    for split in (["--split", "valid"], ["--split", "train", "--bleu-split", "valid"]):
        out = tmp_path / "report"
        code = main(["analyze", "heads", "--ckpt", str(run / "best.pt"), "--data", str(old_data),
                     "--out", str(out), "--max-examples", "2", *split])
        err = one_error_line(capsys)
        assert code == 2
        assert f"{old_data}: the valid split is empty (0 examples)" in err
        assert not out.exists()
