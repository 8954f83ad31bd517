"""Every results file of bench/ says which CPU and which autocast its numbers were measured with:
`bench.common.environment(amp=...)` records the CPU model name (/proc/cpuinfo, else platform.processor())
and the amp setting, and every bench script that writes a results file passes the amp of its run(s)."""

from __future__ import annotations

import ast
import datetime
import json
import platform
from pathlib import Path

import pytest

from bench import common
from bench.classify_quality import merged_provenance
from bench.report import header

BENCH = Path(common.__file__).resolve().parent

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse avx512f amx_bf16 amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse avx512f amx_bf16 amx_tile
"""


def real_model_name() -> str | None:
    """The first "model name" of this machine's /proc/cpuinfo, read here without bench code."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.split(":")[0].strip() == "model name"]
    return names[0] if names else None


def test_cpu_model_is_the_model_name_line_of_cpuinfo(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    monkeypatch.setattr(common, "CPUINFO", info)
    assert common.cpu_model() == "Intel(R) Xeon(R) Platinum 8480C"
    assert common.cpu_native_bf16() is True
    info.write_text(CPUINFO.replace("amx_bf16", "amx_int8"))
    assert common.cpu_native_bf16() is False
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16\n")  # no model name line (e.g. some ARM kernels)
    monkeypatch.setattr(platform, "processor", lambda: "Some Processor")
    assert common.cpu_model() == "Some Processor"
    assert common.cpu_native_bf16() is True


def test_cpu_model_falls_back_to_platform_without_cpuinfo(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "CPUINFO", tmp_path / "missing")
    monkeypatch.setattr(platform, "processor", lambda: "arm")
    assert common.cpu_model() == "arm"
    assert common.cpu_native_bf16() is False
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert common.cpu_model() == "aarch64"


def test_environment_records_this_cpus_model_name_and_the_amp_setting():
    env = common.environment(amp="bf16")
    json.dumps(env)  # goes into a JSON file as it is
    expected = real_model_name() or platform.processor() or platform.machine()
    assert env["cpu_model"] == expected
    assert env["amp"] == "bf16"
    assert isinstance(env["cpu_native_bf16"], bool)
    for key in ("commit", "torch", "threads", "python", "command"):
        assert key in env
    assert env["date"] == datetime.date.today().isoformat()  # the footnote of docs/benchmarks.md prints it
    per_system = common.environment(amp={"codegen-tiny": "auto: bf16", "tfidf-lr": "none"})
    assert per_system["amp"] == {"codegen-tiny": "auto: bf16", "tfidf-lr": "none"}


def test_environment_refuses_to_leave_the_amp_out():
    with pytest.raises(TypeError):
        common.environment()  # type: ignore[call-arg]
    for bad in ("", {}, {"x": ""}):
        with pytest.raises(ValueError):
            common.environment(amp=bad)


def test_preset_amp_is_the_presets_setting_after_overrides_resolved_for_this_cpu():
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    auto = "bf16" if ("avx512_bf16" in text or "amx_bf16" in text) else "none"
    assert common.preset_amp("transformer-tiny") == f"auto: {auto}"  # the preset says amp: auto
    assert common.preset_amp("transformer-tiny", ["train.amp=none"]) == "none"
    assert common.preset_amp("trec6-tiny", ["train.seed=3", "train.amp=bf16"]) == "bf16"


def environment_calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "environment"]


def test_every_bench_script_that_writes_results_records_its_amp():
    writers = []
    for script in sorted(BENCH.glob("*.py")):
        source = script.read_text(encoding="utf-8")
        tree = ast.parse(source)
        calls = environment_calls(tree)
        for call in calls:
            assert [k.arg for k in call.keywords] == ["amp"] and not call.args, \
                f"{script.name}:{call.lineno}: environment() without amp="
        writes = "save_results(" in source or ("RESULTS" in source and "write_text(" in source)
        if script.name == "reproduce.py":  # drives the CLI only, so it records its own environment block
            assert '"amp": self.args.amp' in source and '"cpu": cpu_model()' in source
            continue
        if script.name in ("reproduce_report.py", "reproduce_results.py", "reproduce_figures.py"):
            # read reproduce.py's results; write docs, figures and temporary files for sacreBLEU only
            assert "save_results(" not in source and "write_json(RESULTS" not in source
            continue
        if script.name == "reproduce_runner.py":  # starts reproduce.py, which writes the results; writes none itself
            assert "save_results(" not in source and "write_json(" not in source
            continue
        if script.name != "common.py" and writes:
            writers.append(script.name)
            assert calls, f"{script.name} writes a results file without an environment block"
    # the scripts this test is about (a new one is covered by the loop above)
    assert {"train_speed.py", "decode_speed.py", "ct2_decode.py", "flops.py", "quality.py", "classify_quality.py",
            "classify_speed.py", "classify_sweep.py", "classify_ensemble.py", "codegen_quality.py",
            "analysis_multi30k.py", "serve_load.py"} <= set(writers)


def test_merged_rows_keep_what_their_file_recorded_and_invent_nothing():
    old = {"command": "python bench/classify_quality.py", "commit": "abc1234", "cpu": "x86_64"}
    row = {"dataset": "trec6", "system": "trec6-tiny"}
    assert merged_provenance(old, row) == {"command": old["command"], "commit": "abc1234"}
    new = {**old, "cpu_model": "AMD EPYC 9B45", "amp": {"trec6-tiny": "auto: bf16", "tfidf-lr": "none"}}
    assert merged_provenance(new, row) == {"command": old["command"], "commit": "abc1234",
                                           "cpu_model": "AMD EPYC 9B45", "amp": "auto: bf16"}
    assert merged_provenance({**new, "amp": "none"}, row)["amp"] == "none"


def test_report_names_cpu_and_amp_only_where_the_file_has_them():
    env = {"command": "python bench/x.py", "commit": "abc1234", "torch": "2.13.0", "threads": 2, "cpu": "x86_64"}
    assert header("T", {"environment": env}, ["a"])[2] == "`python bench/x.py` (commit abc1234, torch 2.13.0, 2 threads)"
    env = {**env, "cpu_model": "AMD EPYC", "amp": {"a": "auto: bf16", "b": "auto: bf16"}}
    assert header("T", {"environment": env}, ["a"])[2].endswith("2 threads, CPU AMD EPYC, amp auto: bf16)")
    env["amp"] = {"a": "none", "b": "auto: bf16"}
    assert header("T", {"environment": env}, ["a"])[2].endswith("CPU AMD EPYC, amp a none; b auto: bf16)")
