"""Fixed-shape training: length-bucketed batches, the loss over every position with pad weighted 0, and an
update that never reads the device (what a CUDA graph or torch.compile(fullgraph=True) needs).

Checked against today's variable-shape path on the same batches (dropout off: the same losses step for
step), exact resume on the fixed-shape path, a dispatch-mode count of host reads over whole updates for
every layer kind, the refusals of impossible settings, and on CUDA (where present) graphs against eager.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from multibranch.checkpoint.format import CheckpointError, load_checkpoint
from multibranch.experiment import train_config
from multibranch.tasks import task_for_data, train
from multibranch.train.trainer import RunOptions, Trainer
from tests.helpers.configs import tiny_experiment
from tests.helpers.host_reads import HostReads


def _losses(run: Path) -> dict[int, tuple[float, float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records if r["type"] == "train"}


def _no_dropout(**train):
    cfg = tiny_experiment(**train)
    cfg.model.dropout = 0.0
    return cfg


@pytest.mark.parametrize("update_freq", [1, 2])
def test_fixed_shapes_give_todays_losses_on_the_same_batches(tiny_data, tmp_path, caplog, update_freq):
    """Padding a batch to its bucket's shape and weighting pad 0 changes no loss and no gradient; nor does
    keeping the gradients in one buffer, zeroed in place, across an update's batches."""
    cfg = _no_dropout(max_steps=8, length_buckets=3, valid_every=100, update_freq=update_freq)
    fixed = tmp_path / "fixed"
    with caplog.at_level(logging.INFO, logger="multibranch.train"):
        train(cfg, RunOptions(tiny_data, fixed, progress=False, device="cpu"))

    def same_batches(cfg_, data_dir):  # today's task, fed the bucketed plan's batches, unpadded
        task = task_for_data(cfg_, data_dir)
        planner = task_for_data(cfg_, data_dir)
        planner.use_length_buckets(3)
        task.train_batches = planner.train_batches
        return task

    plain_cfg = _no_dropout(max_steps=8, valid_every=100, update_freq=update_freq)
    plain = tmp_path / "plain"
    Trainer(plain_cfg, RunOptions(tiny_data, plain, progress=False, device="cpu"), same_batches).train()
    a, b = _losses(fixed), _losses(plain)
    assert sorted(a) == list(range(1, 9))
    for step in a:
        assert a[step][0] == pytest.approx(b[step][0], rel=1e-5), step
        # (gradient norms to 1e-3 over several batches: Adam's first steps scale gradients that are rounding noise,
        # e.g. the attention key biases' (exactly 0 in theory), to the learning rate, so the padded sums' last bits
        # show in later norms)
        assert a[step][1] == pytest.approx(b[step][1], rel=1e-4 if update_freq == 1 else 1e-3), step
    assert any("fixed batch shapes" in m and "CUDA graphs: off (training runs on cpu" in m for m in caplog.messages)


def test_fixed_shape_batches_have_their_buckets_shapes(tiny_data):
    cfg = tiny_experiment(length_buckets=3)
    task = task_for_data(cfg, tiny_data)
    shapes = {tuple(s) for s in task.use_length_buckets(3)}
    seen = set()
    for indices in task.train_batches(1):
        batch = task.collate(indices, torch.device("cpu"))
        seen.add((batch.src.shape[0], batch.src.shape[1], batch.tgt.shape[1]))
        assert batch.n_tgt_tokens == int(batch.tgt.ne(cfg.model.pad_id).sum())  # filler rows add no target token
    assert seen <= shapes and 1 <= len(seen) <= 3


def test_bucket_lengths_are_multiples_of_train_length_multiple(tiny_data):
    from multibranch.data.batching import length_buckets

    task = task_for_data(tiny_experiment(length_buckets=4, length_multiple=4), tiny_data)
    task.use_length_buckets(4)
    split = task.train_split
    expected = length_buckets(split.src_lengths, split.tgt_lengths, 600, 4, multiple=4)
    assert task.buckets == expected and all(length % 4 == 0 for length in task.buckets.lengths)


