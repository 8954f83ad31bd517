"""Export to safetensors + config.json + SentencePiece, and the round trip back to a model."""

from __future__ import annotations

import io
import json
import random
import shutil

import pytest
import sentencepiece as spm
import torch
from safetensors import safe_open

from multibranch.checkpoint.export import export, load_export
from multibranch.checkpoint.format import CheckpointError, load_state_strict, save_checkpoint
from multibranch.cli import main
from multibranch.data.tokenizer import Tokenizer
from multibranch.experiment import ExperimentConfig
from multibranch.models import build_model
from tests.helpers.configs import tiny_model_dict

WORDS = "a man woman dog runs sits on the red blue house street ein Mann Hund läuft auf der Straße".split()


def train_spm(seed: int) -> bytes:
    """A tiny SentencePiece model (pad 0, unk 1, bos 2, eos 3, as `prepare` makes them)."""
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(300)]
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buffer, vocab_size=60, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        character_coverage=1.0, model_type="unigram", hard_vocab_limit=False, minloglevel=2,
    )
    return buffer.getvalue()


def make_payload(joint: bool, share: str) -> dict:
    src = train_spm(0)
    tok = Tokenizer(src, src if joint else train_spm(1))
    model = tiny_model_dict(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                            share_embeddings=share, output_bias=True)
    cfg = ExperimentConfig.from_dict({"model": model})
    torch.manual_seed(0)
    net = build_model(cfg.model)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return {"config": cfg.to_dict(), "model": net.state_dict(), "tokenizer": tok.to_state(),
            "meta": {"step": 7, "valid": {"loss": 1.5, "bleu": 12.5}, "tensor": torch.tensor([1, 2])},
            "training": {"optimizer": {}}}


def logits(payload: dict) -> torch.Tensor:
    net = build_model(ExperimentConfig.from_dict(payload["config"]).model)
    load_state_strict(net, payload["model"], "test")
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
    tgt = torch.tensor([[2, 11, 12, 13], [2, 14, 15, 16]])
    with torch.no_grad():
        return net.eval()(src, tgt)


@pytest.mark.parametrize("joint,share", [(True, "all"), (False, "decoder"), (False, "none")])
def test_round_trip_identical_logits_ties_kept(tmp_path, joint, share):
    payload = make_payload(joint, share)
    out = tmp_path / "export"
    files = {p.name for p in export(payload, out)}
    spm_files = {"sentencepiece.model"} if joint else {"source.model", "target.model"}
    assert files == {"model.safetensors", "config.json"} | spm_files

    document = json.loads((out / "config.json").read_text())
    assert document["format"] == "multibranch-export" and document["format_version"] == 1
    assert document["config"] == ExperimentConfig.from_dict(payload["config"]).to_dict()
    assert document["meta"]["valid"]["bleu"] == 12.5

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    tied = {"all": ["decoder.embed.tokens.weight"], "decoder": [], "none": []}[share]
    assert stored == set(payload["model"]) - set(tied)  # a shared tensor is stored once

    back = load_export(out)
    assert list(back["model"]) == list(payload["model"]) and "training" not in back
    if share == "all":
        assert back["model"]["encoder.embed.tokens.weight"] is back["model"]["decoder.embed.tokens.weight"]
    tok = Tokenizer.from_state(back["tokenizer"])
    assert tok.joint == joint and tok.src_proto == Tokenizer.from_state(payload["tokenizer"]).src_proto
    assert torch.equal(logits(back), logits(payload))


