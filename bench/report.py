"""Markdown tables from bench/results/*.json, for docs/benchmarks.md (numbers are never typed by hand).

    python bench/report.py                      # a table per results file, with its command
    python bench/report.py --doc-tables         # every table of docs/benchmarks.md, between its markers
    python bench/report.py --doc-table NAME     # one of them (names: --list)
    python bench/report.py --update-doc docs/benchmarks.md   # rewrite the doc's marked tables in place

docs/benchmarks.md holds each doc table between `<!-- table: NAME -->` and `<!-- /table -->`, the table followed
by its footnote: per results file the command that wrote it, the date it was recorded and the machine;
tests/bench/test_benchmarks_doc.py fails when the text there differs from what `doc_table(NAME)` prints.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS  # noqa: E402
from bench.preset_changes import changed_after  # noqa: E402


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def rows_by_system(result: dict) -> dict[str, dict]:
    return {row["system"]: row for row in result["rows"]}


# benchmark systems that train a preset under another name (bench/quality.py: mat-proximal trains mat-tiny twice)
TRAINED_PRESET = {"mat-proximal": "mat-tiny"}


def system_cell(system: str, measured: str | None, marks: list[str], label: str | None = None) -> str:
    """`label` (default `system`), marked with a dagger (and a line added to `marks`) when `system` names a preset,
    or trains one (TRAINED_PRESET), whose definition changed after `measured`, the date its results file records
    (bench/preset_changes.py): the row is then not the preset's as it is defined."""
    label = label or system
    preset = TRAINED_PRESET.get(system, system)
    changed = changed_after(preset, measured)
    if changed is None:
        return label
    marks.append(f"{preset} (measured {measured}, changed {changed})")
    return label + " †"


def oldest(dates: list[str | None]) -> str | None:
    """The oldest of the dates of a row's results files; None when any of them records none."""
    return None if None in dates or not dates else min(dates)  # type: ignore[type-var]


def measured_on(result: dict) -> str | None:
    """The date a results file records (None in files that predate the field)."""
    return result["environment"].get("date")


def header(title: str, result: dict, columns: list[str]) -> list[str]:
    env = result["environment"]
    return [f"### {title}", "", f"`{env['command']}` (commit {env['commit']}, torch {env['torch']}, "
            f"{env['threads']} threads{machine(env)})", "", "| " + " | ".join(columns) + " |",
            "|" + "---|" * len(columns)]


def machine(env: dict) -> str:
    """", CPU <model>, amp <setting>" from a results file that records them (older files do not: nothing)."""
    parts = [f"CPU {env['cpu_model']}"] if env.get("cpu_model") else []
    amp = env.get("amp")
    if isinstance(amp, dict):  # one setting per system: said once when they agree
        settings = set(amp.values())
        amp = settings.pop() if len(settings) == 1 else "; ".join(f"{k} {v}" for k, v in amp.items())
    if amp:
        parts.append(f"amp {amp}")
    return "".join(f", {p}" for p in parts)


def train_speed(name: str) -> list[str]:
    result = load(name)
    if result is None:
        return []
    rows = rows_by_system(result)
    ours, hf = rows["multibranch"], rows["hf-marian"]
    lines = header(f"Training speed, amp={ours['amp']}", result,
                   ["system", "parameters", "target tokens/s (median round)", "ms/update", "peak RSS MB",
                    "tokens/s vs HF", "RSS vs HF", "step time vs ours"])
    for row in rows.values():
        lines.append(f"| {row['system']} | {row['parameters'] / 1e6:.2f}M | {row['tokens_per_s']:.0f} | "
                     f"{row['ms_per_update']:.0f} | {row['peak_rss_mb']:.0f} | "
                     f"{row['tokens_per_s'] / hf['tokens_per_s']:.2f}x | {row['peak_rss_mb'] / hf['peak_rss_mb']:.2f}x | "
                     f"{row['ms_per_update'] / ours['ms_per_update']:.2f}x |")
    return lines + [""]


def presets_speed(name: str) -> list[str]:
    result = load(name)
    if result is None:
        return []
    rows = rows_by_system(result)
    base = rows["transformer-tiny"]
    flops = rows_by_system(load("presets_flops") or {"rows": []})
    lines = header("Training step per preset", result,
                   ["preset", "parameters", "ms/update", "target tokens/s", "peak RSS MB", "step vs transformer-tiny",
                    "GFLOP/update", "FLOPs vs transformer-tiny"])
    for row in rows.values():
        counted = flops.get(row["system"])
        flop_cells = (f"{counted['gflops_per_update']:.1f} | "
                      f"{counted['gflops_per_update'] / flops['transformer-tiny']['gflops_per_update']:.2f}x"
                      if counted and "transformer-tiny" in flops else "– | –")
        lines.append(f"| {row['system']} | {row['parameters'] / 1e6:.2f}M | {row['ms_per_update']:.0f} | "
                     f"{row['tokens_per_s']:.0f} | {row['peak_rss_mb']:.0f} | "
                     f"{row['ms_per_update'] / base['ms_per_update']:.2f}x | {flop_cells} |")
    if flops:
        lines += ["", f"FLOPs: `{load('presets_flops')['environment']['command']}`"]
    return lines + [""]


