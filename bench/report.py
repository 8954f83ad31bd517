"""Markdown tables from bench/results/*.json, for docs/benchmarks.md (numbers are never typed by hand).

    python bench/report.py            # every table whose results file exists
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS  # noqa: E402


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def rows_by_system(result: dict) -> dict[str, dict]:
    return {row["system"]: row for row in result["rows"]}


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


def main() -> None:
    sections = [
        *train_speed("train_speed_none"),
        *train_speed("train_speed_bf16"),
        *presets_speed("presets_speed_bf16"),
        *gpu_train_speed("train_speed_gpu"),
        *decode_speed("decode_speed", "Beam search vs HF generate"),
        *decode_speed("decode_presets", "Beam search per preset"),
        *ct2_decode("ct2_decode"),
        *(line for name in ("ct2_decode_converged", "ct2_decode_converged_v2", "ct2_decode_converged_v3")
          for line in ct2_decode(name)),
        *quality("quality", "Multi30k quality: standard, MAT, HF Marian"),
        *quality("quality_presets", "Multi30k quality: every preset against the standard model"),
        *classify_quality("classify_quality"),
        *(line for name in ("cq_pairs_seed1", "cq_pairs_rte", "cq_pairs_hf_rte", "cq_pairs_mrpc", "cq_pairs_hf_mrpc")
          for line in classify_quality(name)),
        *classify_speed("classify_speed_none"),
        *classify_speed("classify_speed_bf16"),
    ]
    print("\n".join(sections))


if __name__ == "__main__":
    main()
