"""device.resolve_device: the one strict device check of train, translate and analyze."""

from __future__ import annotations

import pytest
import torch

from multibranch.cli import main
from multibranch.config import ConfigError
from multibranch.device import resolve_device


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="'gpu0' is not a device"):
        resolve_device("gpu0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_cpu_build_is_a_config_error():
    with pytest.raises(ConfigError, match="--device cuda:1: this PyTorch build"):
        resolve_device("cuda:1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_analyze_checks_the_device_before_any_work(tmp_path, capsys):
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"not read: the device is checked first")
    out = tmp_path / "report"
    code = main(["analyze", "heads", "--ckpt", str(ckpt), "--data", str(tmp_path), "--out", str(out),
                 "--device", "cuda:1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--device cuda:1: this PyTorch build" in err
    assert not out.exists()