def test_refuses_non_empty_dir_and_foreign_dirs(tmp_path):
    payload = make_payload(True, "all")
    out = tmp_path / "export"
    export(payload, out)
    with pytest.raises(FileExistsError, match="not empty"):
        export(payload, out)
    export(payload, out, force=True)
    with pytest.raises(CheckpointError, match="not an exported model"):
        load_export(tmp_path)
    (out / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing model.safetensors"):
        load_export(out)


def test_cli_export_and_exported_dir_as_input(tmp_path, capsys):
    ckpt, out = tmp_path / "x.pt", tmp_path / "release"
    payload = make_payload(False, "decoder")
    save_checkpoint(ckpt, payload)
    assert main(["convert", "export", "--ckpt", str(ckpt), "--out", str(out)]) == 0
    assert torch.equal(logits(load_export(out)), logits(payload))
    assert main(["convert", "export", "--ckpt", str(ckpt), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    # an exported directory is accepted wherever a checkpoint is read by the conversion commands
    avg = tmp_path / "avg.pt"
    assert main(["average", "--ckpts", str(out), str(ckpt), "--out", str(avg)]) == 0
    assert main(["convert", "fold", "--ckpt", str(out), "--out", str(tmp_path / "f.pt")]) == 0


def test_cli_export_never_writes_over_its_own_input(tmp_path, capsys):
    """An export directory is a checkpoint `convert export` reads: exporting it into itself (say as fp16) would
    replace the weights it reads, so it is refused as `convert ct2` refuses it, with or without --force."""
    ckpt, out = tmp_path / "x.pt", tmp_path / "release"
    save_checkpoint(ckpt, make_payload(False, "decoder"))
    assert main(["convert", "export", "--ckpt", str(ckpt), "--out", str(out)]) == 0
    shutil.copy(ckpt, out / "x.pt")  # a checkpoint file inside --out is its input too
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    for given in (out, out / "x.pt", tmp_path / "release" / ".." / "release"):
        assert main(["convert", "export", "--ckpt", str(given), "--out", str(out), "--force", "--dtype", "fp16"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{out}: holds the input {given}" in err, err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(["convert", "export", "--ckpt", str(out), "--out", str(tmp_path / "half"), "--dtype", "fp16"]) == 0


def test_exported_files_and_saved_checkpoints_get_ordinary_modes(tmp_path):
    import os
    import stat

    payload = make_payload(False, "decoder")
    old_mask = os.umask(0o027)
    try:
        written = export(payload, tmp_path / "release")
        save_checkpoint(tmp_path / "x.pt", payload)
    finally:
        os.umask(old_mask)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in [*written, tmp_path / "x.pt"]}
    assert modes == {name: "0o640" for name in ("model.safetensors", "source.model", "target.model", "config.json",
                                                 "x.pt")}
    assert sorted(p.name for p in (tmp_path / "release").iterdir()) == sorted(p.name for p in written)  # no temporaries


def test_what_is_not_a_checkpoint_is_named(tmp_path):
    from multibranch.checkpoint.format import load_checkpoint

    text = tmp_path / "hyp.txt"
    text.write_text("a translation\n")
    with pytest.raises(CheckpointError, match=r"hyp\.txt is not a multibranch checkpoint$"):
        load_checkpoint(text)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=rf"{run} is a run directory; did you mean {run / 'best.pt'}\?"):
        load_checkpoint(run)
    with pytest.raises(CheckpointError, match="is a directory, not a multibranch checkpoint"):
        load_checkpoint(tmp_path / "run" / "checkpoints")
    export(make_payload(True, "all"), tmp_path / "release")
    assert load_checkpoint(tmp_path / "release")["meta"]["step"] == 7  # an export directory still loads


@pytest.mark.parametrize("dtype,torch_dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_half_precision_export_stores_rounded_weights_once(tmp_path, dtype, torch_dtype):
    """`convert export --dtype`: float tensors stored in the half type (tied ones once), half the file of an fp32
    export; the loaded model equals one built from the payload's weights rounded to that type."""
    ckpt = tmp_path / "x.pt"
    payload = make_payload(True, "all")
    save_checkpoint(ckpt, payload)
    assert main(["convert", "export", "--ckpt", str(ckpt), "--out", str(tmp_path / "fp32")]) == 0
    assert main(["convert", "export", "--ckpt", str(ckpt), "--out", str(tmp_path / dtype), "--dtype", dtype]) == 0
    with safe_open(str(tmp_path / dtype / "model.safetensors"), "pt") as f:
        stored = {key: f.get_tensor(key) for key in f.keys()}
    assert "decoder.embed.tokens.weight" not in stored  # the tie survives the cast
    assert all(t.dtype == torch_dtype for t in stored.values() if t.is_floating_point())
    sizes = [(tmp_path / d / "model.safetensors").stat().st_size for d in (dtype, "fp32")]
    assert 0.45 < sizes[0] / sizes[1] < 0.55
    back = load_export(tmp_path / dtype)
    assert back["meta"]["export_dtype"] == dtype
    assert back["model"]["encoder.embed.tokens.weight"] is back["model"]["decoder.embed.tokens.weight"]
    rounded = {**payload, "model": {k: v.to(torch_dtype).float() if v.is_floating_point() else v
                                    for k, v in payload["model"].items()}}
    assert torch.equal(logits(back), logits(rounded))
    assert not torch.equal(logits(back), logits(payload))  # the weights really were rounded


def test_fp16_export_of_weights_beyond_its_range_is_refused_before_writing(tmp_path, capsys):
    ckpt, out = tmp_path / "x.pt", tmp_path / "release"
    payload = make_payload(False, "decoder")
    payload["model"]["output_bias"][0] = 1e6  # fp16 tops out at 65504
    save_checkpoint(ckpt, payload)
    assert main(["convert", "export", "--ckpt", str(ckpt), "--out", str(out), "--dtype", "fp16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output_bias" in err[0] and "beyond fp16's range" in err[0]
    assert not out.exists()
    assert main(["convert", "export", "--ckpt", str(ckpt), "--out", str(out), "--dtype", "bf16"]) == 0  # bf16 fits


def test_a_checkpoint_cut_short_is_one_short_line_naming_it(tmp_path):
    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.errors import CheckpointError

    whole = tmp_path / "whole.pt"
    torch.save({"format": "multibranch", "weights": torch.zeros(4096)}, whole)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole.read_bytes()[:600])  # the zip's central directory is gone
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(cut)
    message = str(refused.value)
    assert message.startswith(f"{cut} is corrupted or not a multibranch checkpoint (RuntimeError: ")
    assert "\n" not in message and len(message) < len(str(cut)) + 160  # torch's advice paragraph left out


def test_a_replacement_that_fails_midway_leaves_the_previous_export_whole(tmp_path, monkeypatch):
    """The export is written beside the directory and swapped in when complete: new weights never sit beside the
    previous config.json, and a switch from separate to joint vocabularies leaves no stale source/target model."""
    from multibranch.checkpoint import export as export_module

    out = tmp_path / "export"
    export(make_payload(False, "none"), out)
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    assert {"source.model", "target.model"} <= set(before)
    real = export_module._write_bytes

    def fail_at_the_config(path, data):
        if path.name == "config.json":
            raise OSError("disk gone")
        return real(path, data)

    monkeypatch.setattr(export_module, "_write_bytes", fail_at_the_config)
    with pytest.raises(OSError, match="disk gone"):
        export(make_payload(True, "all"), out, force=True)
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no temporary directory left
    monkeypatch.setattr(export_module, "_write_bytes", real)
    export(make_payload(True, "all"), out, force=True)
    assert sorted(path.name for path in out.iterdir()) == ["config.json", "model.safetensors", "sentencepiece.model"]
    assert load_export(out)["config"] == make_payload(True, "all")["config"]
