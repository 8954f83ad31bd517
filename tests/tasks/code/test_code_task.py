"""The code task end to end: train on `prepare --task code` data (validation PoV / BLEU), exact resume,
`translate` (escaped and source forms), the presets. Corpora are written by the tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from multibranch.checkpoint.format import CheckpointError
from multibranch.cli import main
from multibranch.config import from_dict
from multibranch.experiment import ExperimentConfig, resolve_config
from multibranch.loading.checkpoint import load_model
from multibranch.models import build_model
from multibranch.tasks import train
from multibranch.tasks.code.corpus import decode_code
from multibranch.train.trainer import RunOptions
from tests.helpers.code import synthetic_pairs, write_corpus


@pytest.fixture(scope="module")
def code_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("code_data")
    write_corpus(root / "train", synthetic_pairs(200, seed=1))
    write_corpus(root / "valid", synthetic_pairs(12, seed=2))
    assert main(["prepare", "--task", "code", "--train", str(root / "train"), "--valid", str(root / "valid"),
                 "--holdout", "12", "--out", str(root / "data"), "--vocab-size", "120"]) == 0
    return root / "data"


def _experiment(**train_overrides) -> ExperimentConfig:
    train_cfg = {"max_tokens": 600, "lr": {"schedule": "inverse_sqrt", "lr": 0.003, "warmup": 10},
                 "valid_every": 10, "log_every": 1, "max_steps": 20, "seed": 7, "valid_max_sentences": 6,
                 "deterministic": True}
    train_cfg.update(train_overrides)
    model = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.1,
             "encoder": {"kind": "transformer", "attention_branches": 2, "drop_branch": 0.1},
             "decoder": {"kind": "transformer", "attention_branches": 2, "drop_branch": 0.1}}
    decode = {"beam": 2, "max_len_a": 0.0, "max_len_b": 40}
    return from_dict(ExperimentConfig, {"model": model, "train": train_cfg, "decode": decode})


def _records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]


def _independent_code_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """PoV, mean sentence BLEU and corpus BLEU computed here, without the library's code helpers:
    the escaped lines decoded by hand (DCNL newline, leading DCSP words = indentation levels, other
    DCSP a space), PoV = the share of non-blank sources `ast.parse` accepts (the definition of PoV in
    tasks/code/metrics.py: update both together), BLEU by sacreBLEU on Python `tokenize` tokens without
    layout, joined by spaces (tokenize="none"; sentence BLEU with exp smoothing, effective order)."""
    import ast
    import io
    import re
    import tokenize

    from sacrebleu.metrics import BLEU

    def decode(line: str) -> str:
        out = []
        for part in re.split(r" *\bDCNL\b ?", line):
            words = part.lstrip(" ").split(" ")
            level = 0
            while level < len(words) and words[level] == "DCSP":
                level += 1
            body = " ".join(words[level:]).lstrip(" ")
            out.append("    " * level + re.sub(r" ?\bDCSP\b ?", " ", body).replace(" DCTB ", "\t"))
        return "\n".join(out)

    def valid(source: str) -> bool:
        try:
            return bool(source.strip()) and ast.parse(source) is not None
        except SyntaxError:
            return False

    layout = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT,
              tokenize.ENDMARKER, tokenize.ENCODING}

    def tokens(source: str) -> str:
        """Code tokens; on code a tiny model leaves with brackets open at the end, the tokens up to
        the end (what the tokenizer reads before it reports the open bracket at EOF)."""
        kept = []
        try:
            for t in tokenize.generate_tokens(io.StringIO(source).readline):
                if t.type not in layout and t.string.strip():
                    kept.append(t.string)
        except tokenize.TokenError as err:
            assert "EOF in multi-line" in str(err), err
        return " ".join(" ".join(kept).split())

    hyps, refs = [decode(h) for h in hypotheses], [decode(r) for r in references]
    hyp_lines, ref_lines = [tokens(h) for h in hyps], [tokens(r) for r in refs]
    sentence = BLEU(tokenize="none", smooth_method="exp", effective_order=True)
    return {"pov": sum(map(valid, hyps)) / len(hyps),
            "sentence_bleu": sum(sentence.sentence_score(h, [r]).score for h, r in zip(hyp_lines, ref_lines))
            / len(hyps),
            "bleu": BLEU(tokenize="none").corpus_score(hyp_lines, [ref_lines]).score}


@pytest.fixture(scope="module")
def code_run(code_data, tmp_path_factory) -> Path:
    """On the CPU on every machine: the test below recomputes the run's validation scores by decoding with a
    Translator on the CPU, and a run on CUDA validates with CUDA's kernels, whose last bits (so a near-tie of
    this tiny model's search) may differ. The code task on CUDA: test_code_resume_is_exact (--device auto), and
    the translate tests decode this run's checkpoint there."""
    run = tmp_path_factory.mktemp("code_run") / "run"
    train(_experiment(max_steps=80, valid_every=40, best_metric="pov"), RunOptions(code_data, run, device="cpu"))
    return run


