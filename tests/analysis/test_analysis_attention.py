"""`multibranch analyze attention`: maps are probabilities (rows sum to 1) equal to a hand computation
from the module's input and its Q/K weights; MAT branches average their heads; bad choices refused."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from multibranch.cli import main
from multibranch.experiment import ExperimentConfig, resolve_config
from multibranch.models import build_model
from multibranch.tasks.translation.dataset import PreparedData

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def checkpoint(data: Path, preset: str, path: Path) -> tuple[torch.nn.Module, Path]:
    from multibranch.checkpoint.format import save_checkpoint

    sizes = PreparedData.load(data).meta["vocab_size"]
    torch.manual_seed(0)
    cfg = dataclasses.replace(resolve_config(preset).model, src_vocab_size=sizes["src"], tgt_vocab_size=sizes["tgt"])
    model = build_model(cfg).eval()
    save_checkpoint(path, {"config": ExperimentConfig(model=cfg).to_dict(), "model": model.state_dict(), "meta": {}})
    return model, path


def shortest(data: Path) -> int:
    """Index of the shortest valid example (small maps draw fast)."""
    return int(PreparedData.load(data).split("valid").src_lengths.argmin())


@torch.no_grad()
def hand_probabilities(module: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_k)) per head from the module input h [1, S, d] -> [H, S, S]."""
    H, dk = module.total_heads, module.head_dim
    w, b = module.in_proj.weight, module.in_proj.bias
    q = (h[0] @ w[: H * dk].T + b[: H * dk]).view(-1, H, dk).transpose(0, 1)  # [H, S, d_k]
    k = (h[0] @ w[H * dk: 2 * H * dk].T + b[H * dk: 2 * H * dk]).view(-1, H, dk).transpose(0, 1)
    return torch.softmax(q @ k.transpose(1, 2) / math.sqrt(dk), dim=-1)


def test_encoder_map_equals_hand_computation(tiny_data, tmp_path):
    model, ckpt = checkpoint(tiny_data, "transformer-tiny", tmp_path / "m.pt")
    split = PreparedData.load(tiny_data).split("valid")
    i = shortest(tiny_data)
    module = model.encoder.layers[1].self_attn
    inputs = []
    handle = module.register_forward_pre_hook(lambda mod, args: inputs.append(args[0].detach()))
    with torch.no_grad():
        src = torch.tensor([[*split.src(i).tolist(), model.config.eos_id]])
        model.encoder(src)
    handle.remove()
    expected = hand_probabilities(module, inputs[0])  # [H, S, S]

    out = tmp_path / "r"
    assert main(["analyze", "attention", "--ckpt", str(ckpt), "--data", str(tiny_data), "--sentences", str(i),
                 "--type", "encoder_self", "--layers", "1", "--out", str(out)]) == 0
    report = json.loads((out / "attention.json").read_text())
    [sentence] = report["sentences"]
    [entry] = sentence["modules"]
    assert entry["name"] == "encoder.layers.1.self_attn"
    assert len(sentence["source_tokens"]) == src.shape[1] and sentence["source_tokens"][-1] == "</s>"
    assert [p["title"] for p in entry["panels"]] == [f"head {h}" for h in range(model.config.heads)]
    for h, panel in enumerate(entry["panels"]):
        probs = torch.tensor(panel["map"])
        assert probs.sum(-1) == pytest.approx(torch.ones(src.shape[1]), abs=1e-5)
        assert probs == pytest.approx(expected[h], abs=1e-5)
    png = (out / "attention_s0_encoder_self_1.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and "(attention_s0_encoder_self_1.png)" in (out / "index.md").read_text()


def test_mat_branch_is_the_mean_of_its_heads(tiny_data, tmp_path):
    model, ckpt = checkpoint(tiny_data, "mat-tiny", tmp_path / "m.pt")
    attn = model.decoder.layers[0].cross_attn
    m = attn.heads
    common = ["analyze", "attention", "--ckpt", str(ckpt), "--data", str(tiny_data), "--sentences", str(shortest(tiny_data)),
              "--type", "cross", "--layers", "0"]
    assert main([*common, "--out", str(tmp_path / "heads")]) == 0
    assert main([*common, "--branch", "1", "--out", str(tmp_path / "branch")]) == 0
    heads = json.loads((tmp_path / "heads" / "attention.json").read_text())["sentences"][0]["modules"][0]["panels"]
    branch = json.loads((tmp_path / "branch" / "attention.json").read_text())["sentences"][0]["modules"][0]["panels"]
    assert attn.branches > 1 and len(heads) == attn.branches * m and [p["title"] for p in branch] == ["branch 1"]
    mean = torch.tensor([p["map"] for p in heads[m: 2 * m]]).mean(0)
    assert torch.tensor(branch[0]["map"]) == pytest.approx(mean, abs=1e-6)


def test_bad_choices_are_refused(tiny_data, tmp_path, capsys):
    _, ckpt = checkpoint(tiny_data, "transformer-tiny", tmp_path / "m.pt")
    base = ["analyze", "attention", "--ckpt", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "r")]
    for extra in (["--sentences", "999"], ["--sentences", "0", "--heads", "9"], ["--sentences", "0", "--branch", "1"],
                  [], ["--sentences", "x"]):
        assert main([*base, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all(line.startswith("multibranch analyze: error:") for line in err)
    assert not (tmp_path / "r").exists()


def test_raw_text_uses_the_model_translation_as_target(tiny_data, tmp_path):
    model, ckpt = checkpoint(tiny_data, "transformer-tiny", tmp_path / "m.pt")
    data = PreparedData.load(tiny_data)
    text = data.split("valid").raw_src_lines()[shortest(tiny_data)]
    out = tmp_path / "r"
    assert main(["analyze", "attention", "--ckpt", str(ckpt), "--data", str(tiny_data), "--text", text,
                 "--type", "decoder_self", "--layers", "0", "--heads", "2", "--beam", "1", "--out", str(out)]) == 0
    [sentence] = json.loads((out / "attention.json").read_text())["sentences"]
    tokenizer = data.tokenizer()
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.tasks.translation.translator import Translator

    hypothesis = Translator(model, tokenizer, DecodeConfig(beam=1)).translate([text])[0]
    target = ["<s>", *(tokenizer.tgt.id_to_piece(i) for i in tokenizer.encode_tgt([hypothesis])[0])]
    assert sentence["sentence"] == text and sentence["target_tokens"] == target
    [panel] = sentence["modules"][0]["panels"]
    probs = torch.tensor(panel["map"])  # causal: row q puts all its mass on keys 0..q
    assert probs.shape == (len(target), len(target)) and probs.sum(-1) == pytest.approx(torch.ones(len(target)))
    assert torch.triu(probs, diagonal=1).abs().max() == 0
