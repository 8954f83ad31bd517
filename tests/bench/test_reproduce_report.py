"""bench/reproduce_report.py on small hand-made results files (no data, no training): the statistics against
numbers worked out by hand, merging several calls (the later file wins, an unfinished record never replaces a
finished one, different recipes are refused), MAT rows that count only the chosen rho, the docs region written
and checked, the figures drawn, and p-values computed from saved translations. The command-line behaviour runs
the script as a subprocess; the statistics import its functions."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.reproduce_figures import (
    branch_importance_data,
    draw_pruning_curves,
    pruning_curves_data,
    system_color,
)
from bench.reproduce_report import END, START, main
from bench.reproduce_results import chosen_rho, default_files, load_results, merge, system_summary, table_runs
from tests.helpers.reproduction import compared, results, run, write

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "reproduce_report.py"
PNG = b"\x89PNG\r\n\x1a\n"


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


STANDARD = [run("standard", 1, 30.0, updates=1000, minutes=10.0), run("standard", 2, 31.0, updates=1200, minutes=12.0),
            run("standard", 3, 32.0, updates=1400, minutes=14.0)]
DROPHEAD = [run("drophead", 1, 31.0, compare=compared(30.0, 31.0, 0.01)),
            run("drophead", 2, 31.5, compare=compared(31.0, 31.5, 0.2)),
            run("drophead", 3, 33.5, compare=compared(30.5, 33.5, 0.001))]  # compared to another standard: stale
DROPHEAD_ROW = {"system": "drophead", "parameters": 52_000_000, "paper_claim": {"delta_bleu": 0.7, "claim": "+0.7"}}


def test_system_summary_pairs_seeds_with_the_standard_model():
    standard = {r["seed"]: r for r in STANDARD}
    base = system_summary("standard", STANDARD, standard)
    assert base["test_bleu"]["mean"] == pytest.approx(31.0) and base["test_bleu"]["sd"] == pytest.approx(1.0)
    assert base["updates"]["mean"] == pytest.approx(1200) and base["updates"]["sd"] == pytest.approx(200)
    assert base["train_minutes"]["mean"] == pytest.approx(12.0) and base["train_minutes"]["sd"] == pytest.approx(2.0)
    assert base["delta_bleu_to_standard"] is None and base["p_values"] == []

    mine = system_summary("drophead", DROPHEAD, standard, DROPHEAD_ROW, p_values={3: 0.04})
    delta = mine["delta_bleu_to_standard"]
    assert delta["values"] == pytest.approx([1.0, 0.5, 1.5]) and delta["seeds"] == [1, 2, 3]
    assert delta["mean"] == pytest.approx(1.0) and delta["sd"] == pytest.approx(0.5)
    assert mine["test_bleu"]["mean"] == pytest.approx(32.0)
    assert mine["test_bleu"]["sd"] == pytest.approx(statistics.stdev([31.0, 31.5, 33.5]))
    assert mine["test_chrf"]["mean"] == pytest.approx(64.0)
    # seed 3's recorded comparison scored another standard model: replaced by the p-value given
    assert mine["p_values"] == [{"seed": 1, "p_value": 0.01, "from": "results"},
                                {"seed": 2, "p_value": 0.2, "from": "results"},
                                {"seed": 3, "p_value": 0.04, "from": "computed"}]
    assert (mine["parameters"], mine["paper_delta_bleu"]) == (52_000_000, 0.7)

    one = system_summary("drophead", DROPHEAD[:1], {1: STANDARD[0]})
    assert one["test_bleu"]["sd"] is None and one["delta_bleu_to_standard"]["sd"] is None
    assert one["paper_delta_bleu"] == 0.7  # bench/reproduce.py's claims when no row is given


def mat_runs() -> list[dict]:
    return [run("standard-narrow", 1, 28.0), run("mat3-narrow", 1, 20.0, rho=0.1, grid=True),
            run("mat3-narrow", 1, 25.0, rho=0.2, grid=True), run("mat3-narrow", 2, 26.0, rho=0.2),
            run("mat3-narrow", 3, 27.0, rho=0.2), run("mat3-narrow", 3, 99.0, rho=0.3)]


def test_a_mat_row_counts_only_the_runs_of_the_chosen_rho(tmp_path):
    row = {"system": "mat3-narrow", "rho": 0.2, "rho_grid_valid_bleu": {"0.1": 21.0, "0.2": 26.0}}
    merged = merge([load_results(write(tmp_path / "r.json", results([*STANDARD, *mat_runs()], [row])))])
    runs = table_runs(merged)["mat3-narrow"]
    assert [(r["seed"], r["rho"]) for r in runs] == [(1, 0.2), (2, 0.2), (3, 0.2)]
    summary = system_summary("mat3-narrow", runs, {r["seed"]: r for r in STANDARD}, row)
    assert summary["test_bleu"]["mean"] == pytest.approx(26.0) and summary["rho"] == 0.2
    assert summary["delta_bleu_to_standard"]["values"] == pytest.approx([-5.0, -5.0, -5.0])


def test_without_its_row_mat_takes_the_rho_of_its_combination_else_its_grid(tmp_path):
    combination = {"system": "mat3-narrow-drophead", "rho": 0.3}
    merged = merge([load_results(write(tmp_path / "a.json", results(mat_runs(), [combination])))])
    assert chosen_rho("mat3-narrow", merged) == 0.3
    grid_only = [r for r in mat_runs() if r.get("grid")]
    merged = merge([load_results(write(tmp_path / "b.json", results(grid_only)))])
    assert chosen_rho("mat3-narrow", merged) == 0.2  # best validation BLEU of the grid


def test_the_later_file_wins_a_run_both_hold_and_a_note_says_so(tmp_path):
    first = write(tmp_path / "reproduce_h100_2.json", results([*STANDARD, *DROPHEAD], [DROPHEAD_ROW]))
    changed = run("drophead", 2, 35.0) | {"segments": [{"jobs": 1}]}  # retrained in a later call, alone
    unfinished = run("standard", 1, 0.0, status="unfinished")  # planned again, not finished: the old one stays
    second = write(tmp_path / "reproduce_h100_10.json", results([changed, unfinished], jobs=1))
    out = tmp_path / "rows.json"
    proc = report(second, first, "--json", out)  # the order given: the _2 file wins
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("drophead/seed2") == 1 and "record of reproduce_h100_2.json is used" in proc.stderr
    proc = report(first, second, "--json", out)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 2 and "the record of reproduce_h100_10.json is used" in notes[0]
    assert "standard/seed1" in notes[1] and "the finished record of reproduce_h100_2.json is kept" in notes[1]
    rows = {row["system"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["drophead"]["test_bleu"]["values"] == pytest.approx([31.0, 35.0, 33.5])
    assert rows["drophead"]["jobs"] == [1, 3] and rows["standard"]["seeds"] == [1, 2, 3]
    assert "| drophead | 52.00M | 1, 2, 3 |" in proc.stdout and "(jobs 1/3)" in proc.stdout


def test_files_of_different_recipes_are_refused_and_nothing_is_written(tmp_path):
    first = write(tmp_path / "a.json", results(STANDARD))
    second = write(tmp_path / "b.json", results(DROPHEAD, patience=3))
    doc = tmp_path / "doc.md"
    doc.write_text(f"# t\n{START}\n{END}\n", encoding="utf-8")
    before = doc.read_text()
    proc = report(first, second, "--docs", doc, "--json", tmp_path / "rows.json")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "patience" in proc.stderr
    assert proc.stdout == "" and doc.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "doc.md"]
    assert report(first, second, "--accept-difference", "patience").returncode == 0
    capped = write(tmp_path / "c.json", results(DROPHEAD, max_updates=8000))  # another update cap is comparable
    assert report(first, capped).returncode == 0


def test_an_unreadable_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    for path in (bad, tmp_path / "missing.json", write(tmp_path / "list.json", [1, 2])):
        proc = report(path)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr and path.name in proc.stderr


def test_default_files_leave_out_hyps_tiny_and_unfinished_results(tmp_path):
    write(tmp_path / "reproduce_h100_1.json", results(STANDARD))
    write(tmp_path / "reproduce_h100_1_hyps.json", {"standard/seed1": {"avg": ["a"], "best": ["a"]}})
    write(tmp_path / "reproduce_tiny.json", results(STANDARD, tiny=True))
    write(tmp_path / "reproduce_today.json", results([run("standard", 1, 0.0, status="unfinished")]))
    assert [f.path.name for f in default_files(tmp_path)] == ["reproduce_h100_1.json"]


def test_docs_region_is_rewritten_alone_and_check_tells_when_it_is_stale(tmp_path):
    results_file = write(tmp_path / "r.json", results([*STANDARD, *DROPHEAD], [DROPHEAD_ROW]))
    head, tail = "# Reproduction\n\nBefore the table.\n", "\nAfter the table.\n"
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "reproduction.md"
    doc.write_text(f"{head}{START}\nold table\n{END}{tail}", encoding="utf-8")
    assert report(results_file, "--docs", doc, "--check").returncode == 1
    proc = report(results_file, "--docs", doc)
    assert proc.returncode == 0, proc.stderr
    text = doc.read_text()
    assert text.startswith(head + START + "\n") and text.endswith(END + tail) and "old table" not in text
    row = ["drophead", "52.00M", "1, 2, 3", "1,000 ± 0 (best at 800)", "10.0 ± 0.0 (jobs 3)", "32.00 ± 1.32",
           "+1.00 ± 0.50", "0.010, 0.200, –", "+0.7"]
    assert "| " + " | ".join(row) + " |" in text.splitlines()
    assert "`r.json` (NVIDIA H100 80GB HBM3, commit 0123456789" in " ".join(text.split())  # a wrapped paragraph
    assert "![validation BLEU against updates, per system](images/reproduction/valid_curves.png)" in text
    assert (tmp_path / "docs" / "images" / "reproduction" / "valid_curves.png").read_bytes().startswith(PNG)
    check = report(results_file, "--docs", doc, "--check")
    assert check.returncode == 0, check.stderr
    no_markers = tmp_path / "plain.md"
    no_markers.write_text("# no markers\n", encoding="utf-8")
    proc = report(results_file, "--docs", no_markers)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert no_markers.read_text() == "# no markers\n" and not (tmp_path / "images").exists()


def test_the_minutes_are_labelled_by_the_device_the_runs_trained_on(tmp_path):
    """GPU minutes only for GPU calls: a CPU call's table and legend say CPU, a mix of the two says neither."""
    cpu_results = results([*STANDARD, *DROPHEAD], [DROPHEAD_ROW])
    cpu_results["environment"] = {"gpu": None, "device": "cpu", "commit": "0123456789abcdef", "torch": "2.13.0"}
    gpu = write(tmp_path / "r_gpu.json", results(STANDARD))
    cpu = write(tmp_path / "r_cpu.json", cpu_results)
    for files, label, shared in (([gpu], "GPU minutes", "one GPU"), ([cpu], "CPU minutes", "one CPU"),
                                 ([gpu, cpu], "training minutes", "one device")):
        doc = tmp_path / "reproduction.md"
        doc.write_text(f"{START}\n{END}\n", encoding="utf-8")
        proc = report(*files, "--docs", doc)
        assert proc.returncode == 0, proc.stderr
        header = next(line for line in doc.read_text().splitlines() if line.startswith("| system |"))
        assert header.split(" | ")[4] == label, header
        assert proc.stdout.splitlines()[0] == header  # the table on stdout too
        legend, capital = " ".join(doc.read_text().split()), label[0].upper() + label[1:]
        assert f"{capital}: training minutes per run (each seed's" in legend
        assert f"with jobs N, N runs shared {shared} (at one thread" in legend
        assert ("GPU" in label) == ("GPU minutes" in legend)


