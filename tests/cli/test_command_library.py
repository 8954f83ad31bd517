"""What the commands keep in the library (a command parses arguments and calls the library): the config a `train` run starts from, a preset's model for `info`, and `serve`'s server parts."""

from __future__ import annotations

import pytest
import torch
import yaml

from multibranch.checkpoint.payload import FORMAT, VERSION
from multibranch.errors import ConfigError
from multibranch.experiment import resolve_config, train_config


def test_train_config_chooses_preset_saved_config_or_checkpoint_config(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert train_config("transformer-tiny", None, ["model.d_model=64"], run).model.d_model == 64
    with pytest.raises(ConfigError, match="choose a model with --preset NAME or --config FILE"):
        train_config(None, None, [], run)
    saved = resolve_config("mat-tiny", None, ["train.seed=5"])
    (run / "config.yaml").write_text(yaml.safe_dump(saved.to_dict()), encoding="utf-8")
    resumed = train_config(None, None, ["train.lr.lr=0.0005"], run, resume=True)
    assert resumed.train.seed == 5 and resumed.train.lr.lr == 0.0005
    assert resumed.model.encoder.attention_branches == saved.model.encoder.attention_branches == 2
    ckpt = tmp_path / "c.pt"
    config = resolve_config("trec6-tiny", None, ["train.seed=9"]).to_dict()
    torch.save({"format": FORMAT, "version": VERSION, "config": config, "model": {}}, ckpt)
    started = train_config(None, None, [], tmp_path / "new", init_from=ckpt)
    assert started.task == "classification" and started.train.seed == 9
    with pytest.raises(ConfigError, match=r"--resume: no .*new/config.yaml to continue from \(no run there to "
                                          r"resume\); start a run with --preset"):  # --init-from is not a config
        train_config(None, None, [], tmp_path / "new", resume=True, init_from=ckpt)


def test_model_for_counting_fills_what_a_preset_lacks():
    from multibranch.models.counting import parameter_table
    from multibranch.tasks import model_for_counting

    model, counting = model_for_counting(resolve_config("trec6-tiny", None, []), 1000)
    assert counting == "classification, vocabulary 1000, 2 labels"
    rows = dict(parameter_table(model))
    assert sum(rows.values()) == sum(p.numel() for p in model.parameters())
    assert "head / out" in rows
    with pytest.raises(ConfigError, match="at least 2 labels"):
        model_for_counting(resolve_config("trec6-tiny", None, []), 1000, num_labels=1)


def test_serve_library_checks_the_address_before_loading():
    pytest.importorskip("fastapi")
    import socket

    from multibranch.errors import UserError
    from multibranch.serve.server import check_address

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=f"--port {port} on 127.0.0.1: cannot listen there"):
            check_address("127.0.0.1", port)
    check_address("127.0.0.1", 0)  # any free port: nothing to check
