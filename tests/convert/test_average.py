"""Checkpoint averaging and checkpoint selection from a run directory."""

from __future__ import annotations

import logging

import pytest
import torch

from multibranch.checkpoint.format import CheckpointError, load_checkpoint, save_checkpoint
from multibranch.checkpoint.origin import weights_fingerprint
from multibranch.cli import main
from multibranch.convert.average import average_checkpoints, select_checkpoints
from multibranch.experiment import ExperimentConfig
from multibranch.loading.checkpoint import load_model
from multibranch.models import build_model
from multibranch.tasks import train
from multibranch.train.rng import seed_everything
from multibranch.train.trainer import RunOptions
from tests.helpers.configs import tiny_experiment, tiny_model_dict


def make_payload(seed: int, step: int, bleu: float | None = None, loss: float | None = None, **model) -> dict:
    cfg = ExperimentConfig.from_dict({"model": tiny_model_dict(**model)})
    torch.manual_seed(seed)
    net = build_model(cfg.model)
    return {
        "config": cfg.to_dict(),
        "model": net.state_dict(),
        "tokenizer": None,
        "meta": {"step": step, "epoch": 1, "valid": {"loss": loss, "bleu": bleu}},
        "training": {"optimizer": {"state": {}}},
    }


def write(path, payload) -> str:
    save_checkpoint(path, payload)
    return str(path)


def test_average_is_float64_mean_ints_from_newest_ties_kept(tmp_path):
    payloads = [make_payload(seed, step) for seed, step in [(1, 300), (2, 100), (3, 200)]]
    for i, p in enumerate(payloads):
        p["model"]["num_updates"] = torch.tensor(10 * (i + 1), dtype=torch.int64)  # an integer buffer
    paths = [write(tmp_path / f"c{i}.pt", p) for i, p in enumerate(payloads)]
    avg = average_checkpoints(paths)
    for key, value in avg["model"].items():
        if key == "num_updates":
            assert value.item() == 10  # from the newest (step 300), not the last path
            continue
        a, b, c = (p["model"][key].double() for p in payloads)
        expected = ((a + b + c) / 3).float()
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, expected, atol=0, rtol=0)
    enc, dec = avg["model"]["encoder.embed.tokens.weight"], avg["model"]["decoder.embed.tokens.weight"]
    assert enc.data_ptr() == dec.data_ptr()  # tied stays tied
    assert "training" not in avg and "valid" not in avg["meta"]
    assert [s["path"] for s in avg["meta"]["averaged_from"]] == paths and avg["meta"]["step"] == 300
    net = build_model(ExperimentConfig.from_dict(avg["config"]).model)
    net.load_state_dict({k: v for k, v in avg["model"].items() if k != "num_updates"})


def test_average_keeps_low_precision_dtype(tmp_path):
    payloads = [make_payload(seed, seed) for seed in (1, 2)]
    for p in payloads:
        p["model"] = {k: v.to(torch.bfloat16) for k, v in p["model"].items()}
    avg = average_checkpoints([write(tmp_path / f"{i}.pt", p) for i, p in enumerate(payloads)])
    key = "decoder.layers.0.ffn.fc1.weight"
    assert avg["model"][key].dtype == torch.bfloat16
    expected = ((payloads[0]["model"][key].double() + payloads[1]["model"][key].double()) / 2).to(torch.bfloat16)
    assert torch.equal(avg["model"][key], expected)


def test_mixing_an_fp16_export_with_fp32_checkpoints_warns_and_keeps_the_newest_dtype(tmp_path, caplog):
    full, half = make_payload(1, 100), make_payload(2, 200)
    converted: dict[int, torch.Tensor] = {}  # one fp16 copy per storage: tied weights stay tied, as in an export
    half["model"] = {k: converted.setdefault(v.data_ptr(), v.to(torch.float16)) for k, v in half["model"].items()}
    paths = [write(tmp_path / "full.pt", full), write(tmp_path / "half.pt", half)]
    caplog.set_level(logging.WARNING, logger="multibranch")
    avg = average_checkpoints(paths)
    key = "decoder.layers.0.ffn.fc1.weight"
    assert avg["model"][key].dtype == torch.float16
    expected = ((full["model"][key].double() + half["model"][key].double()) / 2).to(torch.float16)
    assert torch.equal(avg["model"][key], expected)
    assert (f"{paths[0]} stores float32 weights and {paths[1]} float16: the average is stored in float16"
            in caplog.text)
    caplog.clear()
    average_checkpoints([write(tmp_path / "full2.pt", make_payload(3, 300)), paths[0]])
    assert "stores" not in caplog.text  # one dtype: nothing to say