def test_a_cpu_calls_machine_and_threads_are_named_beside_its_minutes(tmp_path):
    """Minutes from machines of different speeds and thread counts side by side: the results files name each CPU
    and its flags, and a row whose runs trained at more than one thread says how many."""
    one_thread = results(STANDARD)
    one_thread["environment"] = {"device": "cpu", "cpu": "AMD EPYC", "cpu_flags": ["avx2"], "threads": 1}
    two_threads = results([{**r, "segments": [{"jobs": 1}]} for r in DROPHEAD], [DROPHEAD_ROW])
    two_threads["environment"] = {"device": "cpu", "cpu": "Intel Xeon", "cpu_flags": ["avx2", "avx512f"],
                                  "threads": "2"}
    two_threads["settings"]["jobs"] = 1
    doc = tmp_path / "reproduction.md"
    doc.write_text(f"{START}\n{END}\n", encoding="utf-8")
    proc = report(write(tmp_path / "r_amd.json", one_thread), write(tmp_path / "r_intel.json", two_threads),
                  "--docs", doc)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(doc.read_text().split())
    assert "`r_amd.json` (CPU AMD EPYC (avx2)" in text and "`r_intel.json` (CPU Intel Xeon (avx2, avx512f)" in text
    rows = {line.split(" | ")[0]: line.split(" | ") for line in doc.read_text().splitlines() if line.startswith("| ")}
    assert rows["| drophead"][4].endswith("(jobs 1, 2 threads)") and rows["| standard"][4].endswith("(jobs 3)")