def decode_speed(name: str, title: str) -> list[str]:
    result = load(name)
    if result is None:
        return []
    # newer files have a row per system, precision and batch size: each is compared with HF at the same two
    rows = {(r["system"], r.get("precision"), r.get("batch")): r for r in result["rows"]}
    base = rows.get(("hf-generate", None, None)) or next(iter(rows.values()))
    lines = header(title, result, ["system", "precision", "batch", "parameters", "sentences/s", "output words/s",
                                   "BLEU", "sentences/s vs HF generate (same precision and batch)"])
    for (system, precision, batch), row in rows.items():
        peer = rows.get(("hf-generate", precision, batch), base)
        params = f"{row['parameters'] / 1e6:.2f}M" if "parameters" in row else "–"
        lines.append(f"| {system} | {precision or '–'} | {batch or '–'} | {params} | {row['sentences_per_s']:.1f} | "
                     f"{row['words_per_s']:.0f} | {row['bleu']:.2f} | "
                     f"{row['sentences_per_s'] / peer['sentences_per_s']:.2f}x |")
    return lines + [""]


def gpu_train_speed(name: str) -> list[str]:
    """bench/train_speed.py --device cuda: tokens/s, model FLOP utilisation and GPU memory, per batch size."""
    result = load(name)
    if result is None:
        return []
    env, peak, matmul = result["environment"], result["peak_tflops"], result["measured_matmul_tflops"]
    lines = [f"### Training speed on {env.get('gpu', 'a GPU')}, amp={env['amp']}", "",
             f"`{env['command']}` (commit {env['commit']}, torch {env['torch']})", "",
             "| max tokens (real / update) | system | params | target tok/s | ms / update | model TFLOP/s | "
             f"MFU (of {peak:.0f}) | of the measured matmul ({matmul:.0f}) | peak GPU MB | vs HF |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    hf = {r["max_tokens"]: r for r in result["rows"] if r["system"] == "hf-marian"}
    for r in result["rows"]:
        tokens = f"{r['max_tokens']} ({r['tokens'] / r['updates']:,.0f})"
        lines.append(f"| {tokens} | {r['system']} | {r['parameters'] / 1e6:.2f}M | {r['tokens_per_s']:,.0f} | "
                     f"{r['ms_per_update']:.1f} | {r['model_tflops_per_s']:.1f} | "
                     f"{100 * r['model_tflops_per_s'] / peak:.1f}% | {100 * r['model_tflops_per_s'] / matmul:.1f}% | "
                     f"{r['peak_gpu_memory_mb']:,.0f} | {r['tokens_per_s'] / hf[r['max_tokens']]['tokens_per_s']:.2f}x |")
    return lines + [""]


def ct2_decode(name: str) -> list[str]:
    """Our decoder against CTranslate2 (and, on CUDA, HF `generate`), alternating rounds; per batch size."""
    result = load(name)
    if result is None:
        return []
    env, base = result["environment"], result.get("base", result["rows"][0]["engine"])
    batches = result["batch"] if isinstance(result["batch"], list) else [result["batch"]]
    where = f"{result['gpu']}, " if result.get("gpu") else f"{result['threads']} threads, "
    lines = [f"### Our decoder against CTranslate2 ({result['sentences']} sentences of {result['corpus']})", "",
             f"`{env['command']}` (commit {env['commit']}, torch {env['torch']}, ctranslate2 {env.get('ctranslate2')}, "
             f"{where}beam {result['beam']}, batch {' and '.join(map(str, batches))}, "
             f"{result.get('rounds', '?')} alternating rounds)", "",
             f"| engine | batch | sentences/s (best round) | vs {base} (median of rounds, min–max) | CPU time vs {base} | "
             f"BLEU | BLEU - {base} |", "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        batch = row.get("batch", batches[0])
        reference = next((r for r in result["rows"] if r["engine"] == base and r.get("batch", batch) == batch), None)
        ratio = row.get("ratio_median", row["sentences_per_s"] / result["rows"][0]["sentences_per_s"])
        spread = f" ({row['ratio_min']:.2f}–{row['ratio_max']:.2f})" if "ratio_min" in row else ""
        cpu = f"{row['cpu_ratio_median']:.2f}x" if "cpu_ratio_median" in row else "–"
        delta = f"{row['bleu'] - reference['bleu']:+.2f}" if reference is not None else "–"
        lines.append(f"| {row['engine']} | {batch} | {row['sentences_per_s']:.1f} | {ratio:.2f}x{spread} | {cpu} | "
                     f"{row['bleu']:.2f} | {delta} |")
    if result.get("pairs"):
        lines += ["", "| ours | peer | batch | speed of ours / peer (median of rounds, min–max) |", "|---|---|---|---|"]
        lines += [f"| {pair['ours']} | {pair['peer']} | {pair.get('batch', batches[0])} | {pair['speed_median']:.2f}x "
                  f"({pair['speed_min']:.2f}–{pair['speed_max']:.2f}) |" for pair in result["pairs"]]
    if result.get("failed"):
        lines += ["", *(f"Left out: {f['engine']}: {f['error']}" for f in result["failed"])]
    return lines + [""]


def quality(name: str, title: str) -> list[str]:
    result = load(name)
    if result is None:
        return []
    minutes = {row["minutes_budget"] for row in result["rows"]}
    lines = [f"### {title}", "", f"Budget: {', '.join(f'{m:g}' for m in sorted(minutes))} minutes of training per "
             f"system. Last command: `{result['environment']['command']}` (each system was run by the same command "
             "with its own `--systems`).", "",
             "| system | parameters | updates | target tokens/s | test BLEU (best by valid loss) | "
             "test BLEU (avg of last 3) | chrF (best) |", "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        avg = row.get("avg_last3", {}).get("bleu")
        lines.append(f"| {row['system']} | {row['parameters'] / 1e6:.2f}M | {row['updates']} | "
                     f"{row['tokens_per_s']:.0f} | {row['best']['bleu']:.2f} | "
                     f"{'–' if avg is None else f'{avg:.2f}'} | {row['best']['chrf']:.2f} |")
    signatures = {row["best"]["signature"] for row in result["rows"]}
    return lines + ["", f"sacreBLEU signature: `{' / '.join(sorted(signatures))}`", ""]


def classify_quality(name: str) -> list[str]:
    """Per dataset: test accuracy / macro-F1 (mean ± sd over seeds) and the largest CPU / wall time of a run."""
    result = load(name)
    if result is None:
        return []
    lines = []
    for dataset in dict.fromkeys(row["dataset"] for row in result["rows"]):
        rows = [row for row in result["rows"] if row["dataset"] == dataset]
        splits = rows[0]["splits"]
        lines += [f"### {dataset}: held-out test accuracy (bench/results/{name}.json)", "",
                  f"torch {result['environment']['torch']}; the commands are listed under the table. Splits of the shared "
                  f"training file: train {splits['train']['examples']}, valid {splits['valid']['examples']}, test "
                  f"{splits['test']['examples']} ({splits['test']['in_train']} test texts also occur in train).", "",
                  "| system | parameters | seeds | test accuracy % | test macro-F1 % | CPU min / run (max) | "
                  "wall min / run (max) | threads | updates |", "|---|---|---|---|---|---|---|---|---|"]
        for row in rows:
            short = " (shortened)" if row.get("max_steps_override") else ""
            params = f"{row['parameters'] / 1e6:.2f}M" if "parameters" in row else "–"
            seeds = len(row["runs"]) if row["runs"][0]["seed"] is not None else "–"
            updates = "/".join(sorted({str(r["updates"]) for r in row["runs"] if "updates" in r})) or "–"
            lines.append(f"| {row['system']}{short} | {params} | {seeds} | {100 * row['accuracy_mean']:.2f} ± "
                         f"{100 * row['accuracy_sd']:.2f} | {100 * row['macro_f1_mean']:.2f} ± "
                         f"{100 * row['macro_f1_sd']:.2f} | {row['cpu_s_max'] / 60:.1f} | {row['wall_s_max'] / 60:.1f} | "
                         f"{row.get('threads', '–')} | {updates} |")
        lines.append("")
        commands = dict.fromkeys((row.get("command", "(not recorded)"), row.get("commit", "?")) for row in rows)
        lines += [f"- `{command}` (commit {commit})" for command, commit in commands] + [""]
    return lines


def classify_speed(name: str) -> list[str]:
    result = load(name)
    if result is None:
        return []
    rows = rows_by_system(result)
    ours, hf = rows["multibranch"], rows["hf-bert"]
    result = {**result, "environment": {**result["environment"], "threads": ours["threads"]}}  # the children's
    lines = header(f"Classifier training speed ({ours['preset']} on {ours['dataset']} batches), amp={ours['amp']}",
                   result, ["system", "parameters", "sentences/s (median round)", "non-pad tokens/s", "ms/update",
                            "peak RSS MB", "sentences/s vs HF", "RSS vs HF"])
    for row in rows.values():
        lines.append(f"| {row['system']} | {row['parameters'] / 1e6:.2f}M | {row['sentences_per_s']:.0f} | "
                     f"{row['tokens_per_s']:.0f} | {row['ms_per_update']:.0f} | {row['peak_rss_mb']:.0f} | "
                     f"{row['sentences_per_s'] / hf['sentences_per_s']:.2f}x | "
                     f"{row['peak_rss_mb'] / hf['peak_rss_mb']:.2f}x |")
    return lines + [""]


# --- the tables of docs/benchmarks.md: one per question, each with the files, commands and machines behind it ---

def where(name: str) -> str:
    """The machine a results file records: GPU, CPU model (or only the architecture), torch, autocast."""
    result = load(name)
    env = result["environment"]
    rows = result.get("rows") if isinstance(result.get("rows"), list) else []
    gpu = env.get("gpu") or result.get("gpu") or next((r["gpu"] for r in rows if r.get("gpu")), None)
    parts = [gpu] if gpu else []
    if env.get("cpu_model"):
        parts.append(f"CPU {env['cpu_model']}")
    elif env.get("host_cores"):
        parts.append(f"{env['host_cores']} host cores, CPU model not recorded")
    elif not gpu:
        parts.append(f"CPU {env.get('cpu', '?')}, model not recorded")
    parts.append(f"torch {env['torch']}")
    amp = env.get("amp")
    if isinstance(amp, dict):
        settings = set(amp.values())
        amp = settings.pop() if len(settings) == 1 else "; ".join(f"{k} {v}" for k, v in amp.items())
    if amp:
        parts.append(f"autocast {amp}")
    return ", ".join(parts)


MACHINE_RUNS = re.compile(r"(?<![\w.$~-])/(?:[\w.+-]+/)*?(?=runs/)")  # /work/runs/x -> runs/x
MACHINE_TEMP = re.compile(r"(?<![\w.$~-])/(?:var/)?tmp/")  # /tmp/x -> $TMPDIR/x


def portable(command: str) -> str:
    """A results file's command as one types it in a checkout: the absolute paths of the machine that ran it are
    shown from their `runs/` folder on (`/work/runs/m30k/best.pt` -> `runs/m30k/best.pt`), and a temporary
    directory as `$TMPDIR/...`."""
    return MACHINE_TEMP.sub("$TMPDIR/", MACHINE_RUNS.sub("", command))


def footnote(*names: str, merged: list[str] | None = None) -> list[str]:
    """The generated footnote under a table: per results file its path, the exact command that wrote it, the date
    it was recorded and the machine (GPU, CPU, torch, autocast); `merged`: the commands of rows merged into it."""
    lines = ["", "Source" + ("s" if len(names) > 1 else "") + " (results file: command; date recorded, machine):", ""]
    for name in names:
        env = load(name)["environment"]
        lines.append(f"- `bench/results/{name}.json`: `{portable(env['command'])}`; {env['date']}, {where(name)}")
    if merged:
        lines += ["", "Rows merged into it, each from its own command:", "", *(f"- `{portable(c)}`" for c in merged)]
    return lines


def notes(marks: list[str]) -> list[str]:
    """The line under a table that names its rows marked by `system_cell`, each preset once."""
    if not marks:
        return []
    return ["", "† measured before the preset's definition changed (bench/preset_changes.json): "
            + ", ".join(dict.fromkeys(marks)) + "; such a row holds the numbers of the definition it measured."]


def table(columns: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)]


def doc_cpu_train() -> list[str]:
    names = ("train_speed_none", "train_speed_bf16")
    rows = []
    for name in names:
        by = rows_by_system(load(name))
        ours, hf = by["multibranch"], by["hf-marian"]
        for row in by.values():
            rows.append([row["amp"], row["system"], f"{row['parameters'] / 1e6:.2f}M", f"{row['tokens_per_s']:.0f}",
                         f"{row['ms_per_update']:.0f}", f"{row['peak_rss_mb']:.0f}",
                         f"{row['tokens_per_s'] / hf['tokens_per_s']:.2f}x",
                         f"{row['peak_rss_mb'] / hf['peak_rss_mb']:.2f}x",
                         f"{row['ms_per_update'] / ours['ms_per_update']:.2f}x"])
    return table(["autocast", "system", "parameters", "target tokens/s (median round)", "ms/update", "peak RSS MB",
                  "tokens/s vs HF", "peak RSS vs HF", "step time vs multibranch"], rows) + footnote(*names)


def doc_cpu_train_presets() -> list[str]:
    rows_speed = rows_by_system(load("presets_speed_bf16"))
    flops = rows_by_system(load("presets_flops"))
    base, base_flops = rows_speed["transformer-tiny"], flops["transformer-tiny"]["gflops_per_update"]
    rows, marks = [], []
    for row in rows_speed.values():
        step = row["ms_per_update"] / base["ms_per_update"]
        flop = flops[row["system"]]["gflops_per_update"] / base_flops
        rows.append([system_cell(row["system"], measured_on(load("presets_speed_bf16")), marks),
                     f"{row['parameters'] / 1e6:.2f}M", f"{row['ms_per_update']:.0f}",
                     f"{row['tokens_per_s']:.0f}", f"{row['peak_rss_mb']:.0f}", f"{step:.2f}x",
                     f"{flops[row['system']]['gflops_per_update']:.1f}", f"{flop:.2f}x", f"{step / flop:.2f}"])
    return table(["preset", "parameters", "ms/update", "target tokens/s", "peak RSS MB", "step time vs transformer-tiny",
                  "GFLOP/update", "FLOPs vs transformer-tiny", "step-time ratio / FLOP ratio"], rows) + notes(marks) + \
        footnote("presets_speed_bf16", "presets_flops")


def doc_cpu_train_malloc() -> list[str]:
    result = load("malloc_speed_none")
    by = rows_by_system(result)
    twin = "+glibc-malloc"
    rows = []
    for name, row in by.items():
        if name.endswith(twin):
            continue
        glibc = by[name + twin]
        rounds = list(zip(row["tokens_per_s_all"], glibc["tokens_per_s_all"]))
        faster = f"{sum(kept > default for kept, default in rounds)} of {len(rounds)}"
        for label, r, wins in (("glibc's defaults", glibc, ""), ("freed blocks kept", row, faster)):
            rows.append([name, label, f"{r['ms_per_update']:.0f}", f"{r['page_faults_per_update']:.0f}",
                         f"{r['peak_rss_mb']:.0f}", f"{glibc['ms_per_update'] / r['ms_per_update']:.2f}x", wins])
    return table(["preset", "malloc", "ms/update (median round)", "page faults/update", "peak RSS MB",
                  "speed vs glibc's defaults", "rounds faster"], rows) + footnote("malloc_speed_none")


def doc_cpu_train_dropout() -> list[str]:
    labels = {"kernel": "multibranch, C++ kernel", "composed": "multibranch, PyTorch operations",
              "torch": "PyTorch's `F.dropout`"}
    rows = [[r["preset"], labels[r["variant"]], f"{r['ms_per_update']:.0f}", f"{r['speed_vs_torch']:.2f}x",
             f"{r['faster_than_torch']} of {r['pairs']}" if r["variant"] != "torch" else ""]
            for r in load("dropout_speed_none")["rows"]]
    return table(["preset", "dropout", "ms/update (mean)", "speed vs `F.dropout` (median pair)",
                  "updates faster than `F.dropout`"], rows) + footnote("dropout_speed_none")


def round_ratios(names: tuple[str, ...], ours: str, peer: str) -> list[float]:
    """Speed of ours / peer in every round of the named ct2_decode files (each round times both)."""
    ratios = []
    for name in names:
        seconds = {row["engine"]: row["round_seconds"] for row in load(name)["rows"]}
        ratios += [p / o for o, p in zip(seconds[ours], seconds[peer])]
    return ratios


def doc_cpu_decode_ct2() -> list[str]:
    names = ("ct2_decode_converged_v5", "ct2_decode_converged_v5_7rounds")
    first = load(names[0])
    rows = [[r["engine"], f"{r['sentences_per_s']:.1f}",
             f"{r['ratio_median']:.2f}x ({r['ratio_min']:.2f}–{r['ratio_max']:.2f})", f"{r['bleu']:.2f}",
             f"{r['bleu'] - first['rows'][0]['bleu']:+.2f}"] for r in first["rows"]]
    lines = table(["engine", "sentences/s (best round)", "vs multibranch-fp32 (median of rounds, min–max)", "BLEU",
                   "BLEU - multibranch-fp32"], rows) + [""]
    pooled = []
    for ours, peer in (("multibranch-fp32", "ct2-float32"), ("multibranch-int8", "ct2-int8")):
        ratios = round_ratios(names, ours, peer)
        pooled.append([ours, peer, len(ratios), f"{statistics.median(ratios):.2f}x",
                       f"{min(ratios):.2f}–{max(ratios):.2f}", sum(r >= 1 for r in ratios)])
    return lines + table(["ours", "peer", "rounds (both files)", "speed of ours / peer, median", "min–max",
                          "rounds ≥ 1"], pooled) + footnote(*names)


def doc_cpu_decode_hf() -> list[str]:
    result = load("decode_speed")
    rows = [[r["system"], f"{r['sentences_per_s']:.1f}", f"{r['words_per_s']:.0f}", f"{r['bleu']:.2f}",
             f"{r['sentences_per_s'] / result['rows'][-1]['sentences_per_s']:.2f}x"] for r in result["rows"]]
    return table(["system", "sentences/s", "output words/s", "BLEU (300 valid sentences)",
                  "sentences/s vs hf-generate"], rows) + footnote("decode_speed")


def doc_cpu_decode_presets() -> list[str]:
    result = load("decode_presets_fixed_kernels")
    rows = {(r["system"], r["precision"]): r for r in result["rows"]}
    base = rows[("transformer-tiny", "fp32")]["sentences_per_s"]
    out, marks = [], []
    for (system, precision), row in rows.items():
        if precision != "fp32":
            continue
        composed = rows[(system, "fp32-composed")]["sentences_per_s"]
        out.append([system_cell(system, measured_on(result), marks), f"{row['parameters'] / 1e6:.2f}M",
                    f"{row['sentences_per_s']:.1f}",
                    f"{row['sentences_per_s'] / base:.2f}x", f"{composed:.1f}",
                    f"{row['sentences_per_s'] / composed:.2f}x"])
    return table(["preset", "parameters", "sentences/s (fp32)", "vs transformer-tiny", "sentences/s (fp32-composed)",
                  "fp32 / fp32-composed"], out) + notes(marks) + footnote("decode_presets_fixed_kernels")


def doc_gpu_train() -> list[str]:
    """The GPU training-speed rows of every GPU measured, each against Hugging Face Marian of the same call."""
    names = [name for name in ("gpu_train_speed", "gpu_call_train_speed") if load(name) is not None]
    rows = []
    for name in names:
        result = load(name)
        peak = result["peak_tflops"]
        hf = {r["max_tokens"]: r for r in result["rows"] if r["system"] == "hf-marian"}
        for r in result["rows"]:
            peer = hf.get(r["max_tokens"])
            busy = r.get("gpu_busy_fraction")
            rows.append([r.get("gpu", "–"), r["max_tokens"], r["system"], "yes" if r.get("graphs") else "no",
                         f"{r['tokens_per_s']:,.0f}", f"{r['ms_per_update']:.1f}", f"{r['model_tflops_per_s']:.1f}",
                         f"{100 * r['model_tflops_per_s'] / peak:.1f}% of {peak:.0f}",
                         f"{100 * busy:.0f}%" if busy is not None else "–", f"{r['peak_gpu_memory_mb']:,.0f}",
                         f"{r['tokens_per_s'] / peer['tokens_per_s']:.2f}x" if peer else "not measured"])
    m30k = load("gpu_train_m30k")
    return table(["GPU", "max tokens", "system", "CUDA graphs", "target tokens/s", "ms/update", "model TFLOP/s",
                  "MFU", "GPU busy", "peak GPU MB", "tokens/s vs hf-marian (same call)"], rows) + [
        "", f"`gpu_train_m30k`: {m30k['updates']:,} updates in {m30k['train_minutes']:g} training minutes "
        f"({m30k['updates_per_s']:.0f} updates/s), {m30k['shapes']}."] + footnote(*names, "gpu_train_m30k")


def doc_gpu_decode() -> list[str]:
    result = load("decode_gpu")
    rows = [[r["engine"], r["batch"], f"{r['sentences_per_s']:.1f}", f"{r['bleu']:.2f}"] for r in result["rows"]]
    lines = table(["engine", "batch", "sentences/s (best round)", "BLEU"], rows) + [""]
    best = {(r["engine"], r["batch"]): r["sentences_per_s"] for r in result["rows"]}
    pairs = [[p["ours"], p["peer"], p["batch"], f"{best[(p['ours'], p['batch'])] / best[(p['peer'], p['batch'])]:.2f}x",
              f"{p['speed_median']:.2f}x ({p['speed_min']:.2f}–{p['speed_max']:.2f})"] for p in result["pairs"]]
    return lines + table(["ours", "peer", "batch", "speed of ours / peer, best rounds",
                          "median of rounds (min–max)"], pairs) + footnote("decode_gpu")


def doc_quality() -> list[str]:
    rows, marks = [], []
    for name in ("quality", "quality_presets"):
        for row in load(name)["rows"]:
            avg = row.get("avg_last3", {}).get("bleu")
            rows.append([f"{row['minutes_budget']:g}", system_cell(row["system"], measured_on(load(name)), marks),
                         f"{row['parameters'] / 1e6:.2f}M", row["updates"],
                         f"{row['tokens_per_s']:.0f}", f"{row['best']['bleu']:.2f}",
                         "–" if avg is None else f"{avg:.2f}", f"{row['best']['chrf']:.2f}"])
    signatures = {row["best"]["signature"] for name in ("quality", "quality_presets") for row in load(name)["rows"]}
    return table(["training minutes", "system", "parameters", "updates", "target tokens/s",
                  "test BLEU (best by valid loss)", "test BLEU (average of last 3)", "chrF (best)"], rows) + [
        "", f"sacreBLEU signature: `{' / '.join(sorted(signatures))}`"] + notes(marks) + footnote("quality",
                                                                                            "quality_presets")



def _stdev(values: list[float]) -> float:
    """The sample standard deviation (0 for a single run)."""
    return statistics.stdev(values) if len(values) > 1 else 0.0

def summary_row(dataset: str, system: str, runs: list[dict], params: int | None, measured: str | None,
                marks: list[str], label: str | None = None) -> list:
    accuracy = [100 * r["accuracy"] for r in runs]
    f1 = [100 * r["macro_f1"] for r in runs]
    seeds = len(runs) if runs[0]["seed"] is not None else "–"
    return [dataset, system_cell(system, measured, marks, label), f"{params / 1e6:.2f}M" if params else "–", seeds,
            f"{statistics.mean(accuracy):.2f} ± {_stdev(accuracy):.2f}", f"{statistics.mean(f1):.2f} ± {_stdev(f1):.2f}",
            f"{max(r['cpu_s'] for r in runs) / 60:.1f}"]


CLASSIFY_COLUMNS = ["dataset", "system", "parameters", "seeds", "test accuracy %", "test macro-F1 %",
                    "CPU min / run (max)"]


def doc_classify() -> list[str]:
    result = load("classify_quality")
    rows = sorted(result["rows"], key=lambda r: (r["dataset"] != "trec6", r["system"] != "tfidf-lr",
                                                  "minilm" not in r["system"]))
    marks: list[str] = []
    lines = [summary_row({"trec6": "TREC-6", "sst2": "SST-2"}[r["dataset"]], r["system"], r["runs"],
                         r.get("parameters"), measured_on(result), marks) for r in rows]
    commands = list(dict.fromkeys(r.get("command", "(not recorded)") for r in result["rows"]))
    return table(CLASSIFY_COLUMNS, lines) + notes(marks) + footnote("classify_quality", merged=commands)


def doc_classify_pairs() -> list[str]:
    # RTE's seed 1 of our presets is in cq_pairs_seed1, seeds 2 and 3 in cq_pairs_rte; MRPC's three in cq_pairs_mrpc
    # (read first: its seed 1 is the run the three-seed row is of)
    names = ("cq_pairs_mrpc", "cq_pairs_rte", "cq_pairs_seed1", "cq_pairs_hf_rte", "cq_pairs_hf_mrpc",
             "cq_rte_clip1", "cq_mrpc_clip1")
    merged: dict[tuple[str, str], dict] = {}
    for name in names:
        clipped = " (clip_norm=1.0)" if "clip" in name else ""
        for row in load(name)["rows"]:
            key = (row["dataset"], row["system"] + clipped)
            entry = merged.setdefault(key, {"system": row["system"], "runs": {}, "parameters": row.get("parameters"),
                                            "dates": []})
            kept = [run for run in row["runs"] if run["seed"] not in entry["runs"]]
            for run in kept:
                entry["runs"][run["seed"]] = run
            if kept:  # the date of a file whose runs the row shows
                entry["dates"].append(measured_on(load(name)))
    marks: list[str] = []
    rows = [summary_row(dataset.upper(), entry["system"], list(entry["runs"].values()), entry["parameters"],
                        oldest(entry["dates"]), marks, label)
            for (dataset, label), entry in sorted(merged.items(), key=lambda kv: kv[0][0] != "rte")]
    return table(CLASSIFY_COLUMNS, rows) + notes(marks) + footnote(*names)


def doc_classify_speed() -> list[str]:
    names = ("classify_speed_none", "classify_speed_minilm_none", "classify_speed_minilm_bf16")
    rows, marks = [], []
    for name in names:
        by = rows_by_system(load(name))
        hf = by["hf-bert"]
        for row in by.values():
            rows.append([system_cell(row["preset"], measured_on(load(name)), marks), row["amp"], row["system"],
                         f"{row['parameters'] / 1e6:.2f}M",
                         f"{row['sentences_per_s']:.0f}", f"{row['ms_per_update']:.0f}", f"{row['peak_rss_mb']:.0f}",
                         f"{row['sentences_per_s'] / hf['sentences_per_s']:.2f}x",
                         f"{row['peak_rss_mb'] / hf['peak_rss_mb']:.2f}x"])
    return table(["architecture", "autocast", "system", "parameters", "sentences/s (median round)", "ms/update",
                  "peak RSS MB", "sentences/s vs HF", "peak RSS vs HF"], rows) + notes(marks) + footnote(*names)


def doc_prepare_scale() -> list[str]:
    result = load("prepare_scale_pread")
    rows = []
    for size in result["sizes"]:
        rows.append([f"{size['pairs']:,}", f"{size['prepare']['seconds']:.0f}", f"{size['prepare']['pairs_per_s']:,.0f}",
                     f"{size['prepare']['peak_rss_mb']:.0f}", f"{size['prepare']['worker_peak_rss_mb']:.0f}",
                     f"{size['prepare_reuse']['pairs_per_s']:,.0f}", f"{size['spm_encode']['pairs_per_s']:,.0f}",
                     f"{size['train']['seconds']:.1f}", f"{size['train_long']['peak_rss_mb']:.0f}"])
    return table(["pairs", "prepare s", "prepare pairs/s", "peak RSS MB", "worker peak RSS MB",
                  "pairs/s with the vocabulary reused", "SentencePiece's own encoder, pairs/s", "train start s",
                  f"train peak RSS MB ({result['settings']['train_updates']} updates)"], rows) + footnote(
        "prepare_scale_pread")


def doc_serve_load() -> list[str]:
    result = load("serve_load")
    rows = [[label, phase["clients"], phase["requests_sent"], f"{phase['sentences_per_s']:.1f}",
             f"{phase['latency_p50_ms']:.0f}", f"{phase['latency_p99_ms']:.0f}", phase["5xx_other_than_503"],
             phase["accepted_unanswered"]]
            for label, phase in (("one at a time", result["sequential"]), ("concurrent", result["concurrent"]))]
    return table(["phase", "clients", "requests", "sentences/s", "p50 ms", "p99 ms", "5xx other than 503",
                  "accepted, unanswered"], rows) + [
        "", f"Throughput of the concurrent phase over one-at-a-time requests: {result['speedup']:.1f}x."] + footnote(
        "serve_load")


DOC_TABLES = {
    "cpu-train": doc_cpu_train,
    "cpu-train-presets": doc_cpu_train_presets,
    "cpu-train-malloc": doc_cpu_train_malloc,
    "cpu-train-dropout": doc_cpu_train_dropout,
    "cpu-decode-ct2": doc_cpu_decode_ct2,
    "cpu-decode-hf": doc_cpu_decode_hf,
    "cpu-decode-presets": doc_cpu_decode_presets,
    "gpu-train": doc_gpu_train,
    "gpu-decode": doc_gpu_decode,
    "quality-multi30k": doc_quality,
    "classify": doc_classify,
    "classify-pairs": doc_classify_pairs,
    "classify-speed": doc_classify_speed,
    "prepare-scale": doc_prepare_scale,
    "serve-load": doc_serve_load,
}


def doc_table(name: str) -> str:
    """The text docs/benchmarks.md holds between `<!-- table: NAME -->` and `<!-- /table -->`."""
    return "\n".join(DOC_TABLES[name]()).strip("\n")


MARKER = re.compile(r"<!-- table: (?P<name>[\w-]+) -->\n(?P<body>.*?)\n?<!-- /table -->", re.S)


def doc_markers(text: str) -> dict[str, str]:
    """NAME -> the text between `<!-- table: NAME -->` and `<!-- /table -->` in a doc."""
    return {match["name"]: match["body"].strip("\n") for match in MARKER.finditer(text)}


def update_doc(path: Path) -> None:
    """Rewrite every marked table of a doc with what doc_table prints now."""
    text = MARKER.sub(lambda m: f"<!-- table: {m['name']} -->\n{doc_table(m['name'])}\n<!-- /table -->",
                      path.read_text())
    with path.open("w", encoding="utf-8") as doc:  # a doc, not a results file
        doc.write(text)


def doc_tables() -> str:
    return "\n\n".join(f"<!-- table: {name} -->\n{doc_table(name)}\n<!-- /table -->" for name in DOC_TABLES)


def all_files() -> str:
    sections = [
        *train_speed("train_speed_none"),
        *train_speed("train_speed_bf16"),
        *presets_speed("presets_speed_bf16"),
        *decode_speed("decode_speed", "Beam search vs HF generate"),
        *ct2_decode("ct2_decode_converged_v5"),
        *ct2_decode("ct2_decode_converged_v5_7rounds"),
        *ct2_decode("decode_gpu"),
        *quality("quality", "Multi30k quality: standard, MAT, HF Marian"),
        *quality("quality_presets", "Multi30k quality: every preset against the standard model"),
        *classify_quality("classify_quality"),
        *(line for name in ("cq_pairs_seed1", "cq_pairs_rte", "cq_pairs_hf_rte", "cq_pairs_mrpc", "cq_pairs_hf_mrpc")
          for line in classify_quality(name)),
        *classify_speed("classify_speed_none"),
        *classify_speed("classify_speed_minilm_none"),
        *classify_speed("classify_speed_minilm_bf16"),
    ]
    return "\n".join(sections)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--doc-tables", action="store_true", help="every table of docs/benchmarks.md, with its markers")
    group.add_argument("--doc-table", metavar="NAME", choices=sorted(DOC_TABLES), help="one table of docs/benchmarks.md")
    group.add_argument("--list", action="store_true", help="the names of the doc tables")
    group.add_argument("--update-doc", metavar="PATH", type=Path,
                       help="rewrite the marked tables of a doc (docs/benchmarks.md) in place")
    args = parser.parse_args(argv)
    if args.update_doc:
        update_doc(args.update_doc)
    elif args.list:
        print("\n".join(DOC_TABLES))
    elif args.doc_table:
        print(doc_table(args.doc_table))
    elif args.doc_tables:
        print(doc_tables())
    else:
        print(all_files())


if __name__ == "__main__":
    main()
