"""Config values as users type them: YAML 1.1 reads `5e-5` (no dot) as a string, the config reads it as a number."""

import pytest

from multibranch.config import ConfigError
from multibranch.experiment import resolve_config


@pytest.mark.parametrize("text, value", [("5e-5", 5e-5), ("1E-4", 1e-4), ("2.5e-3", 2.5e-3), ("1e+1", 10.0),
                                         (".5e1", 5.0), ("0.0003", 3e-4), ("3", 3.0)])
def test_a_float_field_reads_exponent_notation_without_a_dot(text, value):
    config = resolve_config("transformer-tiny", overrides=[f"train.lr.lr={text}"])
    assert config.train.lr.lr == value
    assert isinstance(config.train.lr.lr, float)


@pytest.mark.parametrize("text", ["e-5", "5e", "five", "5e-5x", "1e-5e"])
def test_a_float_field_still_refuses_what_is_not_a_number(text):
    with pytest.raises(ConfigError, match="train.lr.lr: expected a number"):
        resolve_config("transformer-tiny", overrides=[f"train.lr.lr={text}"])


def test_an_integer_field_does_not_take_exponent_text():
    with pytest.raises(ConfigError, match="train.max_steps: expected an integer"):
        resolve_config("transformer-tiny", overrides=["train.max_steps=1e3"])


# ---- numbers: finite, of their type, within their declared bounds -------------------------------------


@pytest.mark.parametrize("override, message", [
    ("train.lr.lr=.nan", "train.lr.lr: expected a finite number, got nan"),
    ("train.max_minutes=.inf", "train.max_minutes: expected a finite number, got inf"),
    ("model.dropout=-.inf", "model.dropout: expected a finite number, got -inf"),
    ("train.max_steps=-3", "max_steps=-3 must be >= 1"),
    ("train.label_smoothing=1.0", "label_smoothing=1.0 must be in [0, 1)"),
    ("train.lr.warmup=-1", "warmup=-1 must be >= 0"),
    ("decode.length_penalty=.nan", "decode.length_penalty: expected a finite number, got nan"),
    ("decode.max_len_b=-5", "max_len_b=-5 must be >= 0"),
])
def test_a_config_refuses_a_number_that_is_not_finite_or_out_of_range(override, message):
    with pytest.raises(ConfigError) as info:
        resolve_config("transformer-tiny", overrides=[override])
    assert message in str(info.value)


@pytest.mark.parametrize("changes, message", [
    ({"length_penalty": float("nan")}, "length_penalty: expected a finite number, got nan"),
    ({"length_penalty": float("inf")}, "length_penalty: expected a finite number, got inf"),
    ({"beam": 2.5}, "beam: expected an integer, got 2.5"),
    ({"beam": "3"}, "beam: expected an integer, got '3'"),
    ({"top_k": 1.5}, "top_k: expected an integer, got 1.5"),
    ({"max_len_b": -5}, "max_len_b=-5 must be >= 0"),
    ({"max_len_a": 0.0, "max_len_b": 0}, "leave no room for any output token"),
    ({"top_p": 0.0}, "top_p=0.0 must be in (0, 1]"),
    ({"seed": -1}, "seed=-1 must be in [0, "),
])
def test_a_replaced_decode_config_is_held_to_the_rules_from_dict_applies(changes, message):
    """`dataclasses.replace` skips from_dict: validate() applies the same type, finiteness and range rules."""
    import dataclasses

    from multibranch.experiment.decoding import DecodeConfig

    config = dataclasses.replace(DecodeConfig(), **changes)
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert message in str(info.value)