def test_a_rows_minutes_from_different_machines_are_given_per_seed_not_averaged(tmp_path):
    """Seeds trained on CPUs of different speeds: no mean ± sd of unlike minutes, each seed's in seed order; a row
    whose runs all trained on one machine at one setting keeps its mean ± sd."""
    amd = results(STANDARD[:1] + DROPHEAD, [DROPHEAD_ROW])
    amd["environment"] = {"device": "cpu", "cpu": "AMD EPYC", "threads": 1}
    intel = results(STANDARD[1:])
    intel["environment"] = {"device": "cpu", "cpu": "Intel Xeon", "threads": 1}
    doc = tmp_path / "reproduction.md"
    doc.write_text(f"{START}\n{END}\n", encoding="utf-8")
    proc = report(write(tmp_path / "r_amd.json", amd), write(tmp_path / "r_intel.json", intel), "--docs", doc)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split(" | ")[0]: line.split(" | ") for line in doc.read_text().splitlines() if line.startswith("| ")}
    assert rows["| standard"][4] == "10.0, 12.0, 14.0 (jobs 3)"
    assert rows["| drophead"][4] == "10.0 ± 0.0 (jobs 3)"


@pytest.mark.parametrize("segments, cell", [
    ([{"jobs": 2}, {"jobs": 1}], "(jobs 1/2, 2 threads)"),  # calls that did not record their threads
    ([{"jobs": 2, "threads": 1}, {"jobs": 1, "threads": 2}], "(jobs 1/2, 1/2 threads)"),
    ([{"jobs": 1, "threads": 2}, {"jobs": 1, "threads": 2}], "(jobs 1, 2 threads)"),
])
def test_a_run_resumed_by_calls_of_another_setting_gives_each(tmp_path, segments, cell):
    """A run trained partly beside another run and partly alone at two threads says both beside its minutes."""
    calls = results(STANDARD + [{**r, "segments": segments} for r in DROPHEAD], [DROPHEAD_ROW])
    calls["environment"] = {"device": "cpu", "cpu": "Intel Xeon", "threads": 2}
    calls["settings"]["jobs"] = 1
    doc = tmp_path / "reproduction.md"
    doc.write_text(f"{START}\n{END}\n", encoding="utf-8")
    proc = report(write(tmp_path / "r.json", calls), "--docs", doc)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split(" | ")[0]: line.split(" | ") for line in doc.read_text().splitlines() if line.startswith("| ")}
    assert rows["| drophead"][4].endswith(cell)


