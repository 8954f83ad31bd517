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
