"""Mixed precision: `amp: auto` resolves as documented on any machine, and a bf16-autocast update
stays close to the fp32 one (the -tiny presets train under bf16 on CPUs that compute it natively)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from multibranch import device as device_module
from multibranch.config import from_dict
from multibranch.device import native_cpu_bf16, resolve_amp
from multibranch.experiment import ExperimentConfig, resolve_config

CPUINFO = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 avx512f {extra}\n\nprocessor\t: 1\n"


def _fake_cpuinfo(monkeypatch, text: str | None) -> None:
    """Make the device module's /proc/cpuinfo read return `text` (None: the file cannot be read)."""

    class FakePath(type(Path())):
        def read_text(self, *args, **kwargs):
            if str(self) != "/proc/cpuinfo":
                return super().read_text(*args, **kwargs)
            if text is None:
                raise FileNotFoundError(str(self))
            return text

    monkeypatch.setattr(device_module, "Path", FakePath)


@pytest.mark.parametrize(("extra", "native"), [("avx512_bf16", True), ("amx_bf16 amx_tile", True), ("", False),
                                               ("avx512bw avx512vl", False)])
def test_native_cpu_bf16_reads_the_cpu_flags(monkeypatch, extra, native):
    _fake_cpuinfo(monkeypatch, CPUINFO.format(extra=extra))
    assert native_cpu_bf16() is native
    assert resolve_amp("auto", torch.device("cpu")) == ("bf16" if native else "none")


def test_unreadable_cpuinfo_means_fp32(monkeypatch):
    _fake_cpuinfo(monkeypatch, None)
    assert native_cpu_bf16() is False
    assert resolve_amp("auto", torch.device("cpu")) == "none"


@pytest.mark.parametrize(("bf16_supported", "expected"), [(True, "bf16"), (False, "fp16")])
def test_auto_on_cuda_is_bf16_where_supported_else_fp16(monkeypatch, bf16_supported, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16_supported)
    monkeypatch.setattr(device_module, "native_cpu_bf16", lambda: not bf16_supported)  # must not matter
    assert resolve_amp("auto", torch.device("cuda")) == expected


@pytest.mark.parametrize("amp", ["none", "bf16", "fp16"])
def test_explicit_amp_is_kept_whatever_the_hardware(monkeypatch, amp):
    monkeypatch.setattr(device_module, "native_cpu_bf16", lambda: True)
    assert resolve_amp(amp, torch.device("cpu")) == amp
    assert resolve_amp(amp, torch.device("cuda")) == amp


def test_tiny_presets_ask_for_auto():
    from multibranch.experiment import list_presets

    tiny = [name for name in list_presets() if name.endswith("-tiny")]
    assert tiny and all(resolve_config(name).train.amp == "auto" for name in tiny)


# ---- one update under bf16 autocast against fp32 ----------------------------------------------------


def _one_update(data: Path, run: Path, amp: str, lr: float = 1e-3) -> tuple[float, dict[str, torch.Tensor]]:
    """Train one update from the seeded init; return (its training loss, the updated weights)."""
    from multibranch.tasks import train
    from multibranch.train.trainer import RunOptions

    model = {"d_model": 32, "heads": 4, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0,
             "encoder": {"kind": "transformer", "attention_branches": 2}, "decoder": {"kind": "transformer"}}
    trn = {"max_tokens": 600, "lr": {"schedule": "constant", "lr": lr, "warmup": 0}, "max_steps": 1, "valid_every": 1,
           "log_every": 1, "valid_bleu": False, "seed": 3, "amp": amp, "label_smoothing": 0.1}
    train(from_dict(ExperimentConfig, {"model": model, "train": trn}), RunOptions(data, run, device="cpu"))
    (record,) = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["type"] == "train"]
    state = torch.load(run / "last.pt", weights_only=True)["model"]
    return record["loss"], state


def test_a_bf16_update_is_close_to_the_fp32_update(tiny_data, tmp_path):
    """Same seed, same init, same first batch; no dropout, so the runs differ only in precision.

    Loss: bf16 keeps 8 significant bits (relative rounding <= 2^-9 ~ 0.2% per value) while autocast
    accumulates matmuls and computes the loss in fp32, so the rounding errors average out and the loss
    agrees to well within one bf16 rounding step (rel 2e-3; measured ~1e-5).
    Update: Adam's first step moves every weight by lr * g / (|g| + eps) ~ lr * sign(g), so the bf16
    update can only differ where a gradient is at bf16 noise level (e.g. the key-projection bias,
    whose exact gradient is zero): over the whole model the two update vectors point the same way
    (cosine > 0.9; measured 0.98) and >= 95% of the weights move the same way (measured 99.1%), and
    those end up equal to fp32 rounding. The master weights stay fp32."""
    loss32, w32 = _one_update(tiny_data, tmp_path / "fp32", "none")
    loss16, w16 = _one_update(tiny_data, tmp_path / "bf16", "bf16")
    _, init = _one_update(tiny_data, tmp_path / "init", "none", lr=1e-12)  # the init, up to 1e-12
    assert loss16 == pytest.approx(loss32, rel=2e-3)
    assert w16.keys() == w32.keys() and all(w16[k].dtype == w32[k].dtype == torch.float32 for k in w32)
    d32 = torch.cat([(w32[k] - init[k]).flatten() for k in w32])
    d16 = torch.cat([(w16[k] - init[k]).flatten() for k in w32])
    assert d32.abs().max() == pytest.approx(1e-3, rel=0.05), "the fp32 update is one Adam step of lr"
    assert torch.nn.functional.cosine_similarity(d32, d16, dim=0) > 0.9
    moved = d32.abs() > 1e-4
    same = (d32.sign() == d16.sign()) & moved
    assert same[moved].float().mean() > 0.95
    # where both move the same way the step is lr * sign(g) in both, so the updated weights agree to fp32
    # rounding (bf16-rounded master weights would be off by ~|w| * 2^-9 ~ 1e-4)
    w32_all, w16_all = torch.cat([w32[k].flatten() for k in w32]), torch.cat([w16[k].flatten() for k in w32])
    assert torch.quantile((w32_all - w16_all)[same].abs(), 0.99) < 1e-6