def test_fixed_shape_run_resumes_exactly(tiny_data, tmp_path):
    cfg = tiny_experiment(max_steps=10, length_buckets=3, valid_every=5)
    straight = tmp_path / "straight"
    train(cfg, RunOptions(tiny_data, straight, progress=False, device="cpu"))
    paused = tmp_path / "paused"
    train(cfg, RunOptions(tiny_data, paused, progress=False, device="cpu", stop_at_step=5))
    with pytest.raises(CheckpointError, match=r"batching changed \(train\.length_buckets"):
        train(tiny_experiment(max_steps=10, length_buckets=2, valid_every=5),
              RunOptions(tiny_data, paused, progress=False, device="cpu", resume=True))
    train(cfg, RunOptions(tiny_data, paused, progress=False, device="cpu", resume=True))
    assert _losses(paused) == _losses(straight)
    assert load_checkpoint(paused / "last.pt")["training"]["state"]["length_buckets"] == 3


# ---- no host reads in an update -----------------------------------------------------------------------------

SYSTEMS = {
    "transformer": ("transformer-tiny", []),
    "mat": ("mat-tiny", []),
    "weighted": ("weighted-tiny", []),
    "mute-bias-seq": ("mute-bias-seq-tiny", []),
    "muse": ("muse-tiny", []),
    "muse-simple": ("muse-simple-tiny", []),
    "drophead": ("drophead-tiny", []),
}
SMALL = ["model.d_model=32", "model.ffn_dim=64", "model.encoder_layers=1", "model.decoder_layers=1",
         "train.max_tokens=400", "train.max_steps=2000", "train.log_every=1000", "train.valid_every=1000",
         "train.length_buckets=2"]


def _trainer(preset: str, overrides: list[str], data, tmp_path) -> Trainer:
    cfg = train_config(preset, None, overrides, tmp_path / "run")
    return Trainer(cfg, RunOptions(data, tmp_path / "run", progress=False, device="cpu"), task_for_data)


def _host_reads(trainer: Trainer, updates: list[list]) -> list:
    """The device reads on the host while `trainer` makes one update of each list of batch indices."""
    counter = HostReads(ignore=("/torch/optim/",))
    with counter:
        for group in updates:
            trainer._update([trainer._collate(indices) for indices in group])
    return counter.found


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_an_update_reads_nothing_back(system, tiny_data, tmp_path):
    """Three whole updates (schedules, forward, loss, backward, clipping, step, projections) read no device
    value on the host, for every layer kind; the log interval's one read happens outside them."""
    preset, extra = SYSTEMS[system]
    trainer = _trainer(preset, [*SMALL, "train.clip_norm=1.0", *extra], tiny_data, tmp_path)
    assert _host_reads(trainer, [[indices] for indices in trainer._epoch_batches(1)[:3]]) == []
    read = trainer._read_window()
    assert read["loss"] > 0 and read["grad_norm"] > 0


def test_an_update_of_several_batches_reads_nothing_back(tiny_data, tmp_path):
    """update_freq 3: the gradients accumulate in their buffer over three batches, still without a host read."""
    trainer = _trainer("mat-tiny", [*SMALL, "train.clip_norm=1.0", "train.update_freq=3"], tiny_data, tmp_path)
    batches = trainer._epoch_batches(1)[:6]
    assert _host_reads(trainer, [batches[:3], batches[3:]]) == []
    read = trainer._read_window()
    expected = sum(trainer.task.sample_size(trainer._collate(indices)) for indices in batches)
    assert read["size"] == expected and read["grad_norm"] > 0


def test_an_update_with_a_moving_average_of_the_weights_reads_nothing_back(tiny_data, tmp_path):
    """train.ema_decay: the average follows the weights on the device, after every update, without a host read."""
    trainer = _trainer("transformer-tiny", [*SMALL, "train.ema_decay=0.9", "train.ema_start=1"], tiny_data, tmp_path)
    assert _host_reads(trainer, [[indices] for indices in trainer._epoch_batches(1)[:3]]) == []
    assert any(not a.equal(p) for a, p in zip(trainer.ema.average, trainer.ema.params, strict=True))


COMPILED_IN_CI = {"transformer", "mute-bias-seq"}  # the others compile too (-m slow): helpers compile slowly on 2 cores


@pytest.mark.parametrize("system", [s if s in COMPILED_IN_CI else pytest.param(s, marks=pytest.mark.slow)
                                    for s in sorted(SYSTEMS)])