def heads(role: str, layer: int, importance: list[float]) -> dict[str, Any]:
    return {"name": f"{role}.{layer}", "role": role, "layer": layer, "heads": len(importance),
            "importance": importance, "entropy": [1.0] * len(importance)}


def pruning(scores: list[float]) -> dict[str, Any]:
    points = [{"fraction": f, "masked_heads": int(8 * f), "score": s} for f, s in zip((0.0, 0.5, 1.0), scores)]
    return {"modules": [heads("encoder_self", 0, [0.1, 0.2, 0.3, 0.4])], "pruning_curve": {"points": points},
            "score": {"metric": "bleu"}}


def lengths(scores: list[float]) -> dict[str, Any]:
    buckets = [{"label": "1-8", "low": 1, "high": 8}, {"label": ">8", "low": 9, "high": None}]
    return {"buckets": buckets, "models": [{"label": "avg_last5", "bleu": 30.0, "buckets": [
        {**b, "sentences": n, "bleu": s} for b, n, s in zip(buckets, (10, 20), scores)]}]}


def diversity(base: float) -> dict[str, Any]:
    layers = [{"layer": i, "att_pos": base + i / 10, "att_sub": base + 0.1, "ffn_sub": base - 0.1} for i in range(2)]
    return {"layers": layers, "mean": {}, "unit_weights": []}


def kappa_alpha() -> list[dict[str, Any]]:
    prefix, decoder = "encoder.layers.1.branched.weights", "decoder.layers.1.branched.weights"
    return [{"step": 100 * k, f"{prefix}.kappa.0": 0.5 + k / 100, f"{prefix}.kappa.1": 0.5 - k / 100,
             f"{prefix}.alpha.0": 0.4, f"{prefix}.alpha.1": 0.6, "encoder.layers.0.branched.weights.kappa.0": 1.0,
             f"{decoder}.kappa.1": 1.0 - k / 10, "decoder.layers.2.branched.weights.alpha.0": 0.0}
            for k in range(1, 9)]


