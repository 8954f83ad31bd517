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


def _cpu_only_build(monkeypatch) -> None:
    """This PyTorch as a CPU-only build (CI's) sees itself: no CUDA version; a no-op on such a build."""
    monkeypatch.setattr(torch.version, "cuda", None)


def test_cuda_on_a_cpu_build_is_a_config_error(monkeypatch):
    _cpu_only_build(monkeypatch)
    with pytest.raises(ConfigError, match="--device cuda:1: this PyTorch build"):
        resolve_device("cuda:1")


def test_a_cuda_device_past_the_last_visible_is_a_config_error(monkeypatch):
    """On a CUDA machine the index one past its last device; on a CPU-only build as a CUDA build without a GPU
    would see it (0 visible)."""
    if torch.version.cuda is None:
        monkeypatch.setattr(torch.version, "cuda", "12.1")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ConfigError, match=rf"--device cuda:{count}: no such CUDA device \({count} visible\)"):
        resolve_device(f"cuda:{count}")


def test_analyze_checks_the_device_before_any_work(tmp_path, capsys, monkeypatch):
    _cpu_only_build(monkeypatch)
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"not read: the device is checked first")
    out = tmp_path / "report"
    code = main(["analyze", "heads", "--ckpt", str(ckpt), "--data", str(tmp_path), "--out", str(out),
                 "--device", "cuda:1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--device cuda:1: this PyTorch build" in err
    assert not out.exists()


@pytest.mark.parametrize("command", ["translate", "classify"])
def test_translate_and_classify_take_a_numbered_gpu_and_check_it_first(command, tmp_path, capsys, monkeypatch):
    """`--device cuda:N` is accepted as `train` takes it, and refused in one line before anything is read or written."""
    _cpu_only_build(monkeypatch)
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"not read: the device is checked first")
    (tmp_path / "in.txt").write_text("ein Haus\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    code = main([command, "--ckpt", str(ckpt), "-i", str(tmp_path / "in.txt"), "-o", str(out), "--device", "cuda:1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--device cuda:1: this PyTorch build" in err
    assert not out.exists()