def test_an_updates_objective_compiles_as_one_graph(system, tiny_data, tmp_path):
    """The objective of a fixed-shape update (forward with dropout on, the fused output loss over every
    position, the modules' auxiliary losses, the device normaliser) compiles with fullgraph=True, i.e.
    without a graph break, and its backward gives finite gradients to the parameters the eager backward does."""
    preset, extra = SYSTEMS[system]
    cfg = train_config(preset, None, [*SMALL, *extra], tmp_path / "run")
    trainer = Trainer(cfg, RunOptions(tiny_data, tmp_path / "run", progress=False, device="cpu"), task_for_data)
    batch = trainer._collate(trainer._epoch_batches(1)[0])
    trainer._scale.fill_(1.0 / batch.n_tgt_tokens)
    trainer.model.train()

    def objective(src, prev, tgt):
        loss, _, _ = trainer.task.loss(trainer.model, trainer.model, dataclasses.replace(batch, src=src, prev=prev, tgt=tgt))
        extras = trainer.hooks.extra_losses(update_tokens=trainer._update_size, world_size=1)
        return loss * trainer._scale + sum(extras.values(), torch.zeros(()))

    compiled = torch.compile(objective, fullgraph=True, backend="aot_eager")
    value = compiled(batch.src, batch.prev, batch.tgt)
    value.backward()
    assert torch.isfinite(value) and value > 0
    reached = {n for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert all(torch.isfinite(p.grad).all() for p in trainer.model.parameters() if p.grad is not None)
    trainer.optimizer.zero_grad(set_to_none=True)
    objective(batch.src, batch.prev, batch.tgt).backward()  # eager (dropped branches may differ: other draws)
    assert reached == {n for n, p in trainer.model.named_parameters() if p.grad is not None}


# ---- refusals ----------------------------------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "multibranch", "train", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("extra, message", [
    (["--graphs", "on", "--device", "cpu"], "--graphs on) cannot run here: training runs on cpu, not CUDA"),
    (["--length-buckets", "2", "--max-tokens", "8"], "max_tokens"),
    (["--length-buckets", "0"], "--length-buckets 0: must be >= 1"),
    (["--length-buckets", "2", "--set", "train.length_multiple=0"], "length_multiple=0 must be >= 1"),
])
def test_impossible_fixed_shape_settings_are_refused_before_writing(tiny_data, tmp_path, extra, message):
    run = tmp_path / "run"
    result = _cli("--preset", "transformer-tiny", "--data", str(tiny_data), "--out", str(run), "--max-steps", "1",
                  "--no-progress", *extra)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not run.exists()


# ---- CUDA graphs (on a GPU machine) ------------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("update_freq", [1, 2])
def test_graphs_give_eagers_losses_on_cuda(tiny_data, tmp_path, update_freq):
    """The same fixed-shape batches, eager and replayed as graphs, dropout off: the same losses (to float
    rounding: graph replays may pick other kernels than the eager warm-up)."""
    runs = {}
    for mode in ("off", "on"):
        cfg = _no_dropout(max_steps=12, length_buckets=3, valid_every=6, graphs=mode, update_freq=update_freq)
        runs[mode] = tmp_path / mode
        train(cfg, RunOptions(tiny_data, runs[mode], progress=False, device="cuda"))
    eager, graphed = _losses(runs["off"]), _losses(runs["on"])
    assert sorted(eager) == sorted(graphed) == list(range(1, 13))
    for step in eager:
        assert graphed[step][0] == pytest.approx(eager[step][0], rel=1e-4), step
    assert "CUDA graphs turned off" not in (runs["on"] / "train.log").read_text()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphs_keep_eagers_moving_average_on_cuda(tiny_data, tmp_path):
    """train.ema_decay with graphs: the average, updated after each replayed step, is eager's (float rounding)."""
    saved = {}
    for mode in ("off", "on"):
        cfg = _no_dropout(max_steps=12, length_buckets=3, valid_every=6, graphs=mode, ema_decay=0.8)
        train(cfg, RunOptions(tiny_data, tmp_path / mode, progress=False, device="cuda"))
        saved[mode] = load_checkpoint(tmp_path / mode / "last.pt")
    for name, value in saved["off"]["model"].items():
        torch.testing.assert_close(saved["on"]["model"][name], value, rtol=1e-3, atol=1e-5)
    assert any(not saved["off"]["model"][k].equal(v) for k, v in saved["off"]["training"]["raw_model"].items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_every_layer_kind_captures_on_cuda(system, tiny_data, tmp_path):
    preset, extra = SYSTEMS[system]
    run = tmp_path / "run"
    cfg = train_config(preset, None, [*SMALL, "train.max_steps=8", "train.valid_every=8", "train.valid_bleu=false",
                                      "train.graphs=on", "train.amp=bf16", *extra], run)
    state = train(cfg, RunOptions(tiny_data, run, progress=False, device="cuda"))
    assert state.step == 8
    assert "CUDA graphs turned off" not in (run / "train.log").read_text()