def test_the_kappa_alpha_figure_takes_the_second_layer_of_each_side_from_the_lowest_seed_that_logged_them(tmp_path):
    from bench.reproduce_figures import kappa_alpha_data

    runs = table_runs(merge([load_results(write(tmp_path / "r.json", analysed_results()))]))
    data = kappa_alpha_data(runs)  # seed 1 logged none: seed 2's
    assert data["seed"] == 2 and list(data["sides"]) == ["encoder", "decoder"]
    steps = [100 * k for k in range(1, 9)]
    encoder, decoder = data["sides"]["encoder"], data["sides"]["decoder"]
    assert encoder["kappa"][1] == (steps, pytest.approx([0.5 - k / 100 for k in range(1, 9)]))
    assert encoder["alpha"] == {0: (steps, [0.4] * 8), 1: (steps, [0.6] * 8)}
    assert decoder == {"kappa": {1: (steps, pytest.approx([1.0 - k / 10 for k in range(1, 9)]))}, "alpha": {}}
    assert kappa_alpha_data({"weighted": [run("weighted", 1, 30.0)]}) is None


def analysed_results() -> dict[str, Any]:
    importance = {"importance": {"modules": [heads("encoder_self", 0, [float(i) for i in range(1, 13)]),
                                             heads("cross", 0, [1.0] * 12)], "pruning_curve": None}}
    runs = [run("standard", s, 30.0 + s, analyses={"pruning": pruning([30.0, 20.0 + s, 5.0]),
                                                   "lengths": lengths([35.0, 28.0 + s])}) for s in (1, 2)]
    runs += [run("drophead", s, 31.0, analyses={"pruning": pruning([31.0, 27.0, 8.0])}) for s in (1, 2)]
    runs += [run("muse", 1, 31.0, analyses={"lengths": lengths([36.0, 30.0]), "gates": {"error": "failed"}})]
    runs += [run(system, 1, 31.0, analyses={"diversity": diversity(0.4)}) for system in ("mute", "mute-bias-seq")]
    runs += [run("weighted", 2, 30.0, kappa_alpha=kappa_alpha()), run("weighted", 1, 30.0)]
    runs += [run("mat3-narrow", 1, 30.0, rho=0.2, grid=True, analyses=importance),
             run("mat3-narrow", 1, 29.0, rho=0.1, grid=True)]
    rows = [{"system": "mat3-narrow", "rho": 0.2, "rho_grid_valid_bleu": {"0.1": 29.5, "0.2": 30.5}}]
    return results(runs, rows)


def test_figure_data_against_hand_computed_numbers(tmp_path):
    runs = table_runs(merge([load_results(write(tmp_path / "r.json", analysed_results()))]))
    standard = pruning_curves_data(runs)[0]
    assert standard["label"] == "standard (2 seeds)"
    middle = standard["curve"][1]  # scores 21 and 22 at half the heads masked; changes -9 and -8
    assert (middle["score"], middle["change"]) == pytest.approx((21.5, -8.5))
    assert middle["score_sd"] == pytest.approx(statistics.stdev([21.0, 22.0]))
    importance = branch_importance_data(runs)["mat3-narrow"]  # 12 heads, 3 branches of 4
    assert importance["encoder_self"]["mean"] == pytest.approx([10.0, 26.0, 42.0])
    assert importance["cross"]["mean"] == pytest.approx([4.0, 4.0, 4.0])


def test_the_length_table_gives_each_buckets_bleu_and_its_delta_to_the_standard_model_of_the_same_seed(tmp_path):
    from bench.reproduce_report import length_table

    runs = table_runs(merge([load_results(write(tmp_path / "r.json", analysed_results()))]))
    table = length_table(runs)
    assert table is not None
    lines = table.splitlines()
    assert "| system | seeds | 1-8 (10) | >8 (20) |" in lines
    # standard: 35 in both seeds for 1-8, 29 and 30 for >8; muse (seed 1 only): 36 and 30, against seed 1's 35 and 29
    assert f"| standard | 2 | 35.00 ± 0.00 | 29.50 ± {statistics.stdev([29.0, 30.0]):.2f} |" in lines
    assert "| muse | 1 | 36.00 (+1.00) | 30.00 (+1.00) |" in lines
    assert length_table({"drophead": runs["drophead"]}) is None  # no lengths analysis: no table


