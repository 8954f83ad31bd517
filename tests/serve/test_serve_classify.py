"""`multibranch serve` with a classifier: POST /classify against `multibranch classify`'s probabilities,
micro-batching of concurrent requests, blank texts, limits, the routes of the other task, /info, and
the command's one-line refusal of translation-only flags."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from multibranch.cli import main  # noqa: E402
from multibranch.loading.checkpoint import load_model  # noqa: E402
from multibranch.serve.app import create_app  # noqa: E402
from multibranch.serve.engine import ClassifierEngine, TorchEngine, load_torch_engine  # noqa: E402
from multibranch.serve.limits import ServeLimits  # noqa: E402
from tests.helpers.classification import TEXTS, train_classifier  # noqa: E402
from tests.helpers.serve import BlockingEngine, run, serving  # noqa: E402


@pytest.fixture(scope="module")
def classifier_ckpt(tmp_path_factory) -> Path:
    return train_classifier(tmp_path_factory.mktemp("serve_classify"))


@pytest.fixture(scope="module")
def engine(classifier_ckpt) -> ClassifierEngine:
    loaded = load_torch_engine(str(classifier_ckpt), "cpu")
    assert isinstance(loaded, ClassifierEngine)
    return loaded


def _expected_probabilities(classifier_ckpt: Path) -> torch.Tensor:
    """[n, C] for TEXTS computed here, not with the library's classify helpers: each text alone (no
    batching, no padding) as BOS + its SentencePiece ids + EOS through the model, softmax over labels."""
    loaded = load_model(classifier_ckpt, "cpu", task="classification")
    cfg, model = loaded.model.config, loaded.model.eval()
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            [ids] = loaded.tokenizer.encode_src([text])
            src = torch.tensor([[cfg.bos_id, *ids, cfg.eos_id]])
            rows.append(torch.softmax(model(src).float()[0], dim=-1))
    return torch.stack(rows)


def test_classify_answers_equal_the_classify_command_and_concurrent_requests_share_calls(engine, classifier_ckpt):
    expected = _expected_probabilities(classifier_ckpt)
    labels = ["colour", "number", "place"]
    assert engine.labels == labels
    calls: list[int] = []
    busy, release = threading.Event(), threading.Event()
    classify = engine.classify

    def held(texts: list[str]) -> list:  # the first call holds the worker until the others are queued
        calls.append(len(texts))
        if len(calls) == 1:
            busy.set()
            assert release.wait(30)
        return classify(texts)

    engine.classify = held  # type: ignore[method-assign]
    requests = [TEXTS[:2], TEXTS[2:], ["", TEXTS[0], "  "]]
    app = create_app(engine, ServeLimits(max_wait_ms=0))

    async def go():
        async with serving(app) as client:
            first = asyncio.create_task(client.post("/classify", json={"texts": TEXTS[3:4]}))
            while not busy.is_set():  # the worker is inside the first engine call
                await asyncio.sleep(0.005)
            concurrent = [asyncio.create_task(client.post("/classify", json={"texts": t, "probs": True}))
                          for t in requests]
            while app.state.batcher.depth < len(requests):  # all three wait in the queue
                await asyncio.sleep(0.005)
            release.set()
            replies = await asyncio.gather(*concurrent)
            await first
            plain = await client.post("/classify", json={"texts": TEXTS[:1]})
            empty = await client.post("/classify", json={"texts": []})
        return replies, plain, empty

    try:
        replies, plain, empty = run(go())
    finally:
        engine.classify = classify  # type: ignore[method-assign]
    assert [r.status_code for r in replies] == [200, 200, 200]
    got = [r.json() for r in replies]
    flat_labels = got[0]["labels"] + got[1]["labels"]
    flat_probs = got[0]["probabilities"] + got[1]["probabilities"]
    assert flat_labels == [labels[int(i)] for i in expected.argmax(-1)]
    for row, probs in zip(expected.tolist(), flat_probs):
        assert list(probs) == labels
        assert list(probs.values()) == pytest.approx(row, abs=1e-5)
    # blank texts have no label; the other text gets the same answer as alone
    assert got[2]["labels"] == [None, flat_labels[0], None]
    assert got[2]["probabilities"][0] is None and got[2]["probabilities"][2] is None
    assert got[2]["probabilities"][1] == pytest.approx(flat_probs[0], abs=1e-6)
    assert plain.json() == {"labels": [flat_labels[0]], "probabilities": None}
    assert empty.json() == {"labels": [], "probabilities": None}
    assert calls == [1, 2 + 3 + 3, 1]  # the three queued requests went to the engine in one call


class BlockingClassifier:
    """Labels every text "x" after `release`; records the batches."""

    task = "classification"
    labels = ["x", "y"]

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = threading.Event()

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(t.split()) + 2 for t in texts]

    def classify(self, texts: list[str]) -> list[list[float] | None]:
        self.calls.append(list(texts))
        assert self.release.wait(30)
        return [[0.75, 0.25] for _ in texts]

    def info(self) -> dict[str, Any]:
        return {"engine": "stub", "labels": self.labels}


def test_queued_classify_requests_are_merged_up_to_the_token_budget():
    stub = BlockingClassifier()
    app = create_app(stub, ServeLimits(batch_tokens=8, max_wait_ms=0))

    async def go():
        async with serving(app) as client:
            first = asyncio.create_task(client.post("/classify", json={"texts": ["a b"]}))
            while not stub.calls:  # the worker is busy with the first request
                await asyncio.sleep(0.005)
            rest = [asyncio.create_task(client.post("/classify", json={"texts": [t]}))
                    for t in ("c d", "e f", "g h i j k l")]
            while app.state.batcher.depth < 3:
                await asyncio.sleep(0.005)
            stub.release.set()
            return await asyncio.gather(first, *rest)

    replies = run(go())
    assert [r.json()["labels"] for r in replies] == [["x"]] * 4
    # 4 + 4 tokens fill the budget of 8; the 8-token text goes alone
    assert stub.calls == [["a b"], ["c d", "e f"], ["g h i j k l"]]


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"texts": ["a"] * 5}, 413, "5 texts: at most 4"),
    ({"texts": ["a" * 11]}, 413, "texts[0] has 11 characters: at most 10"),
    ({"texts": ["a" * 10] * 3}, 413, "30 characters in all: at most 25"),
    ({"texts": ["a"], "beam": 2}, 422, "beam"),
    ({"texts": "a"}, 422, "list"),
    ({"texts": ["a"], "probs": "maybe"}, 422, "bool"),
])
def test_classify_limits_and_validation(body, status, message):
    stub = BlockingClassifier()
    stub.release.set()
    app = create_app(stub, ServeLimits(max_items=4, max_chars=10, max_total_chars=25))

    async def go():
        async with serving(app) as client:
            return await client.post("/classify", json=body)

    reply = run(go())
    assert reply.status_code == status
    assert message in str(reply.json()["detail"])
    assert stub.calls == []


def test_each_server_answers_only_its_own_task(engine):
    translator = BlockingEngine(block=False)

    async def go():
        async with serving(create_app(engine)) as client:
            translate = await client.post("/translate", json={"texts": ["red"]})
            attention = await client.post("/attention", json={"text": "red", "kind": "encoder_self", "head": 0})
            info = await client.get("/info")
        async with serving(create_app(translator)) as client:
            classify = await client.post("/classify", json={"texts": ["red"]})
        return translate, attention, info, classify

    translate, attention, info, classify = run(go())
    assert (translate.status_code, translate.json()["detail"]) == (
        400, "this server holds a classification model: POST /classify")
    assert attention.status_code == 400 and "translation models" in attention.json()["detail"]
    assert (classify.status_code, classify.json()["detail"]) == (
        400, "this server holds a translation model: POST /translate")
    assert translator.calls == []
    described = info.json()
    assert described["task"] == "classification" and described["labels"] == ["colour", "number", "place"]
    assert described["parameters"] == sum(p.numel() for p in engine.model.parameters())
    assert described["attention"] is None


def test_translation_engine_loader_refuses_a_classifier_and_serve_refuses_beam(classifier_ckpt, capsys):
    from multibranch.checkpoint.format import CheckpointError

    with pytest.raises(CheckpointError, match="is a classification model, not a translation model"):
        TorchEngine.from_checkpoint(str(classifier_ckpt))
    assert main(["serve", "--ckpt", str(classifier_ckpt), "--beam", "3", "--port", "0", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a classifier: decode settings (beam) apply to translation models" in err[0]


class _PairStub:
    """A sentence-pair classifier that is never reached (the requests are refused before the queue)."""

    task = "classification"
    pairs = True
    labels = ["no", "yes"]

    def count_tokens(self, texts: list[Any]) -> list[int]:
        return [1 for _ in texts]

    def classify(self, texts: list[Any]) -> list[list[float] | None]:
        raise AssertionError("refused requests must not reach the engine")

    def info(self) -> dict[str, Any]:
        return {"engine": "stub"}


@pytest.mark.parametrize(("pairs", "status", "message"), [
    ([["a", "b"], ["c", "d"], ["e", "f" * 11]], 413, "pairs[2][1] has 11 characters: at most 10 per text"),
    ([["a", "b"], ["\ud800", "d"]], 400, "pairs[1][0] is not valid Unicode"),
])
def test_a_pair_over_the_limits_is_named_by_its_place_in_pairs(pairs, status, message):
    app = create_app(_PairStub(), ServeLimits(max_chars=10))

    async def go():
        async with serving(app) as client:
            return await client.post("/classify", content=json.dumps({"pairs": pairs}),  # a lone surrogate escaped
                                     headers={"content-type": "application/json"})

    reply = run(go())
    assert reply.status_code == status
    assert message in reply.json()["detail"] and "texts[" not in reply.json()["detail"]


def test_an_ensemble_of_classifiers_is_served_with_the_members_mean(classifier_ckpt, tmp_path):
    """Two --ckpt of one classifier: the mean of two equal members is that member's probabilities (computed here
    from the model directly); /info names the members."""
    from multibranch.cli import build_parser
    from multibranch.commands.serve import build_server

    args = build_parser().parse_args(["serve", "--ckpt", str(classifier_ckpt), str(classifier_ckpt), "--port", "0",
                                      "--device", "cpu"])
    engine = build_server(args).config.app.state.engine
    assert isinstance(engine, ClassifierEngine)
    assert engine.info()["config"]["ensemble"] == [str(classifier_ckpt)] * 2
    got = torch.tensor(engine.classify(list(TEXTS)))
    assert torch.allclose(got, _expected_probabilities(classifier_ckpt), atol=1e-5)
