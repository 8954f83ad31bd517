"""`multibranch demo` trains for a number of updates, never for a wall-clock time, and in fp32 on every CPU: the same
model on a machine however busy, with or without native bf16 (CPUs of other vector widths round fp32 sums
otherwise). It translates its test set without building the CPU kernels (a one-time build of minutes, longer than
that translation takes without them). The task generation, preparation and training are replaced by stubs here;
the whole demo runs in the slow test."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys

import pytest
import torch

from multibranch import cpu_kernels
from multibranch.checkpoint.format import save_checkpoint
from multibranch.cli import main
from multibranch.tasks.translation.heldout import without_a_kernel_build


class Captured(Exception):
    """Raised by the stub trainer, with the experiment config it was given."""


@pytest.fixture
def demo_training_config(monkeypatch, tmp_path):
    """Runs `multibranch demo ARGS` up to its training, returning the config training got (or main's status)."""
    import multibranch.tasks as tasks
    import multibranch.tasks.translation.prepare as prepare
    import multibranch.tasks.translation.synthetic as synthetic

    def train(cfg, options):  # noqa: ARG001
        raise Captured(cfg)

    task = {"sizes": {"train": 1}, "lexicon": {"lemmas": 1, "src_forms": 1, "tgt_forms": 1}}
    monkeypatch.setattr(synthetic, "generate_synthetic_task", lambda *a, **k: task)
    monkeypatch.setattr(prepare, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(tasks, "train", train)

    def run(*argv: str):
        try:
            return main(["demo", "--out", str(tmp_path / "demo"), *argv])
        except Captured as captured:
            return captured.args[0]

    return run


def test_the_demo_is_budgeted_in_updates_not_minutes(demo_training_config, capsys):
    cfg = demo_training_config()
    assert cfg.train.max_minutes is None
    assert isinstance(cfg.train.max_steps, int) and 300 <= cfg.train.max_steps <= 5000
    assert f"for {cfg.train.max_steps} updates" in capsys.readouterr().out


def test_the_number_of_updates_is_an_option(demo_training_config):
    cfg = demo_training_config("--updates", "40", "--set", "train.valid_every=20")
    assert (cfg.train.max_steps, cfg.train.max_minutes, cfg.train.valid_every) == (40, None, 20)


def test_no_updates_is_one_line_before_anything_is_written(demo_training_config, capsys, tmp_path):
    assert demo_training_config("--updates", "0") == 2
    err = capsys.readouterr().err.strip()
    assert "--updates 0" in err and "\n" not in err
    assert not (tmp_path / "demo").exists()


def test_the_demo_trains_the_model_its_description_names(demo_training_config):
    """The demo preset inherits from mat-tiny: a change made there for another purpose (its drop-branch rate, its
    width) must not change the demo, whose README numbers (BLEU 35.7 to about 37 in half a minute to 1.5 minutes)
    hold for this model."""
    cfg = demo_training_config()
    model = cfg.model
    assert (model.d_model, model.heads, model.ffn_dim, model.encoder_layers, model.decoder_layers) == (128, 4, 256, 2, 2)
    assert model.dropout == 0.0
    for side in (model.encoder, model.decoder):
        assert (side.kind, side.attention_branches, side.drop_branch.rate) == ("transformer", 2, 0.1)
    assert (cfg.train.max_tokens, cfg.train.max_steps) == (1024, 300)
    assert "2 attention branches of 4 heads, drop-branch 0.1; d=128, 2+2 layers, FFN 256" in cfg.description


def test_force_replaces_a_demo_directory_and_refuses_any_other_folder(demo_training_config, capsys, tmp_path):
    out = tmp_path / "demo"

    def last_demo() -> None:
        for name, content in (("raw/train.src", "a b\n"), ("data/data.json", '{"format": "multibranch-data"}'),
                              ("run/config.yaml", "model: {}\n"), ("run/last.pt", "weights")):
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(content, encoding="utf-8")

    def refused(expected: str) -> None:
        before = sorted(str(path) for path in out.rglob("*"))
        capsys.readouterr()
        assert demo_training_config("--force") == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"--out {out}: holds {expected}; --force replaces only a demo's own directory (raw/, "
                            "data/, run/): choose another --out"), err
        assert sorted(str(path) for path in out.rglob("*")) == before

    last_demo()
    assert demo_training_config() == 2  # without --force: refused
    assert not isinstance(demo_training_config("--force"), int)  # replaced: the demo went on to its training
    assert not (out / "run").exists()
    last_demo()
    (out / "thesis.tex").write_text("months of work\n", encoding="utf-8")
    refused("thesis.tex, which a demo does not write")
    (out / "thesis.tex").unlink()
    (out / "raw" / "corpus.de").write_text("my corpus\n", encoding="utf-8")
    refused("raw/corpus.de, which a demo does not write")
    (out / "raw" / "corpus.de").unlink()
    (out / "data" / "data.json").unlink()
    refused("data/, which is not a prepared data directory")
    last_demo()
    save_checkpoint(out / "run" / "avg.pt", {"config": {}, "model": {"w": torch.zeros(1)}, "meta": {}})
    refused("run/avg.pt, another command's output")
    (out / "run" / "avg.pt").unlink()
    (out / ".DS_Store").write_bytes(b"")  # a dotfile: not the user's work
    assert not isinstance(demo_training_config("--force"), int)


def test_the_demo_trains_in_fp32_on_every_cpu(demo_training_config):
    """amp auto would train in bf16 on CPUs with native bf16 and in fp32 elsewhere: two models, two BLEUs."""
    assert demo_training_config().train.amp == "none"


def test_the_demo_translation_builds_no_cpu_kernels_and_leaves_them_as_it_found_them(monkeypatch):
    built = []

    @functools.cache
    def kernels():  # as cpu_kernels.kernels: None when switched off, else built once
        if not cpu_kernels.enabled():
            return None
        built.append(1)
        return "kernels"

    monkeypatch.setattr(cpu_kernels, "kernels", kernels)
    monkeypatch.delenv(cpu_kernels.ENV_SWITCH, raising=False)
    with without_a_kernel_build():
        assert cpu_kernels.kernels() is None and not built
    assert cpu_kernels.ENV_SWITCH not in os.environ and kernels.cache_info().currsize == 0
    assert cpu_kernels.kernels() == "kernels" and built == [1]  # a later translation builds them as ever
    with without_a_kernel_build():  # loaded in this process already: used
        assert cpu_kernels.kernels() == "kernels"
    kernels.cache_clear()
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "1")  # asked for by the user: built
    with without_a_kernel_build():
        assert cpu_kernels.kernels() == "kernels" and built == [1, 1]
    assert os.environ[cpu_kernels.ENV_SWITCH] == "1"