def test_the_pruning_figure_colours_each_system_as_every_other_figure_does(tmp_path):
    from matplotlib.colors import to_rgba

    runs = table_runs(merge([load_results(write(tmp_path / "r.json", analysed_results()))]))
    fig = draw_pruning_curves(pruning_curves_data(runs))
    for ax in fig.axes[:2]:
        colours = {line.get_label(): to_rgba(line.get_color()) for line in ax.lines}
        assert colours == {"standard (2 seeds)": system_color("standard"), "drophead (2 seeds)": system_color("drophead")}


def test_the_cpu_recipes_mat_rows_get_branch_importance_from_their_preset():
    """The CPU recipe's MAT systems train from scratch (not MAT_SYSTEMS): N_a = 2 comes from mat-tiny."""
    pruning = {"modules": [heads("encoder_self", 0, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])]}
    runs = {system: [run(system, 1, 30.0, analyses={"pruning": pruning})] for system in ("mat", "mat-drophead",
                                                                                     "drophead")}
    data = branch_importance_data(runs, "cpu")
    assert set(data) == {"mat", "mat-drophead"}  # DropHead has one branch: nothing to sum per branch
    assert data["mat"]["encoder_self"]["mean"] == pytest.approx([10.0, 26.0])
    assert branch_importance_data(runs, "iwslt") is None  # the IWSLT recipe has no `mat` system of one preset


def test_every_figure_is_drawn_as_a_png_when_its_data_exists(tmp_path, capsys):
    results_file = write(tmp_path / "r.json", analysed_results())
    images = tmp_path / "images"
    images.mkdir()
    (images / "other.png").write_bytes(b"kept")
    assert main([str(results_file), "--images", str(images)]) == 0
    drawn = {"valid_curves.png", "pruning_curves.png", "bleu_by_length.png", "mute_diversity.png", "kappa_alpha.png",
             "mat_rho_grid.png", "mat_branch_importance.png"}
    assert {p.name for p in images.iterdir()} == drawn | {"other.png"}
    assert all((images / name).read_bytes().startswith(PNG) for name in drawn)
    assert (images / "other.png").read_bytes() == b"kept"
    assert "| mat3-narrow (ρ=0.2) |" in capsys.readouterr().out


