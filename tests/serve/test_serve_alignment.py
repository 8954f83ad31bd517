"""POST /translate with "alignment": true: the same translations plus each one's attention-based
Pharaoh pairs, equal to the Translator's (last decoder layer); absent unless asked."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from multibranch.serve.app import create_app  # noqa: E402
from multibranch.serve.engine import TorchEngine  # noqa: E402
from multibranch.serve.limits import ServeLimits  # noqa: E402
from multibranch.tasks.translation.translator import Translator  # noqa: E402
from tests.helpers.serve import BlockingEngine, run, serving  # noqa: E402
from tests.helpers.translation import corpus_lines  # noqa: E402

LINES = corpus_lines(4, seed=3) + [""]


def test_alignment_flag_adds_the_translators_pairs(tokenizer, experiment):
    config, model = experiment
    engine = TorchEngine(model, tokenizer, config.decode, kind="transformer")
    reference = Translator(model, tokenizer, config.decode, alignment_layer=model.config.decoder_layers - 1)
    app = create_app(engine, ServeLimits(max_wait_ms=5))

    async def go():
        async with serving(app) as client:
            plain = await client.post("/translate", json={"texts": LINES})
            aligned = await client.post("/translate", json={"texts": LINES, "alignment": True})
            nbest = await client.post("/translate", json={"texts": LINES, "alignment": True, "nbest": 2})
        return plain, aligned, nbest

    plain, aligned, nbest = run(go())
    assert "alignments" not in plain.json()
    expected = reference.translate_full(LINES, 1)
    assert aligned.json()["translations"] == plain.json()["translations"] == [e[0].text for e in expected]
    assert aligned.json()["alignments"] == [e[0].alignment for e in expected]
    assert aligned.json()["alignments"][-1] == ""
    assert any(a for a in aligned.json()["alignments"])
    expected2 = reference.translate_full(LINES, 2)
    assert nbest.json()["alignments"] == [[t.alignment for t in e] for e in expected2]


def test_alignment_with_an_engine_without_attention_is_422():
    app = create_app(BlockingEngine(block=False), ServeLimits(max_wait_ms=5))

    async def go():
        async with serving(app) as client:
            return await client.post("/translate", json={"texts": ["a b"], "alignment": True})

    reply = run(go())
    assert reply.status_code == 422 and "alignment" in reply.json()["detail"]