def test_check_fields_reads_a_whole_float_as_the_int_it_is_and_names_an_option():
    from multibranch.config import check_value
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.serve.limits import ServeLimits

    config = DecodeConfig(beam=4.0)  # type: ignore[arg-type]
    config.validate()
    assert config.beam == 4 and type(config.beam) is int
    with pytest.raises(ConfigError, match=r"^--lenpen: expected a finite number, got nan$"):
        check_value(DecodeConfig, "length_penalty", float("nan"), "--lenpen")
    with pytest.raises(ConfigError, match=r"^--beam 0: must be >= 1 \(1: greedy\)$"):
        check_value(DecodeConfig, "beam", 0, "--beam")
    with pytest.raises(ConfigError, match=r"^timeout_s=0.0 must be > 0$"):
        ServeLimits(timeout_s=0.0).validate()
    with pytest.raises(ConfigError, match="expected true/false"):
        check_value(DecodeConfig, "sampling", 1)


def _outside_and_edge(bounds):
    """(a value just outside `bounds`, the value on its edge or None when the edge is open) for its lower end,
    else its upper end."""
    if bounds.ge is not None:
        return bounds.ge - 1, bounds.ge
    if bounds.gt is not None:
        return bounds.gt, None
    if bounds.le is not None:
        return bounds.le + 1, bounds.le
    return bounds.lt, None


def _bounded_fields():
    import dataclasses

    from multibranch.config import BOUNDS
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.experiment.training import TrainConfig
    from multibranch.schedules import LRConfig, RateConfig
    from multibranch.serve.limits import ServeLimits

    return [(cls, f.name, f.metadata[BOUNDS]) for cls in (DecodeConfig, TrainConfig, LRConfig, RateConfig, ServeLimits)
            for f in dataclasses.fields(cls) if BOUNDS in f.metadata]


@pytest.mark.parametrize("cls, name, bounds", _bounded_fields(), ids=lambda x: getattr(x, "__name__", str(x)))
def test_every_declared_bound_refuses_the_value_past_it_and_takes_the_edge(cls, name, bounds):
    import typing

    from multibranch.config import check_value

    outside, edge = _outside_and_edge(bounds)
    as_type = float if float in typing.get_args(typing.get_type_hints(cls)[name]) + (
        typing.get_type_hints(cls)[name],) else int
    with pytest.raises(ConfigError, match=rf"^{name}=\S+ must be "):
        check_value(cls, name, as_type(outside))
    if edge is not None:
        assert check_value(cls, name, as_type(edge)) == edge


def test_every_train_shortcut_names_a_field_of_the_experiment_config():
    from multibranch.config import field_at
    from multibranch.experiment import TRAIN_SHORTCUTS, ExperimentConfig
    from multibranch.experiment.training import TrainConfig
    from multibranch.schedules import LRConfig

    assert field_at(ExperimentConfig, "train.lr.lr") == (LRConfig, "lr")
    assert field_at(ExperimentConfig, "train.max_steps") == (TrainConfig, "max_steps")
    defaults = ExperimentConfig()
    for key in TRAIN_SHORTCUTS.values():
        cls, name = field_at(ExperimentConfig, key)
        owner = defaults
        for part in key.split(".")[:-1]:
            owner = getattr(owner, part)
        assert type(owner) is cls and hasattr(owner, name), key
    with pytest.raises(ConfigError, match="train.lrr.lr: unknown field of TrainConfig"):
        field_at(ExperimentConfig, "train.lrr.lr")


def test_numpy_numbers_are_read_as_the_python_numbers_they_hold():
    import numpy as np

    from multibranch.config import check_value
    from multibranch.experiment.decoding import DecodeConfig

    beam = check_value(DecodeConfig, "beam", np.int64(4))
    assert beam == 4 and type(beam) is int
    ratio = check_value(DecodeConfig, "max_len_a", np.float32(0.5))
    assert ratio == 0.5 and type(ratio) is float
    with pytest.raises(ConfigError, match="expected an integer"):
        check_value(DecodeConfig, "beam", np.bool_(True))
    with pytest.raises(ConfigError, match="must be >= 1"):
        check_value(DecodeConfig, "beam", np.int32(0))