def test_p_values_come_from_saved_translations_when_the_results_have_none(tmp_path):
    ref = tmp_path / "ref.de"
    sentences = [f"ein Mann mit Hut geht über die Straße Nummer {i}" for i in range(30)]
    ref.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    worse = [" ".join(s.split()[:4]) for s in sentences]
    results_file = write(tmp_path / "reproduce_x.json", results([run("standard", 1, 20.0), run("drophead", 1, 60.0)]))
    write(tmp_path / "reproduce_x_hyps.json", {"standard/seed1": {"avg": worse, "best": worse},
                                               "drophead/seed1": {"avg": sentences, "best": sentences}})
    out = tmp_path / "rows.json"
    env = {**os.environ, "MULTIBRANCH_MULTI30K": str(tmp_path / "absent")}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(results_file), "--ref", str(ref), "--json", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    p = {row["system"]: row for row in json.loads(out.read_text())["rows"]}["drophead"]["p_values"][0]
    assert p["from"] == "computed" and 0.0 < p["p_value"] < 0.05
    proc = subprocess.run([sys.executable, str(SCRIPT), str(results_file), "--json", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)  # no reference: no p
    assert proc.returncode == 0 and "reference" in proc.stderr
    assert json.loads(out.read_text())["rows"][1]["p_values"][0]["p_value"] is None


@pytest.mark.multi30k  # p-values from saved translations are scored against Multi30k's test references
def test_the_reproduction_page_shows_the_committed_results(multi30k):
    """docs/reproduction.md's table region is what bench/reproduce_report.py makes of bench/results (a
    placeholder while no call has finished a run): rebuild it after committing a GPU call's results."""
    proc = report("--docs", ROOT / "docs" / "reproduction.md", "--ref", multi30k / "test_2016_flickr.de", "--check")
    assert proc.returncode == 0, proc.stderr


def test_the_report_reads_a_real_head_analysis_as_the_harness_records_it(tiny_checkpoint, tiny_data, tmp_path):
    """`analyze heads` on a trained checkpoint, kept as bench/reproduce_analyses.py keeps it (`condense`): the
    pruning curve and the dominant-head table come out of that record, not out of a hand-made one."""
    from bench.reproduce_analyses import condense
    from bench.reproduce_report import dominant_table
    from multibranch.pruning.head_report import HeadAnalysisOptions, analyze_heads

    folder = analyze_heads(tiny_checkpoint, tiny_data, tmp_path / "heads",
                           HeadAnalysisOptions(bleu_split="test", bleu_max_sentences=8, step=0.5, beam=1))
    heads = json.loads((folder.path / "heads.json").read_text(encoding="utf-8"))
    standard = run("standard", 1, 30.0, analyses={"pruning": condense("pruning", heads)})
    runs = table_runs(merge([load_results(write(tmp_path / "r.json", results([standard])))]))
    (curve,) = pruning_curves_data(runs)
    assert [point["score"] for point in curve["curve"]] == [p["score"] for p in heads["pruning_curve"]["points"]]
    deltas = heads["dominant_heads"]["mean_dominant_delta"]
    table = dominant_table(runs)
    assert table is not None
    row = "| standard | 1 | " + " | ".join(f"{deltas[role]:+.2f}" for role in ("encoder_self", "decoder_self", "cross"))
    assert row + " |" in table


def test_the_report_reads_a_real_diversity_analysis_as_the_harness_records_it(tiny_data, tmp_path):
    """`analyze diversity` on a (random) MUTE model, kept as the harness keeps it: the figure's numbers are the
    report's per layer."""
    import dataclasses

    import torch

    from bench.reproduce_analyses import condense
    from bench.reproduce_figures import diversity_data
    from multibranch.analysis.diversity import analyze_diversity
    from multibranch.checkpoint.format import save_checkpoint
    from multibranch.experiment import ExperimentConfig, resolve_config
    from multibranch.models import build_model
    from multibranch.tasks.translation.dataset import PreparedData

    sizes = PreparedData.load(tiny_data).meta["vocab_size"]
    cfg = resolve_config("mute-bias-seq-tiny").model
    model = build_model(dataclasses.replace(cfg, src_vocab_size=sizes["src"], tgt_vocab_size=sizes["tgt"])).eval()
    ckpt = tmp_path / "mute.pt"
    save_checkpoint(ckpt, {"config": ExperimentConfig(model=model.config).to_dict(), "model": model.state_dict(),
                           "meta": {}})
    torch.manual_seed(0)
    folder = analyze_diversity(ckpt, tiny_data, tmp_path / "diversity")
    report = json.loads((folder.path / "diversity.json").read_text(encoding="utf-8"))
    mute = run("mute-bias-seq", 1, 30.0, analyses={"diversity": condense("diversity", report)})
    runs = table_runs(merge([load_results(write(tmp_path / "r.json", results([mute])))]))
    (model_data,) = diversity_data(runs)
    assert model_data["label"] == "mute-bias-seq (1 seed)"
    assert model_data["layers"] == [pytest.approx(row) for row in report["layers"]]


def fitted(system: str, seed: int, train_nll: list[tuple[int, float]], valid_nll: list[tuple[int, float]]) -> dict:
    record = run(system, seed, 30.0)
    record["curve"]["train"] = [{"step": step, "loss": nll + 1.0, "nll": nll} for step, nll in train_nll]
    record["curve"]["valid"] = [{"step": step, "bleu": 30.0, "nll": nll} for step, nll in valid_nll]
    return record


def test_the_fit_table_averages_the_last_500_updates_and_takes_the_last_validation():
    from bench.reproduce_report import fit_table

    # standard seed 1: training NLL over updates 1000-2000 logged every 250; the last 500 (1750, 2000) average 1.1
    standard = [fitted("standard", 1, [(1000, 3.0), (1250, 2.0), (1500, 1.5), (1750, 1.2), (2000, 1.0)],
                       [(2000, 1.9), (1000, 2.5)]),  # validations out of order: the last step's counts
                fitted("standard", 2, [(1750, 1.4), (2000, 1.2)], [(1000, 2.4), (2000, 2.1)])]
    weighted = [fitted("weighted", 1, [(1750, 1.5), (2000, 1.3)], [(2000, 2.2)]),
                fitted("weighted", 3, [(1750, 9.0), (2000, 9.0)], [(2000, 9.0)])]  # no standard seed 3: no Δ
    lines = fit_table({"standard": standard, "weighted": weighted, "muse": [run("muse", 1, 30.0)]}).splitlines()
    assert "| standard | 2 | 1.200 ± 0.141 | 2.000 ± 0.141 | – | – |" in lines  # (1.1, 1.3), (1.9, 2.1)
    assert "| weighted | 2 | 5.200 ± 5.374 | 5.600 ± 4.808 | +0.300 | +0.300 |" in lines  # seed 1: 1.4 - 1.1, 2.2 - 1.9
    assert not any(line.startswith("| muse ") for line in lines)  # its curve has no NLL: no row
    assert fit_table({"muse": [run("muse", 1, 30.0)]}) is None


def weighted_run(seed: int, modules: list[tuple[str, list[float], list[float]]]) -> dict:
    weights = [{"name": f"{side}.layers.{i}.branched.weights", "side": side, "layer": i, "kappa": kappa,
                "alpha": alpha} for i, (side, kappa, alpha) in enumerate(modules)]
    return run("weighted", seed, 30.0, analyses={"gates": {"branch_weights": weights}})


def test_the_branches_off_table_counts_branches_below_a_tenth_of_an_equal_share_per_side():
    from bench.reproduce_report import branches_off_table

    # M = 4: a branch is nearly off below 0.1 / 4 = 0.025, by its kappa or its alpha (counted once for both)
    seed1 = weighted_run(1, [("encoder", [0.25] * 4, [0.25] * 4),
                             ("decoder", [0.0, 0.3, 0.3, 0.4], [0.02, 0.3, 0.3, 0.38]),  # branch 0: both low: 1
                             ("decoder", [0.5, 0.024, 0.25, 0.226], [0.3, 0.3, 0.01, 0.39])])  # 1 by kappa, 2 by alpha
    seed2 = weighted_run(2, [("encoder", [0.7, 0.1, 0.1, 0.1], [0.025, 0.325, 0.325, 0.325]),  # 0.025 is not below
                             ("decoder", [0.25] * 4, [0.25] * 4), ("decoder", [0.25] * 4, [0.25] * 4)])
    lines = branches_off_table({"standard": [run("standard", 1, 30.0)], "weighted": [seed1, seed2]}).splitlines()
    assert "| weighted | 2 | 0.0 ± 0.0 of 4 (0, 0) | 1.5 ± 2.1 of 8 (3, 0) |" in lines
    assert not any(line.startswith("| standard ") for line in lines)  # no branch weights: no row
    assert branches_off_table({"standard": [run("standard", 1, 30.0)]}) is None


def replaced_run(seed: int, learned: float, uniform: float, random: list[float],
                 per_module: dict[str, float] | None = None) -> dict:
    replacement = {"learned": {"bleu": learned, "chrf": 50.0}, "uniform": {"bleu": uniform, "chrf": 50.0},
                   "random": [{"seed": i + 1, "bleu": b, "chrf": 50.0} for i, b in enumerate(random)],
                   "random_mean": {"bleu": sum(random) / len(random), "chrf": 50.0} if random else None}
    if per_module:
        replacement["uniform_per_module"] = [{"name": name, "bleu": b, "chrf": 50.0} for name, b in per_module.items()]
    return run("weighted", seed, learned, analyses={"replacement": replacement})


def test_the_replacement_table_gives_each_replacements_bleu_and_its_delta_to_the_same_seeds_learned_weights():
    from bench.reproduce_report import replacement_table

    # seed 1: uniform -2, random (30 + 26) / 2 = 28, -6; seed 2: uniform -1, no random draws
    weighted = [replaced_run(1, 34.0, 32.0, [30.0, 26.0]), replaced_run(2, 36.0, 35.0, [])]
    lines = replacement_table({"standard": [run("standard", 1, 30.0)], "weighted": weighted}).splitlines()
    assert "| weighted | 2 | 35.00 ± 1.41 | 33.50 ± 2.12 (-1.50 ± 0.71) | 28.00 (-6.00) |" in lines
    assert "| the paper (newstest2013) | – | 24.8 | 23.4 (-1.4) | 21.1 (-3.7) |" in lines
    assert not any(line.startswith("| standard ") for line in lines)
    assert replacement_table({"standard": [run("standard", 1, 30.0)]}) is None
    assert not any(line.startswith("| system | encoder") for line in lines)  # no run replaced one module alone


def test_the_replacement_table_gives_each_modules_delta_when_it_alone_takes_uniform_weights():
    from bench.reproduce_report import replacement_table

    encoder, decoder = "encoder.layers.0.branched.weights", "decoder.layers.1.branched.weights"
    weighted = [replaced_run(1, 34.0, 1.0, [1.0], {encoder: 33.0, decoder: 4.0}),  # -1, -30
                replaced_run(2, 36.0, 1.0, [1.0], {encoder: 34.0, decoder: 2.0})]  # -2, -34
    lines = replacement_table({"weighted": weighted}).splitlines()
    assert "| system | encoder 0 | decoder 1 |" in lines
    assert "| weighted | -1.50 ± 0.71 | -32.00 ± 2.83 |" in lines
