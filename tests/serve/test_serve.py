"""`multibranch serve`: the API against Translator, micro-batching across requests, the bounded queue,
limits, timeouts, /health /info /metrics, clean shutdown and one real uvicorn server on loopback.

In-process tests drive the ASGI app with httpx (lifespan run by hand, so the worker starts and
stops as under uvicorn); stub engines blocked on an Event make queueing deterministic (no timing).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from multibranch.config import from_dict  # noqa: E402
from multibranch.models import ModelConfig, build_model  # noqa: E402
from multibranch.serve.app import create_app  # noqa: E402
from multibranch.serve.engine import TorchEngine  # noqa: E402
from multibranch.serve.limits import ServeLimits  # noqa: E402
from multibranch.tasks.translation.translator import Abandoned, Translator  # noqa: E402
from tests.helpers.serve import BlockingEngine, run, serving, wait_until  # noqa: E402
from tests.helpers.translation import corpus_lines  # noqa: E402

LINES = corpus_lines(10, seed=11)


def sample(app: Any, name: str, **labels: str) -> float:
    return app.state.metrics.registry.get_sample_value(name, labels or None) or 0.0


@pytest.fixture
def engine(tokenizer, experiment) -> TorchEngine:
    config, model = experiment
    return TorchEngine(model, tokenizer, config.decode, kind="transformer")


# ---- translations through the API ----------------------------------------------------------------


def test_concurrent_requests_get_their_own_translations_equal_to_translator(engine, tokenizer, experiment):
    config, model = experiment
    reference = Translator(model, tokenizer, config.decode)
    requests = [LINES[i:i + 3] for i in range(0, len(LINES), 2)] + [["", LINES[0], " "]]
    app = create_app(engine, ServeLimits(max_wait_ms=20))

    async def go():
        async with serving(app) as client:
            replies = await asyncio.gather(*(client.post("/translate", json={"texts": t}) for t in requests))
            nbest = await client.post("/translate", json={"texts": LINES[:4], "nbest": 2})
            beam1 = await client.post("/translate", json={"texts": LINES[:4], "beam": 1})
        return replies, nbest, beam1

    replies, nbest, beam1 = run(go())
    assert all(r.status_code == 200 for r in replies)
    for texts, reply in zip(requests, replies):
        assert reply.json()["translations"] == [reference.translate([t])[0] for t in texts]
    assert replies[-1].json()["translations"][0] == replies[-1].json()["translations"][2] == ""
    assert len({tuple(r.json()["translations"]) for r in replies}) > 1
    expected = reference.translate_nbest(LINES[:4], 2)
    got = nbest.json()["translations"]
    assert [[h["text"] for h in e] for e in got] == [[t for t, _ in e] for e in expected]
    flat = [h["score"] for e in got for h in e]
    assert flat == pytest.approx([s for e in expected for _, s in e], abs=1e-5)
    import dataclasses

    greedy = Translator(model, tokenizer, dataclasses.replace(config.decode, beam=1))
    assert beam1.json()["translations"] == greedy.translate(LINES[:4])


def test_concurrent_requests_are_merged_into_fewer_engine_calls():
    stub = BlockingEngine()
    app = create_app(stub, ServeLimits(max_wait_ms=0))
    n = 6

    async def go():
        async with serving(app) as client:
            first = asyncio.create_task(client.post("/translate", json={"texts": ["a b"]}))
            await wait_until(stub.started.is_set)  # the worker is busy with request 0
            rest = [asyncio.create_task(client.post("/translate", json={"texts": [f"x{i}", f"y{i}"]}))
                    for i in range(n)]
            await wait_until(lambda: app.state.batcher.depth == n)
            stub.release.set()
            return await first, await asyncio.gather(*rest)

    first, rest = run(go())
    assert first.json() == {"translations": ["A B#0"]}
    assert [r.json()["translations"] for r in rest] == [[f"X{i}#0", f"Y{i}#0"] for i in range(n)]
    assert stub.calls == [["a b"], [t for i in range(n) for t in (f"x{i}", f"y{i}")]]
    assert sample(app, "multibranch_batch_requests_count") == 2
    assert sample(app, "multibranch_batch_requests_sum") == n + 1
    assert sample(app, "multibranch_batch_sentences_sum") == 2 * n + 1


def test_different_decode_settings_are_batched_separately():
    stub = BlockingEngine()
    app = create_app(stub, ServeLimits(max_wait_ms=0))

    async def go():
        async with serving(app) as client:
            first = asyncio.create_task(client.post("/translate", json={"texts": ["a"]}))
            await wait_until(stub.started.is_set)
            bodies = [{"texts": ["p"]}, {"texts": ["q"], "nbest": 2}, {"texts": ["r"]}, {"texts": ["s"], "beam": 2}]
            tasks = [asyncio.create_task(client.post("/translate", json=b)) for b in bodies]
            await wait_until(lambda: app.state.batcher.depth == len(bodies))
            stub.release.set()
            return [r.json()["translations"] for r in [await first, *await asyncio.gather(*tasks)]]

    out = run(go())
    assert out == [["A#0"], ["P#0"], [[{"text": "Q#0", "score": 0.0}, {"text": "Q#1", "score": -1.0}]], ["R#0"],
                   ["S#0"]]
    assert sorted(map(sorted, stub.calls)) == [["a"], ["p", "r"], ["q"], ["s"]]


# ---- queue, timeouts, shutdown --------------------------------------------------------------------


def test_full_queue_answers_503_with_retry_after():
    stub = BlockingEngine()
    app = create_app(stub, ServeLimits(max_queue=2, max_wait_ms=0))

    async def go():
        async with serving(app) as client:
            busy = asyncio.create_task(client.post("/translate", json={"texts": ["a"]}))
            await wait_until(stub.started.is_set)
            queued = [asyncio.create_task(client.post("/translate", json={"texts": [w]})) for w in ("b", "c")]
            await wait_until(lambda: app.state.batcher.depth == 2)
            refused = await client.post("/translate", json={"texts": ["d"]})
            stub.release.set()
            return refused, [await busy, *await asyncio.gather(*queued)]

    refused, accepted = run(go())
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "queue is full" in refused.json()["detail"]
    assert [r.json()["translations"] for r in accepted] == [["A#0"], ["B#0"], ["C#0"]]
    assert sample(app, "multibranch_rejected_total", reason="queue_full") == 1
    assert all("d" not in call for call in stub.calls)


def test_timeout_answers_504_and_the_abandoned_request_never_reaches_the_engine():
    stub = BlockingEngine()
    app = create_app(stub, ServeLimits(timeout_s=0.3, max_wait_ms=0))

    async def go():
        async with serving(app) as client:
            busy = asyncio.create_task(client.post("/translate", json={"texts": ["a"]}))
            await wait_until(stub.started.is_set)
            late = await client.post("/translate", json={"texts": ["never"]})  # queued behind the busy worker
            depth = app.state.batcher.depth
            stub.release.set()
            after = await client.post("/translate", json={"texts": ["b"]})
            return await busy, late, depth, after

    busy, late, depth, after = run(go())
    assert late.status_code == 504 and "0.3" in late.json()["detail"]
    assert depth == 0  # the abandoned request left the queue
    assert busy.status_code == 504  # it also waited longer than the timeout; its result is dropped
    assert after.json() == {"translations": ["B#0"]}
    assert ["never"] not in stub.calls and stub.calls == [["a"], ["b"]]


class AbandonableEngine(BlockingEngine):
    """A BlockingEngine whose call also ends, raising Abandoned, when the batcher abandons it."""

    def __init__(self) -> None:
        super().__init__()
        self.abandoned = threading.Event()

    def abandon(self) -> None:
        self.abandoned.set()

    def translate(self, texts: list[str], beam: int, nbest: int) -> list[list[tuple[str, float]]]:
        self.calls.append(list(texts))
        self.started.set()
        while not self.release.wait(0.01):
            if self.abandoned.is_set():
                self.abandoned.clear()
                raise Abandoned("nobody waits")
        return [[(f"{t.upper()}#{k}", -float(k)) for k in range(nbest)] for t in texts]


def test_an_engine_call_whose_callers_all_timed_out_is_abandoned_and_the_next_request_served():
    stub = AbandonableEngine()
    app = create_app(stub, ServeLimits(timeout_s=0.3, max_wait_ms=0))

    async def go():
        async with serving(app) as client:
            busy = await client.post("/translate", json={"texts": ["a"]})  # never released: only abandoned
            stub.release.set()
            after = await client.post("/translate", json={"texts": ["b"]})
            return busy, after

    busy, after = run(go())
    assert busy.status_code == 504 and after.json() == {"translations": ["B#0"]}
    assert stub.calls == [["a"], ["b"]]


def test_a_torch_engine_stops_an_abandoned_call_before_its_next_batch_and_serves_the_next(engine):
    engine.abandon()  # as the batcher does once every caller has gone
    with pytest.raises(Abandoned, match=f"stopped after 0 of {len(LINES)} lines to decode"):
        engine._translator(engine.default_beam).translate_nbest(LINES, 1)
    got = engine.translate(LINES[:2], engine.default_beam, 1)  # a new call starts unabandoned
    assert got == engine._base.translate_nbest(LINES[:2], 1) and all(entries[0][0] for entries in got)


def test_shutdown_finishes_accepted_requests_and_refuses_new_ones():
    stub = BlockingEngine()
    app = create_app(stub, ServeLimits(max_wait_ms=0))

    async def go():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                accepted = [asyncio.create_task(client.post("/translate", json={"texts": ["a"]}))]
                await wait_until(stub.started.is_set)
                accepted += [asyncio.create_task(client.post("/translate", json={"texts": [w]})) for w in "bc"]
                await wait_until(lambda: app.state.batcher.depth == 2)
                closing = asyncio.create_task(app.state.batcher.close())
                await asyncio.sleep(0)
                refused = await client.post("/translate", json={"texts": ["z"]})
                stub.release.set()
                await closing
                return refused, await asyncio.gather(*accepted)

    refused, accepted = run(go())
    assert refused.status_code == 503 and "shutting down" in refused.json()["detail"]
    assert [r.json()["translations"] for r in accepted] == [["A#0"], ["B#0"], ["C#0"]]


# ---- validation and limits ------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"texts": ["a"] * 5}, 413, "5 texts: at most 4"),
    ({"texts": ["a" * 11]}, 413, "texts[0] has 11 characters: at most 10"),
    ({"texts": ["a" * 10] * 3}, 413, "30 characters in all: at most 25"),
    ({"texts": ["a"], "beam": 9}, 422, "beam=9: at most 8"),
    ({"texts": ["a"], "beam": 2, "nbest": 3}, 422, "nbest=3 must be <= beam=2"),
    ({"texts": ["a"], "nbest": 5}, 422, "nbest=5 must be <= beam=4"),
    ({"texts": "a"}, 422, "list"),
    ({"text": ["a"]}, 422, "texts"),
    ({"texts": [1]}, 422, "string"),
    ({"texts": ["a"], "beam": 0}, 422, "greater than or equal to 1"),
])
def test_limits_and_validation(body, status, message):
    stub = BlockingEngine(block=False)
    app = create_app(stub, ServeLimits(max_items=4, max_chars=10, max_total_chars=25, max_beam=8))

    async def go():
        async with serving(app) as client:
            return await client.post("/translate", json=body)

    reply = run(go())
    assert reply.status_code == status
    assert message in str(reply.json()["detail"])
    assert stub.calls == []


def test_empty_request_and_empty_strings(engine):
    app = create_app(engine)

    async def go():
        async with serving(app) as client:
            return await client.post("/translate", json={"texts": []}), await client.post(
                "/translate", json={"texts": ["", "  "], "nbest": 2})

    empty, blanks = run(go())
    assert empty.json() == {"translations": []}
    assert blanks.json() == {"translations": [[{"text": "", "score": 0.0}]] * 2}


# ---- /health, /info, /metrics ---------------------------------------------------------------------


def test_health_info_and_metrics(engine, experiment):
    config, model = experiment
    app = create_app(engine, ServeLimits(max_items=7))

    async def go():
        async with serving(app) as client:
            await client.post("/translate", json={"texts": LINES[:2]})
            return [await client.get(p) for p in ("/health", "/info", "/metrics")]

    health, info, metrics = run(go())
    assert health.json() == {"status": "ok", "queue_depth": 0}
    body = info.json()
    assert body["kind"] == "transformer" and body["engine"] == "torch"
    assert body["parameters"] == sum(p.numel() for p in model.parameters())
    assert body["decode"]["beam"] == config.decode.beam and body["limits"]["max_items"] == 7
    assert body["branch_weights"] == {}
    text = metrics.text
    tokens = sum(len(ids) + 1 for ids in engine.tokenizer.encode_src(LINES[:2]))
    assert f"multibranch_source_tokens_total {float(tokens)}" in text
    assert 'multibranch_request_latency_seconds_count{status="200"} 1.0' in text
    for name in ("multibranch_requests_in_flight 0.0", "multibranch_queue_depth 0.0",
                 "multibranch_batch_sentences_sum 2.0", "multibranch_engine_seconds_total"):
        assert name in text


@pytest.mark.parametrize("kind", ["weighted", "mute"])
def test_info_reports_learned_branch_weights(kind, tokenizer):
    torch.manual_seed(0)
    encoder = {"kind": kind, **({"units": 3} if kind == "mute" else {})}
    decoder = {"kind": "transformer"} if kind == "mute" else encoder
    cfg = from_dict(ModelConfig, {"d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 1,
                                  "src_vocab_size": tokenizer.src_vocab_size, "tgt_vocab_size": tokenizer.src_vocab_size,
                                  "encoder": encoder, "decoder": decoder, **({"norm": "pre"} if kind == "mute" else {})})
    model = build_model(cfg).eval()
    with torch.no_grad():  # move the weights away from their uniform start, so reading them back means something
        for name, p in model.named_parameters():
            if name.endswith(("kappa", "alpha", "unit_weights")):
                p.copy_(torch.rand_like(p) + 0.1)
    from multibranch.experiment.decoding import DecodeConfig

    weights = TorchEngine(model, tokenizer, DecodeConfig(beam=2)).info()["branch_weights"]
    assert weights
    params = dict(model.named_parameters())
    for module, values in weights.items():
        if kind == "weighted":
            assert set(values) == {"kappa", "alpha"}
            assert values["kappa"] == pytest.approx(params[f"{module}.kappa"].tolist())
            assert values["alpha"] == pytest.approx(params[f"{module}.alpha"].tolist())
        else:
            assert values["unit_weights"] == pytest.approx(params[f"{module}.unit_weights"].tolist())
    expected = sum(name.endswith("kappa" if kind == "weighted" else "unit_weights") for name in params)
    assert len(weights) == expected