def test_average_refuses_mismatches(tmp_path):
    good = write(tmp_path / "good.pt", make_payload(1, 1))
    other_cfg = write(tmp_path / "cfg.pt", make_payload(2, 2, dropout=0.3))
    with pytest.raises(CheckpointError, match=r"cfg\.pt: model config differs .*model\.dropout: good\.pt 0\.1, cfg\.pt 0\.3"):
        average_checkpoints([good, other_cfg])
    p = make_payload(3, 3)
    del p["model"]["decoder.layers.1.ffn.fc1.bias"]
    missing = write(tmp_path / "missing.pt", p)
    with pytest.raises(CheckpointError, match=r"missing\.pt: missing key 'decoder\.layers\.1\.ffn\.fc1\.bias'"):
        average_checkpoints([good, missing])
    p = make_payload(4, 4)
    p["model"]["encoder.layers.0.ffn.fc1.bias"] = torch.zeros(65)
    shape = write(tmp_path / "shape.pt", p)
    with pytest.raises(CheckpointError, match=r"shape\.pt: encoder\.layers\.0\.ffn\.fc1\.bias has shape \(65,\)"):
        average_checkpoints([good, shape])
    with pytest.raises(CheckpointError, match="not found"):
        average_checkpoints([good, str(tmp_path / "nope.pt")])


def test_a_config_mismatch_between_two_runs_best_pt_names_their_paths(tmp_path):
    """Two files of one name (each run's best.pt) are told apart by their paths, not both called best.pt."""
    first = write(tmp_path / "a" / "best.pt", make_payload(1, 1))
    second = write(tmp_path / "b" / "best.pt", make_payload(2, 2, dropout=0.3))
    with pytest.raises(CheckpointError) as refused:
        average_checkpoints([first, second])
    assert str(refused.value) == (f"{second}: model config differs from {first} (model.dropout: {first} 0.1, "
                                  f"{second} 0.3); cannot average")


@pytest.fixture
def run_dir(tmp_path):
    """A fake run: step checkpoints 100..500 with validation scores, plus best.pt/last.pt."""
    run = tmp_path / "run"
    bleus = {100: 10.0, 200: 30.0, 300: 20.0, 400: 30.0, 500: 5.0}
    losses = {100: 3.0, 200: 2.0, 300: 1.5, 400: 2.5, 500: 1.0}
    for step, bleu in bleus.items():
        write(run / "checkpoints" / f"step_{step:08d}.pt", make_payload(step, step, bleu, losses[step]))
    write(run / "best.pt", make_payload(200, 200, 30.0, 2.0))
    write(run / "last.pt", make_payload(500, 500, 5.0, 1.0))
    return run


def steps(paths) -> list[int]:
    return [int(p.stem.split("_")[1]) for p in paths]


def test_select_last_and_best(run_dir):
    assert steps(select_checkpoints(run_dir, last=3)) == [300, 400, 500]
    assert steps(select_checkpoints(run_dir, last=3, upper_bound=400)) == [200, 300, 400]
    assert steps(select_checkpoints(run_dir, best=2)) == [200, 400]
    assert steps(select_checkpoints(run_dir, best=2, upper_bound=300)) == [200, 300]
    with pytest.raises(CheckpointError, match="asked for 6 checkpoints"):
        select_checkpoints(run_dir, last=6)
    # no BLEU in one checkpoint -> rank by loss (lower is better)
    write(run_dir / "checkpoints" / "step_00000600.pt", make_payload(6, 600, None, 1.2))
    assert steps(select_checkpoints(run_dir, best=2)) == [500, 600]


def test_best_never_picks_a_diverged_validation(run_dir):
    write(run_dir / "checkpoints" / "step_00000600.pt", make_payload(6, 600, float("nan"), float("nan")))
    assert steps(select_checkpoints(run_dir, best=2)) == [200, 400]  # by BLEU: NaN ranks last
    write(run_dir / "checkpoints" / "step_00000700.pt", make_payload(7, 700, None, 0.5))
    assert steps(select_checkpoints(run_dir, best=2)) == [500, 700]  # by loss: NaN ranks last too


def test_cli_average(run_dir, tmp_path, capsys):
    out = tmp_path / "avg.pt"
    assert main(["average", "--run", str(run_dir), "--last", "2", "--out", str(out)]) == 0
    avg = load_checkpoint(out)
    assert [s["step"] for s in avg["meta"]["averaged_from"]] == [400, 500]
    assert "training" not in avg
    load_model(out)
    assert main(["average", "--run", str(run_dir), "--best", "2", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["average", "--run", str(run_dir), "--best", "2", "--out", str(out), "--force"]) == 0
    assert [s["step"] for s in load_checkpoint(out)["meta"]["averaged_from"]] == [200, 400]
    ckpts = [str(run_dir / "checkpoints" / f"step_{s:08d}.pt") for s in (100, 300)]
    assert main(["average", "--ckpts", *ckpts, "--out", str(out), "--force"]) == 0
    assert main(["average", "--run", str(run_dir), "--out", str(tmp_path / "x.pt")]) == 2
    assert "--last N or --best N" in capsys.readouterr().err


# ---- origins: only checkpoints of one weight trajectory are averaged ------------------------------


def _origin(path) -> dict:
    return load_checkpoint(path)["meta"]["origin"]


def test_a_run_keeps_its_origin_across_resumes_and_fingerprints_its_initial_weights(tiny_data, tmp_path):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=2, valid_every=2), RunOptions(tiny_data, run, progress=False))
    train(tiny_experiment(max_steps=4, valid_every=2), RunOptions(tiny_data, run, resume=True, progress=False))
    origins = [_origin(p) for p in sorted((run / "checkpoints").glob("step_*.pt"))]
    assert len(origins) == 2 and origins[0] == origins[1] == _origin(run / "last.pt")
    assert origins[0]["init"] == "random" and len(origins[0]["run_id"]) == 32
    # the fingerprint is that of the weights the seed gives before any update (rebuilt independently)
    config = ExperimentConfig.from_dict(load_checkpoint(run / "last.pt")["config"])
    seed_everything(config.train.seed)
    assert origins[0]["init_fingerprint"] == weights_fingerprint(build_model(config.model).state_dict())
    train(tiny_experiment(max_steps=2, valid_every=2), RunOptions(tiny_data, run, force=True, progress=False))
    restarted = _origin(run / "last.pt")
    assert restarted["run_id"] != origins[0]["run_id"]  # a new run
    assert restarted["init_fingerprint"] == origins[0]["init_fingerprint"]  # same seed, same init


