"""bench/common.py's `trainer_and_batches`: the first batches training takes, across epochs, in a run folder
that is gone afterwards."""

from __future__ import annotations

import torch

from bench.common import trainer_and_batches
from tests.helpers.configs import tiny_experiment


def test_it_yields_the_batches_training_takes_first_over_as_many_epochs_as_needed(tiny_data):
    cfg = tiny_experiment(max_tokens=600)
    with trainer_and_batches(cfg, 10_000, data=tiny_data, device="cpu") as (trainer, _):
        first = trainer._epoch_batches(1)
    count = len(first) + 2  # all of epoch 1 and two of epoch 2
    with trainer_and_batches(cfg, count, data=tiny_data, device="cpu") as (trainer, batches):
        run_dir = trainer.run_dir
        assert run_dir.is_dir()
        expected = trainer._epoch_batches(1) + trainer._epoch_batches(2)[:2]
        assert len(batches) == count
        for batch, indices in zip(batches, expected):
            assert torch.equal(batch.src, trainer._collate(indices).src)
    assert not run_dir.exists()
