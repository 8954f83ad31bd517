"""The general options the BERT/RoBERTa import needs: embedding LayerNorm, LayerNorm epsilon, the classifier
head's dropouts, learned positions vs data length; and runs saved before these fields existed still resume."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from multibranch.checkpoint.format import load_checkpoint, save_checkpoint
from multibranch.config import ConfigError, from_dict
from multibranch.experiment import ExperimentConfig
from multibranch.models import ModelConfig, build_model
from multibranch.models.classifier import Classifier, ClassifierConfig, pool
from multibranch.modules.dropout import dropout
from multibranch.tasks import train
from multibranch.train.trainer import RunOptions
from tests.helpers.configs import tiny_experiment, tiny_model_dict

KINDS = {  # one encoder/decoder layer config per layer kind
    "transformer": {},
    "weighted": {"encoder": {"kind": "weighted", "branch_norm": True}, "decoder": {"kind": "weighted"}},
    "mute": {"encoder": {"kind": "mute"}},
    "muse": {"encoder": {"kind": "muse"}, "decoder": {"kind": "muse"}},
}


@pytest.mark.parametrize("kind,norm", [(k, n) for k in KINDS for n in ("post", "pre") if (k, n) != ("mute", "post")])
def test_norm_eps_reaches_every_layer_norm(kind, norm):
    default = build_model(from_dict(ModelConfig, tiny_model_dict(norm=norm, **KINDS[kind])))
    custom = build_model(from_dict(ModelConfig, tiny_model_dict(norm=norm, norm_eps=1e-9, embedding_norm=True,
                                                                **KINDS[kind])))
    eps = [m.eps for m in default.modules() if isinstance(m, nn.LayerNorm)]
    assert eps and set(eps) == {1e-5}
    assert default.encoder.embed.norm is None and "encoder.embed.norm.weight" not in default.state_dict()
    norms = [m for m in custom.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == len(eps) + 2 and {m.eps for m in norms} == {1e-9}  # + encoder and decoder embedding norms


def test_embedding_norm_is_layer_norm_of_token_plus_position():
    cfg = from_dict(ModelConfig, tiny_model_dict(positions="learned", scale_embedding=False, embedding_norm=True,
                                                 norm_eps=1e-3, max_positions=16))
    embed = build_model(cfg).encoder.embed.eval()
    with torch.no_grad():
        embed.norm.weight.normal_()
        embed.norm.bias.normal_()
    ids = torch.tensor([[2, 7, 9, 3], [2, 5, 3, 0]])
    expected = F.layer_norm(embed.tokens.weight[ids] + embed.positions.weight[:4], (32,), embed.norm.weight,
                            embed.norm.bias, eps=1e-3)
    torch.testing.assert_close(embed(ids), expected)


def test_classifier_head_dropouts():
    """Train mode with only the head's dropout on: rate = classifier.dropout, applied before the dense layer
    too with input_dropout (as the reference computation draws the masks in the same order)."""
    model_cfg = from_dict(ModelConfig, tiny_model_dict(dropout=0.0, decoder_layers=0))
    src = torch.tensor([[2, 7, 9, 3], [2, 5, 3, 0]])
    for input_dropout in (False, True):
        net = Classifier(model_cfg, ClassifierConfig(num_labels=3, dropout=0.5, input_dropout=input_dropout)).train()
        torch.manual_seed(5)
        got = net(src)
        torch.manual_seed(5)
        enc = net.encoder(src)
        pooled = pool(enc.out, enc.padding_mask, "first")
        if input_dropout:
            pooled = dropout(pooled, 0.5, True)
        expected = net.out(dropout(torch.tanh(net.dense(pooled)), 0.5, True))
        torch.testing.assert_close(got, expected)
        assert not torch.equal(got, net.out(torch.tanh(net.dense(pooled))))  # the dropout did something
    with pytest.raises(ConfigError, match="classifier.dropout=1.0"):
        ClassifierConfig(num_labels=2, dropout=1.0).validate()


def test_run_saved_before_the_new_fields_resumes(tiny_data, tmp_path):
    """A last.pt whose config lacks fields added later (embedding_norm, norm_eps, classifier dropouts) resumes:
    the saved config is read with today's defaults instead of being refused as 'model config differs'."""
    run = tmp_path / "run"
    train(tiny_experiment(max_steps=2, valid_every=2), RunOptions(tiny_data, run))
    payload = load_checkpoint(run / "last.pt")
    for key in ("embedding_norm", "norm_eps"):
        del payload["config"]["model"][key]
    for key in ("dropout", "input_dropout"):
        del payload["config"]["classifier"][key]
    save_checkpoint(run / "last.pt", payload)
    state = train(tiny_experiment(max_steps=4, valid_every=2), RunOptions(tiny_data, run, resume=True))
    assert state.step == 4


def test_learned_positions_must_cover_the_data(tmp_path):
    """A classifier with learned positions refuses data with longer texts before training, in one line."""
    from multibranch.tasks.classification.prepare import ClassifyPrepareConfig, prepare_classification

    lines = [f"{'a' if i % 2 else 'b'}\t{' '.join(['word'] * (3 + i % 20))} x{i}" for i in range(60)]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    prepare_classification(ClassifyPrepareConfig(train=str(tmp_path / "train.tsv"), out=str(tmp_path / "data"),
                                                 holdout=6, vocab_size=40))
    cfg = ExperimentConfig.from_dict({"model": {**tiny_model_dict(decoder_layers=0), "positions": "learned",
                                                "max_positions": 8}, "train": {"max_steps": 1}})
    with pytest.raises(ConfigError, match=r"do not fit model.max_positions=8 \(learned positions\); prepare the "
                                          r"data with --max-len 6"):
        train(cfg, RunOptions(tmp_path / "data", tmp_path / "run"))
    assert not (tmp_path / "run").exists()