def test_the_demo_loads_and_translates_its_checkpoint_without_building_the_cpu_kernels(monkeypatch, tiny_checkpoint,
                                                                                      tiny_data, tmp_path):
    """Loading packs the model for decoding, which builds the kernels where they are not built: the demo's load
    must happen inside `without_a_kernel_build` as well as its translation."""
    from multibranch.commands.demo import translate_test_set

    asked, built = [], []

    @functools.cache
    def kernels():
        asked.append(1)
        if not cpu_kernels.enabled():
            return None
        built.append(1)
        raise AssertionError("the CPU kernels were built")

    monkeypatch.setattr(cpu_kernels, "kernels", kernels)
    monkeypatch.delenv(cpu_kernels.ENV_SWITCH, raising=False)
    result = translate_test_set(tiny_checkpoint, tiny_data, tmp_path / "test.hyp.txt")
    assert asked and not built  # the kernels were asked for (by the load's packing or the search) and not built
    assert len(result.hypotheses) == len(result.references) > 0
    assert (tmp_path / "test.hyp.txt").read_text(encoding="utf-8").count("\n") == len(result.hypotheses)
    assert cpu_kernels.ENV_SWITCH not in os.environ


@pytest.mark.slow  # the whole demo: about 1.5 minutes on 2 cores
def test_the_whole_demo_learns_and_builds_no_kernels(tmp_path):
    """BLEU far above zero after its updates, and no kernel build (an empty extension cache stays empty)."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions")}
    env.pop(cpu_kernels.ENV_SWITCH, None)
    done = subprocess.run([sys.executable, "-m", "multibranch", "demo", "--out", str(tmp_path / "demo")], env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    bleu = float(re.search(r"^test BLEU = ([\d.]+)", done.stdout, re.MULTILINE).group(1))
    chrf = float(re.search(r"^test chrF = ([\d.]+)", done.stdout, re.MULTILINE).group(1))
    assert bleu > 25 and chrf > 50, done.stdout[-1500:]
    assert "building multibranch's CPU kernels" not in done.stderr and not (tmp_path / "extensions").exists()