def test_code_task_validates_with_pov_and_bleu(code_data, code_run):
    valid = _records(code_run, "valid")
    assert [r["step"] for r in valid] == [40, 80]
    # the validation scores are those of evaluate.code on the decoded valid functions: recompute them
    loaded = load_model(code_run / "last.pt")
    assert loaded.config.task == "code" and loaded.config.train.best_metric == "pov"
    from multibranch.tasks.translation.translator import Translator

    data_sources = (code_data / "valid.src.txt").read_text(encoding="utf-8").split("\n")[:6]
    references = (code_data / "valid.tgt.txt").read_text(encoding="utf-8").split("\n")[:6]
    hypotheses = Translator(loaded.model, loaded.tokenizer, loaded.config.decode).translate(data_sources)
    expected = _independent_code_scores(hypotheses, references)
    assert valid[-1]["pov"] == pytest.approx(expected["pov"])
    assert valid[-1]["sentence_bleu"] == pytest.approx(expected["sentence_bleu"])
    assert valid[-1]["bleu"] == pytest.approx(expected["bleu"])
    # it learns: lower valid loss and higher code BLEU at 80 updates than at 40
    assert valid[-1]["loss"] < valid[0]["loss"] and valid[-1]["bleu"] > valid[0]["bleu"]
    # best.pt follows best_metric=pov
    best = load_model(code_run / "best.pt").payload["meta"]["valid"]
    assert best["pov"] == max(r["pov"] for r in valid)


def test_code_resume_is_exact(code_data, tmp_path):
    cfg = {"max_steps": 12, "valid_every": 4}
    train(_experiment(**cfg), RunOptions(code_data, tmp_path / "straight"))
    train(_experiment(**cfg), RunOptions(code_data, tmp_path / "legs", stop_at_step=6))
    train(_experiment(**cfg), RunOptions(code_data, tmp_path / "legs", resume=True))
    straight = {r["step"]: r["loss"] for r in _records(tmp_path / "straight", "train")}
    legs = {r["step"]: r["loss"] for r in _records(tmp_path / "legs", "train")}
    assert sorted(legs) == list(range(1, 13))
    assert legs == straight
    scores = {r["step"]: (r["loss"], r["pov"], r["bleu"]) for r in _records(tmp_path / "straight", "valid")}
    legs_scores = {r["step"]: (r["loss"], r["pov"], r["bleu"]) for r in _records(tmp_path / "legs", "valid")}
    assert sorted(scores) == [4, 8, 12]  # the pause adds a validation at 6 to the legs run
    assert {step: legs_scores[step] for step in scores} == scores


def test_translate_writes_escaped_functions_and_source_on_request(code_data, code_run, tmp_path):
    src = code_data / "test.src.txt"
    n = len(src.read_text(encoding="utf-8").split("\n")) - 1
    escaped, source = tmp_path / "hyp.code", tmp_path / "hyp.py"
    ckpt = str(code_run / "best.pt")
    assert main(["translate", "--ckpt", ckpt, "-i", str(src), "-o", str(escaped), "--threads", "1"]) == 0
    lines = escaped.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == n and any("DCNL" in line for line in lines)
    assert main(["translate", "--ckpt", ckpt, "-i", str(src), "-o", str(source), "--threads", "1",
                 "--code-format", "source"]) == 0
    assert source.read_text(encoding="utf-8") == "".join(decode_code(line) + "\n\n" for line in lines)


