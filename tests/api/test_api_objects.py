"""What researchers reach for beside translate(): the torch module and the tokenizer of a loaded model, per-token
scores, an untrained model of a preset, and callbacks of `fit`."""

from __future__ import annotations

import math

import pytest
import torch

import multibranch
from tests.helpers.configs import tiny_experiment


def test_module_and_tokenizer_are_the_ones_that_translate(api_model, test_lines):
    from multibranch.inference.beam import beam_search

    module, tokenizer = api_model.module, api_model.tokenizer
    assert isinstance(module, torch.nn.Module) and not module.training
    ids = tokenizer.encode_src(test_lines[:1])[0]
    cfg = module.config
    src = torch.tensor([ids + [cfg.eos_id]])  # [1, S]
    decode = api_model.decode
    best = beam_search(module, src, decode)[0][0]
    tokens = [t for t in best.tokens if t not in (cfg.eos_id, cfg.bos_id, cfg.pad_id)]
    assert tokenizer.decode_tgt([tokens])[0] == api_model.translate(test_lines[0])


def test_positional_scores_add_up_to_the_log_probability(api_model, test_lines):
    translations = api_model.translate(test_lines)
    scores = api_model.score(test_lines, translations)
    for result in scores:
        assert len(result.positional_scores) == result.tokens  # one per token, EOS last
        assert all(p <= 0.0 for p in result.positional_scores)
        assert math.fsum(result.positional_scores) == pytest.approx(result.log_prob, abs=1e-5)
    # the first token's score is the log-softmax of the first decoder step (pad and bos never produced: masked),
    # computed here by hand
    module, tokenizer, cfg = api_model.module, api_model.tokenizer, api_model.module.config
    src = torch.tensor([tokenizer.encode_src(test_lines[:1])[0] + [cfg.eos_id]])  # [1, S]
    target = tokenizer.encode_tgt(translations[:1])[0] + [cfg.eos_id]
    with torch.no_grad():
        logits = module(src, torch.tensor([[cfg.bos_id]]))  # [1, 1, V]
    first = logits[0, 0].float().clone()  # [V]
    first[[cfg.pad_id, cfg.bos_id]] = float("-inf")
    expected = torch.log_softmax(first, -1)[target[0]].item()
    assert scores[0].positional_scores[0] == pytest.approx(expected, abs=1e-4)


def test_build_gives_an_untrained_model_drawn_from_the_configs_seed():
    from multibranch.experiment import resolve_config
    from multibranch.tasks import build_task_model

    before = torch.random.get_rng_state()
    model = multibranch.build("mat-tiny", src_vocab_size=50, tgt_vocab_size=50)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's random state is untouched
    cfg = resolve_config("mat-tiny", overrides=["model.src_vocab_size=50", "model.tgt_vocab_size=50"])
    torch.manual_seed(cfg.train.seed)
    reference = build_task_model(cfg)
    assert model.state_dict().keys() == reference.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    assert model.config.encoder.attention_branches == cfg.model.encoder.attention_branches == 2
    wider = multibranch.build(cfg, **{"model.encoder.attention_branches": 3})
    assert wider.config.encoder.attention_branches == 3
    with pytest.raises(multibranch.ConfigError, match="src_vocab_size and tgt_vocab_size not set"):
        multibranch.build("transformer-tiny")
    with pytest.raises(multibranch.ConfigError, match="unknown key"):
        multibranch.build("transformer-tiny", src_vocab_size=5, tgt_vocab_size=5, no_such_field=1)


def test_fit_calls_back_on_validation_and_checkpoint_and_a_callback_can_stop(tiny_data, tmp_path):
    validations, checkpoints = [], []

    def on_checkpoint(event):  # noqa: ANN001, ANN202
        checkpoints.append(event)
        assert event.last.is_file() and (event.best is None or event.best.is_file())
        return event.step >= 4  # stop after the second save

    result = multibranch.fit(tiny_experiment(), data=tiny_data, out=tmp_path / "run", device="cpu", max_steps=12,
                             valid_every=2, on_validation=validations.append, on_checkpoint=on_checkpoint)
    assert [v.step for v in validations] == [2, 4] and [c.step for c in checkpoints] == [2, 4]
    assert result.step == 4  # stopped by the callback, not by max_steps
    assert all("loss" in v.metrics and isinstance(v.improved, bool) for v in validations)
    assert validations[0].improved and (checkpoints[0].best is not None)
    assert result.valid["loss"] == validations[-1].metrics["loss"]
