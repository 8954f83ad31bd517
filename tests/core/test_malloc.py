"""glibc's malloc settings for CPU training: when they are set, when the user's choice stands, and what they do
(page faults of a training update's allocation pattern, counted in fresh processes)."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from multibranch import malloc
from multibranch.tasks import train
from multibranch.train.trainer import RunOptions
from tests.helpers.configs import tiny_experiment

ROOT = Path(__file__).resolve().parents[2]
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# a 32 MiB tensor allocated, written and freed ten times, as an update's activations are, after twenty times to warm
# up (the heap grows in its first few): minor page faults per time
ALLOCATION_LOOP = """
import json, resource, sys
import torch
from multibranch.malloc import keep_large_blocks
note = keep_large_blocks()
x = torch.ones(8 * 1024 * 1024)
for _ in range(20):
    y = x * 2.0
    del y
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    y = x * 2.0
    del y
print(json.dumps({"note": note, "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10}))
"""


def environment_without_settings() -> dict[str, str]:
    """This process's environment without any malloc setting of the user's or the switch."""
    return {k: v for k, v in os.environ.items() if k not in (*malloc.USER_SETTINGS, malloc.SWITCH)}


def allocation_loop(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", ALLOCATION_LOOP], env={**environment_without_settings(), **env,
                                                                       "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def clean_environment(monkeypatch):
    for name in (*malloc.USER_SETTINGS, malloc.SWITCH):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_nothing_blocks_on_glibc_by_default(clean_environment):
    assert malloc.blocker() is None


@pytest.mark.parametrize(("name", "value"), [("MULTIBRANCH_MALLOC", "0"), ("MULTIBRANCH_MALLOC", "off"),
                                             ("MALLOC_MMAP_THRESHOLD_", "65536"), ("MALLOC_TRIM_THRESHOLD_", "0"),
                                             ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536"),
                                             ("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")])
def test_the_users_choice_stands(clean_environment, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert name in malloc.blocker()


def test_the_switch_on_leaves_it_to_the_platform(clean_environment, monkeypatch):
    monkeypatch.setenv(malloc.SWITCH, "1")
    assert (malloc.blocker() is None) == GLIBC


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_a_freed_large_tensor_is_reused_without_page_faults():
    """glibc's defaults unmap a freed 32 MiB block, so every new one faults in all its 8192 pages of 4 KiB; kept in
    the heap it is reused."""
    system = allocation_loop({malloc.SWITCH: "0"})
    tuned = allocation_loop({})
    assert "MULTIBRANCH_MALLOC=0" in system["note"]
    assert "reused" in tuned["note"]
    assert system["faults"] > 4000, system  # the cost that the settings remove, on this glibc
    assert tuned["faults"] < system["faults"] / 10, (tuned, system)


def test_a_cpu_training_run_logs_its_malloc_settings(tiny_data, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="multibranch.train"):
        train(tiny_experiment(max_steps=1, valid_every=1), RunOptions(tiny_data, tmp_path / "run", progress=False,
                                                                       device="cpu"))
    assert [m for m in caplog.messages if m.startswith("malloc: ")] == [malloc.keep_large_blocks()]


TRAIN_RUN = """
import sys
from pathlib import Path
from multibranch.malloc import keep_large_blocks
from multibranch.tasks import train
from multibranch.train.trainer import RunOptions
from tests.helpers.configs import tiny_experiment
cfg = tiny_experiment(max_steps=6, valid_every=6, max_tokens=2000)
cfg.model.ffn_dim = 512  # hidden activations of ~4 MiB: above glibc's starting mmap threshold (128 KiB)
train(cfg, RunOptions(Path(sys.argv[1]), Path(sys.argv[2]), progress=False, device="cpu"))
print(keep_large_blocks())  # what the trainer did (cached)
"""


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_the_settings_change_no_weight(tiny_data, tmp_path):
    """Six updates with glibc's settings and with the blocks kept end in the same weights, bit for bit."""
    weights = []
    for switch in ("0", "1"):
        run = tmp_path / f"run-{switch}"
        out = subprocess.run([sys.executable, "-c", TRAIN_RUN, str(tiny_data), str(run)], check=True, cwd=ROOT,
                             env={**environment_without_settings(), malloc.SWITCH: switch, "PYTHONPATH": str(ROOT)},
                             capture_output=True, text=True)
        assert ("reused" in out.stdout) == (switch == "1"), out.stdout
        weights.append(torch.load(run / "last.pt", map_location="cpu", weights_only=False)["model"])
    assert weights[0].keys() == weights[1].keys()
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), name
