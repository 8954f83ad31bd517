"""The paper presets' parameter counts against the papers' published counts (`paper_size` in each preset), and
the standard-Transformer-shaped ones against a closed-form count written here."""

from __future__ import annotations

import json

import pytest

from multibranch.cli import main
from multibranch.experiment import list_presets, load_preset_dict, resolve_config
from multibranch.experiment.paper_sizes import paper_size
from multibranch.tasks import model_for_counting

PAPER_PRESETS = ["transformer", "mat", "weighted", "mute", "mute-bias", "mute-bias-seq", "muse", "muse-simple",
                 "drophead"]


def _count(preset: str) -> int:
    published = paper_size(preset)
    model, _ = model_for_counting(resolve_config(preset), published.src_vocab, None, published.tgt_vocab)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _closed_form(vocab: int, d: int, ffn: int, layers: int, branches: int = 1) -> int:
    """Post-norm encoder-decoder with one embedding table shared by both sides and the output layer,
    sinusoidal positions, biases everywhere, and every attention the sum of `branches` multi-head attentions."""
    attention = branches * 4 * (d * d + d)  # Q, K, V, O with biases, per branch
    feed_forward = 2 * d * ffn + ffn + d
    encoder_layer = attention + feed_forward + 2 * 2 * d  # two layer norms
    decoder_layer = 2 * attention + feed_forward + 3 * 2 * d
    return vocab * d + layers * (encoder_layer + decoder_layer)


def test_every_paper_preset_records_its_papers_count():
    assert set(PAPER_PRESETS) <= set(list_presets())
    assert all(paper_size(name) is not None for name in PAPER_PRESETS)


@pytest.mark.parametrize("preset", PAPER_PRESETS)
def test_count_is_within_the_stated_tolerance_of_the_paper(preset):
    published = paper_size(preset)
    assert abs(published.relative_difference(_count(preset))) <= published.tolerance


@pytest.mark.parametrize("preset, d, ffn, branches", [("transformer", 512, 1024, 1), ("mat", 256, 2048, 3),
                                                      ("drophead", 1024, 4096, 1)])
def test_standard_shapes_equal_the_closed_form_count(preset, d, ffn, branches):
    assert _count(preset) == _closed_form(paper_size(preset).src_vocab, d, ffn, 6, branches)


def test_paper_size_is_not_inherited_and_not_part_of_the_config():
    assert paper_size("mat-tiny") is None and paper_size("no-such-preset") is None
    assert "paper_size" not in load_preset_dict("mute-bias-seq")  # its base `mute` has one of its own
    assert paper_size("mute-bias-seq").source != paper_size("mute").source


def test_info_counts_at_the_papers_vocabulary_and_prints_both(capsys):
    assert main(["info", "--preset", "muse", "--no-config"]) == 0
    out = capsys.readouterr().out
    assert "vocabulary 8848/6632 for counting" in out
    assert f"ours {_count('muse') / 1e6:.2f}M" in out.splitlines()[-1] and "paper 48.19M" in out
    assert main(["info", "--preset", "muse", "--no-config", "--vocab-size", "100"]) == 0
    assert "paper" not in capsys.readouterr().out  # another vocabulary: no comparison to print


def test_info_json_holds_what_the_table_prints(capsys, tiny_checkpoint):
    """`info --json`: the same parts and total as the text table (of a preset and of a checkpoint), one object."""
    assert main(["info", "--preset", "muse", "--no-config"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert main(["info", "--preset", "muse", "--no-config", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total"] == _count("muse") == sum(report["parameters"].values())
    assert [f"{part} {count:,d}" for part, count in report["parameters"].items()] == [
        " ".join(line.split()) for line in table[3:-2]]  # the rows between "# parameters" and the total
    assert report["source"] == {"preset": "muse", "counting": "vocabulary 8848/6632"} and "config" not in report
    assert report["paper"].startswith("paper 48.19M") and "ours 48.18M" in report["paper"]
    assert main(["info", "--ckpt", str(tiny_checkpoint), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"]["checkpoint"] == str(tiny_checkpoint) and report["source"]["step"] == 12
    assert report["config"]["model"]["d_model"] > 0 and report["total"] == sum(report["parameters"].values())


def test_info_list_json_holds_what_the_list_prints(capsys):
    """`info --list --json`: one JSON object with every preset the text list names, in its order, and the same
    descriptions."""
    assert main(["info", "--list"]) == 0
    listed = [line.split(None, 1) for line in capsys.readouterr().out.splitlines()]
    assert main(["info", "--list", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [[p["name"], p["description"]] for p in report["presets"]] == listed
    assert {"demo", "mat-tiny", "trec6-tiny"} <= {p["name"] for p in report["presets"]}
