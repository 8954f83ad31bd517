"""The Python API against arguments of the wrong type or out of range, and over-long texts: a UserError (a
ConfigError for a decoding value, by the decode config's rules, as the CLI's options) naming the argument,
never an AttributeError or TypeError from deep inside; a text over the model's token limit is translated from
its first tokens with one warning naming it, or refused with long_inputs="refuse"."""

from __future__ import annotations

import logging
import math

import pytest

import multibranch


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda m: m.translate([1, 2]), multibranch.UserError, r"translate: item 0 is an int \(1\); give a str"),
    (lambda m: m.translate(["a", None]), multibranch.UserError, "translate: item 1 is None; give a str"),
    (lambda m: m.translate(b"ein Haus"), multibranch.UserError, "not bytes"),
    (lambda m: m.score(["a"], [None]), multibranch.UserError, "score: item 0 is None"),
    (lambda m: m.translate("a", beam=2.5), multibranch.ConfigError, "beam: expected an integer, got 2.5"),
    (lambda m: m.translate("a", beam="3"), multibranch.ConfigError, "beam: expected an integer, got '3'"),
    (lambda m: m.translate("a", nbest=1.5), multibranch.ConfigError, "nbest: expected an integer, got 1.5"),
    (lambda m: m.translate("a", sampling=True, top_k=1.5), multibranch.ConfigError,
     "top_k: expected an integer, got 1.5"),
    (lambda m: m.translate("a", temperature=0.5), multibranch.ConfigError,
     r"temperature applies only to sampling=True; add sampling=True or drop it"),
    (lambda m: m.translate("a", top_k=5, seed=1), multibranch.ConfigError, "top_k, seed apply only to sampling"),
    (lambda m: m.translate("a", lenpen=math.nan), multibranch.ConfigError,
     "length_penalty: expected a finite number, got nan"),
    (lambda m: m.translate("a", lenpen=math.inf), multibranch.ConfigError,
     "length_penalty: expected a finite number, got inf"),
    (lambda m: m.translate("a", max_len_b=-5), multibranch.ConfigError, "max_len_b=-5 must be >= 0"),
    (lambda m: m.translate("a", sampling=True, temperature=1e400), multibranch.ConfigError,
     "temperature: expected a finite number, got inf"),
    (lambda m: m.translate("a", long_inputs="cut"), multibranch.ConfigError, "long_inputs: 'cut' is not one of"),
])
def test_a_wrong_argument_names_itself(api_model, call, error, message):
    with pytest.raises(error, match=message):
        call(api_model)


@pytest.mark.parametrize(("call", "message"), [
    (lambda path: multibranch.load(123), r"load: give a checkpoint path .*, not an int \(123\)"),
    (lambda path: multibranch.load(None), "load: give a checkpoint path .*, not None"),
    (lambda path: multibranch.load([path, 7]), r"load: path 1 is an int \(7\)"),
    (lambda path: multibranch.load(path, device=0), "load: device must be a str"),
    (lambda path: multibranch.load(path, temperature=0.5), "temperature applies only to sampling=True"),
    (lambda path: multibranch.load(path, lenpen=math.nan), "length_penalty: expected a finite number"),
])
def test_load_refuses_what_is_not_a_path_or_a_value_of_its_option(api_run, call, message):
    with pytest.raises(multibranch.UserError, match=message):
        call(api_run.last_checkpoint)


def test_the_sampling_options_are_taken_with_sampling(api_model, test_lines):
    """The refusals above are of the combination only: with sampling=True the same options decode."""
    samples = api_model.translate(test_lines[0], nbest=2, sampling=True, temperature=0.5, top_k=5, seed=1)
    assert len(samples) == 2 and all(isinstance(s, str) for s in samples)
    assert api_model.translate(test_lines[0], beam=2.0) == api_model.translate(test_lines[0], beam=2)


@pytest.mark.parametrize(("texts", "message"), [
    (5, r"classify: give a str, an \(a, b\) pair of str, or a list of them, not an int \(5\)"),
    ([None], "classify: item 0 is None; give a str or an"),
    (["a", ("b", 3)], r"classify: item 1 is a tuple"),
    (b"text", "not bytes"),
])
def test_classify_refuses_what_is_not_a_text(api_classifier, texts, message):
    model = multibranch.load(api_classifier)
    with pytest.raises(multibranch.UserError, match=message):
        model.classify(texts)
    with pytest.raises(multibranch.UserError, match=r"batch_size '3': give an int >= 1"):
        model.classify("a", batch_size="3")


def test_a_text_over_the_models_limit_is_truncated_to_it_with_one_warning_or_refused(api_model, test_lines, caplog):
    """The tiny model has sinusoidal positions and max_positions 1024: a 20,000-word text is cut to 1024 tokens
    (EOS included), where it used to be encoded whole (minutes of decoding); refused with long_inputs="refuse"."""
    limit = api_model.config.model.max_positions
    assert api_model.config.model.positions == "sinusoidal" and limit == 1024
    long_text = " ".join([test_lines[0]] * 4000)
    translator = api_model._translator
    assert len(translator.tokenizer.encode_src([long_text])[0]) > 10 * limit  # far over the limit
    _, sources, truncated = translator.encode([test_lines[1], long_text])
    assert [len(s) for s in sources][1] == limit and truncated == [1]
    with caplog.at_level(logging.WARNING):
        out = api_model.translate([test_lines[1], long_text])
    assert len(out) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("input line 2: more than the model's limit of 1024 tokens")
    with pytest.raises(multibranch.DataError, match=r"input line 2 has \d+ tokens .* limit of 1024 .*"
                                                    r"long_inputs='truncate'"):
        api_model.translate([test_lines[1], long_text], long_inputs="refuse")
