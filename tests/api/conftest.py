"""Fixtures of the Python API's tests: one tiny run trained through `multibranch.fit` for the session (the
docs' examples use it too), and lines of the tiny data's test set."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.configs import tiny_experiment


@pytest.fixture(scope="session")
def api_run(tiny_data, tmp_path_factory):
    """The result of `multibranch.fit` of the tiny experiment for 8 updates (validated at 4 and 8)."""
    import multibranch

    out = tmp_path_factory.mktemp("api_run") / "run"
    return multibranch.fit(tiny_experiment(), data=tiny_data, out=out, device="cpu", max_steps=8, valid_every=4)


@pytest.fixture(scope="session")
def api_model(api_run):
    import multibranch

    return multibranch.load(api_run.last_checkpoint, max_len_a=0.0, max_len_b=8)  # short outputs: a fast test


@pytest.fixture(scope="session")
def test_lines(tiny_data) -> list[str]:
    """Three source lines of the synthetic test set."""
    raw = Path(tiny_data).parent / "raw" / "test.src"
    return raw.read_text(encoding="utf-8").splitlines()[:3]


@pytest.fixture(scope="session")
def api_classifier(tmp_path_factory) -> Path:
    """best.pt of a tiny keyword classifier (labels colour / number / place)."""
    from tests.helpers.classification import train_classifier

    return train_classifier(tmp_path_factory.mktemp("api_classifier"))