def test_weights_fingerprint_sees_one_changed_value():
    state = build_model(ExperimentConfig.from_dict({"model": tiny_model_dict()}).model).state_dict()
    copy = {k: v.clone() for k, v in state.items()}
    assert weights_fingerprint(copy) == weights_fingerprint(state)
    copy["decoder.layers.1.ffn.fc2.weight"][3, 5] += 1e-3
    assert weights_fingerprint(copy) != weights_fingerprint(state)


def test_average_refuses_unrelated_runs_unless_forced(tiny_data, tmp_path, caplog, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    train(tiny_experiment(max_steps=4, valid_every=2), RunOptions(tiny_data, a, progress=False))
    # the same preset and seed (so the same initial weights), but another learning rate: another run
    other = tiny_experiment(max_steps=2, valid_every=2, lr={"schedule": "inverse_sqrt", "lr": 0.001, "warmup": 5})
    train(other, RunOptions(tiny_data, b, progress=False))
    assert _origin(a / "last.pt")["init_fingerprint"] == _origin(b / "last.pt")["init_fingerprint"]
    steps_a = [str(p) for p in sorted((a / "checkpoints").glob("step_*.pt"))]
    average_checkpoints(steps_a)  # one run: fine
    mixed = [steps_a[-1], str(b / "last.pt")]
    with pytest.raises(CheckpointError, match="unrelated runs .*--force"):
        average_checkpoints(mixed)
    caplog.set_level(logging.WARNING, logger="multibranch")
    average_checkpoints(mixed, force=True)
    assert "--force" in caplog.text and "unrelated runs" in caplog.text
    out = tmp_path / "avg.pt"
    assert main(["average", "--ckpts", *mixed, "--out", str(out)]) == 2
    assert "unrelated runs" in capsys.readouterr().err and not out.exists()
    assert main(["average", "--ckpts", *mixed, "--out", str(out), "--force"]) == 0


def test_average_accepts_fine_tunings_of_one_checkpoint(tiny_data, tmp_path):
    base = tmp_path / "base"
    train(tiny_experiment(max_steps=2, valid_every=2), RunOptions(tiny_data, base, progress=False))
    tuned = []
    for seed in (3, 4):
        run = tmp_path / f"tuned{seed}"
        train(tiny_experiment(max_steps=2, valid_every=2, seed=seed),
              RunOptions(tiny_data, run, init_from=base / "best.pt", progress=False))
        tuned.append(str(run / "last.pt"))
    first, second = _origin(tuned[0]), _origin(tuned[1])
    assert first["run_id"] != second["run_id"] and first["init"] == "checkpoint"
    assert first["init_fingerprint"] == weights_fingerprint(load_checkpoint(base / "best.pt")["model"])
    average_checkpoints(tuned)  # a "model soup": no --force needed


def test_checkpoints_without_origin_average_with_a_warning(tmp_path, caplog):
    paths = [write(tmp_path / f"old{i}.pt", make_payload(i, i)) for i in (1, 2)]
    caplog.set_level(logging.WARNING, logger="multibranch")
    average_checkpoints(paths)
    assert "cannot check that the checkpoints come from one run" in caplog.text


def test_a_run_from_before_origins_resumes_with_a_warning_and_stays_uncheckable(tiny_data, tmp_path, caplog):
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=2, valid_every=2), RunOptions(tiny_data, run, progress=False))
    old = load_checkpoint(run / "last.pt")
    del old["meta"]["origin"]
    save_checkpoint(run / "last.pt", old)
    caplog.set_level(logging.WARNING, logger="multibranch")
    train(tiny_experiment(max_steps=4, valid_every=2), RunOptions(tiny_data, run, resume=True, progress=False))
    assert "before runs recorded their origin" in caplog.text
    assert "origin" not in load_checkpoint(run / "last.pt")["meta"]  # no made-up origin