def test_translate_code_format_errors(code_run, tiny_data, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("Return alpha plus beta.\n", encoding="utf-8")
    ckpt = str(code_run / "best.pt")
    assert main(["translate", "--ckpt", ckpt, "-i", str(src), "--code-format", "source", "--nbest", "2"]) == 2
    assert "--code-format source" in capsys.readouterr().err
    # a translation checkpoint has no code form
    run = tmp_path / "mt"
    from tests.helpers.configs import tiny_experiment

    train(tiny_experiment(max_steps=2, valid_every=2), RunOptions(tiny_data, run))
    assert main(["translate", "--ckpt", str(run / "last.pt"), "-i", str(src), "--code-format", "source"]) == 2
    assert "not a code-generation model" in capsys.readouterr().err


def test_code_checkpoint_is_refused_by_classify(code_run, tmp_path):
    with pytest.raises(CheckpointError, match="is a code model, not a classification model; use `multibranch "
                                              "translate`"):
        load_model(code_run / "best.pt", task="classification")


def test_code_checkpoint_is_refused_by_head_analysis_and_pruning(code_data, code_run, tmp_path, capsys):
    """Head scoring knows BLEU of translations and accuracy of labels; a code model is refused in one line
    before anything is written, with data (importance, curve) or without (listed heads)."""
    ckpt = str(code_run / "best.pt")
    assert main(["analyze", "heads", "--ckpt", ckpt, "--data", str(code_data), "--out", str(tmp_path / "heads")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"multibranch analyze: error: {ckpt} is a code model, not a translation or classification "
                   "model; use `multibranch translate`"]
    heads = tmp_path.parent / f"{tmp_path.name}-heads.json"
    heads.write_text(json.dumps([["encoder.layers.0.self_attn", 0]]), encoding="utf-8")
    for how in (["--data", str(code_data), "--fraction", "0.2"], ["--heads-json", str(heads)]):
        assert main(["prune", "--ckpt", ckpt, *how, "--out", str(tmp_path / "pruned.pt")]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("multibranch prune: error: ") and "code model" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---- presets ----------------------------------------------------------------------------------------


def _parameters(name: str) -> int:
    cfg = resolve_config(name)
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = 8000
    return sum(p.numel() for p in set(build_model(cfg.model).parameters()))


def test_codegen_presets_have_equal_parameters():
    standard, mat = _parameters("codegen-tiny"), _parameters("codegen-tiny-mat")
    assert standard == 7_577_600 and mat == 7_594_624  # the counts the preset descriptions state
    assert abs(mat - standard) / standard < 0.03
    cfg = resolve_config("codegen-tiny-mat")
    assert cfg.model.encoder.attention_branches == cfg.model.decoder.attention_branches == 4  # N_a as in the paper
    assert cfg.model.encoder.drop_branch.rate == cfg.model.decoder.drop_branch.rate == 0.1


@pytest.mark.parametrize("name", ["codegen-tiny", "codegen-tiny-mat"])
def test_codegen_presets_train_on_code_data_shrunk(name, code_data, tmp_path):
    shrink = ["model.d_model=32", "model.ffn_dim=64", "model.encoder_layers=1", "model.decoder_layers=1",
              "train.max_steps=4", "train.valid_every=2", "train.max_minutes=null", "train.lr.warmup=2",
              "train.max_tokens=400", "train.valid_max_sentences=2", "decode.beam=2", "decode.max_len_b=20"]
    args = ["train", "--preset", name, "--data", str(code_data), "--out", str(tmp_path / "run"), "--no-progress",
            "--threads", "1"]
    for override in shrink:
        args += ["--set", override]
    torch.manual_seed(0)
    assert main(args) == 0
    valid = _records(tmp_path / "run", "valid")
    assert [r["step"] for r in valid] == [2, 4] and all(0 <= r["pov"] <= 1 for r in valid)
