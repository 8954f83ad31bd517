"""POST /attention and the attention choices in /info: the maps equal the extractor of `analyze
attention` (capture_maps, called here on the model's own translation), rows sum to 1, shapes are
queries x keys, a MAT branch is the mean of its heads; bad choices and engines without maps are clear
4xx answers; map calls share the single engine thread and the queue bound with translations; the
page is served at / and packaged."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from multibranch.analysis.attention_maps import capture_maps  # noqa: E402
from multibranch.experiment.decoding import DecodeConfig  # noqa: E402
from multibranch.serve.app import PAGE_DIR, create_app  # noqa: E402
from multibranch.serve.engine import TorchEngine  # noqa: E402
from multibranch.serve.limits import ServeLimits  # noqa: E402
from multibranch.tasks.translation.translator import Translator  # noqa: E402
from tests.helpers.models import noisy_mat_model  # noqa: E402
from tests.helpers.serve import BlockingEngine, run, serving, wait_until  # noqa: E402
from tests.helpers.translation import corpus_lines  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEXT = min(corpus_lines(20, seed=31), key=len)  # short: no truncation, small maps


def post_all(app: Any, path: str, bodies: list[dict[str, Any]]) -> list[Any]:
    """POST each body to `path` (a path in a body's "path" key overrides it), in one server run."""
    async def go():
        async with serving(app) as client:
            return [await client.post(body.pop("path", path), json=body) for body in bodies]

    return run(go())


def get(app: Any, path: str) -> Any:
    async def go():
        async with serving(app) as client:
            return await client.get(path)

    return run(go())


@pytest.fixture(scope="module")
def mat(tokenizer) -> tuple[torch.nn.Module, DecodeConfig]:
    """A random MAT model: 2 branches of 2 heads in every attention."""
    return noisy_mat_model(tokenizer.src_vocab_size), DecodeConfig(beam=2, max_len_a=1.0, max_len_b=3)


def expected_maps(model: Any, tokenizer: Any, decode: DecodeConfig, text: str) -> tuple[str, dict[str, torch.Tensor]]:
    """The 1-best translation and every site's probabilities [H, queries, keys], computed here."""
    translation = Translator(model, tokenizer, decode).translate([text])[0]
    [src] = tokenizer.encode_src([text])
    [tgt] = tokenizer.encode_tgt([translation])
    return translation, capture_maps(model, src, tgt)


def test_info_lists_the_maps_the_model_offers(tokenizer, experiment, mat):
    config, model = experiment
    info = get(create_app(TorchEngine(model, tokenizer, config.decode)), "/info").json()
    assert info["attention"] == {role: {"layers": 2, "heads": [4, 4], "branches": [1, 1]}
                                 for role in ("encoder_self", "decoder_self", "cross")}
    mat_model, decode = mat
    info = get(create_app(TorchEngine(mat_model, tokenizer, decode)), "/info").json()
    assert info["attention"]["encoder_self"] == {"layers": 1, "heads": [4], "branches": [2]}
    assert info["attention"]["cross"] == {"layers": 2, "heads": [4, 4], "branches": [2, 2]}


def test_maps_equal_the_extractor_on_the_model_translation(tokenizer, experiment):
    config, model = experiment
    translation, maps = expected_maps(model, tokenizer, config.decode, TEXT)
    [src] = tokenizer.encode_src([TEXT])
    [tgt] = tokenizer.encode_tgt([translation])
    source = [*(tokenizer.src.id_to_piece(i) for i in src), "</s>"]
    target = ["<s>", *(tokenizer.tgt.id_to_piece(i) for i in tgt)]
    app = create_app(TorchEngine(model, tokenizer, config.decode))
    cross, enc, dec, mean, translated = post_all(app, "/attention", [
        {"text": TEXT, "kind": "cross", "layer": 1, "head": 2},
        {"text": TEXT, "kind": "encoder_self", "layer": 0, "head": 0},
        {"text": TEXT, "kind": "decoder_self", "layer": 1, "head": 3},
        {"text": TEXT, "kind": "cross", "layer": 0, "branch": 0},  # one branch: the mean of all heads
        {"path": "/translate", "texts": [TEXT]},
    ])
    assert translated.json()["translations"] == [translation]
    got = cross.json()
    assert got["translation"] == translation and got["module"] == "decoder.layers.1.cross_attn"
    assert got["source_tokens"] == got["columns"] == source and got["target_tokens"] == got["rows"] == target
    weights = torch.tensor(got["weights"])
    assert weights.shape == (len(target), len(source))
    assert weights.sum(-1) == pytest.approx(torch.ones(len(target)), abs=1e-5)
    assert weights == pytest.approx(maps["decoder.layers.1.cross_attn"][2], abs=1e-6)

    weights = torch.tensor(enc.json()["weights"])
    assert enc.json()["rows"] == enc.json()["columns"] == source and weights.shape == (len(source), len(source))
    assert weights == pytest.approx(maps["encoder.layers.0.self_attn"][0], abs=1e-6)
    weights = torch.tensor(dec.json()["weights"])
    assert dec.json()["rows"] == dec.json()["columns"] == target and weights.shape == (len(target), len(target))
    assert weights == pytest.approx(maps["decoder.layers.1.self_attn"][3], abs=1e-6)
    assert torch.triu(weights, diagonal=1).abs().max() == 0  # causal
    assert torch.tensor(mean.json()["weights"]) == pytest.approx(maps["decoder.layers.0.cross_attn"].mean(0), abs=1e-6)


def test_mat_branch_is_the_mean_of_its_heads_and_a_given_target_is_used(tokenizer, mat):
    model, decode = mat
    target = "kalo mi"  # not the model's translation: the map is of this target
    [src] = tokenizer.encode_src([TEXT])
    [tgt] = tokenizer.encode_tgt([target])
    maps = capture_maps(model, src, tgt)
    app = create_app(TorchEngine(model, tokenizer, decode))
    branch, head = post_all(app, "/attention", [
        {"text": TEXT, "target": target, "kind": "cross", "layer": 1, "branch": 1},
        {"text": TEXT, "target": target, "kind": "cross", "layer": 1, "head": 3},
    ])
    probs = maps["decoder.layers.1.cross_attn"]  # [4, T, S]: branch 1 = heads 2 and 3
    assert branch.json()["translation"] == target and branch.json()["title"] == "branch 1"
    assert len(branch.json()["rows"]) == len(tgt) + 1
    assert torch.tensor(branch.json()["weights"]) == pytest.approx((probs[2] + probs[3]) / 2, abs=1e-6)
    assert torch.tensor(head.json()["weights"]) == pytest.approx(probs[3], abs=1e-6)


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"text": "x" * 41}, 413, "text has 41 characters: at most 40"),
    ({"text": "ka", "target": "y" * 41, "head": 0}, 413, "target has 41 characters"),
    ({"text": "  ", "head": 0}, 422, "text is empty"),
    ({"text": "ka", "layer": 2, "head": 0}, 422, "layer=2: the cross attention has layers 0..1"),
    ({"text": "ka", "layer": -1, "head": 0}, 422, "layers 0..1"),
    ({"text": "ka", "head": 4}, 422, "head=4: layer 0 of the cross attention has heads 0..3"),
    ({"text": "ka", "branch": 1}, 422, "branch=1: layer 0 of the cross attention has branches 0..0"),
    ({"text": "ka"}, 422, "exactly one of head or branch"),
    ({"text": "ka", "head": 0, "branch": 0}, 422, "exactly one of head or branch"),
    ({"text": "ka", "head": 0, "beam": 9}, 422, "beam=9: at most 8"),
    ({"text": "ka", "kind": "self", "head": 0}, 422, "kind"),
    ({"text": "ka", "head": 0, "colour": "red"}, 422, "colour"),
])
def test_bad_requests_are_clear_4xx(body, status, message, tokenizer, experiment):
    config, model = experiment
    app = create_app(TorchEngine(model, tokenizer, config.decode), ServeLimits(max_chars=40, max_beam=8))
    [reply] = post_all(app, "/attention", [body])
    assert reply.status_code == status
    assert message in str(reply.json()["detail"])


def test_a_target_longer_than_the_learned_positions_is_refused(tokenizer, experiment):
    config, model = experiment
    target = " ".join(["kalomi"] * 30)
    assert len(tokenizer.encode_tgt([target])[0]) >= model.config.max_positions
    [reply] = post_all(create_app(TorchEngine(model, tokenizer, config.decode)), "/attention",
                       [{"text": "ka", "target": target, "head": 0}])
    assert reply.status_code == 422 and "learned positions allow at most" in reply.json()["detail"]


def test_an_engine_without_maps_answers_400_and_info_says_so():
    app = create_app(BlockingEngine(block=False))
    [reply] = post_all(app, "/attention", [{"text": "a b", "head": 0}])
    assert reply.status_code == 400 and "need the PyTorch engine" in reply.json()["detail"]
    assert get(app, "/info").json()["attention"] is None


def test_the_ct2_engine_answers_400_and_info_says_so(checkpoint, tmp_path):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install '.[ct2]')")
    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.convert.ct2 import export_ct2
    from multibranch.serve.engine import Ct2Engine

    app = create_app(Ct2Engine(str(export_ct2(load_checkpoint(checkpoint), tmp_path / "ct2"))))
    [reply] = post_all(app, "/attention", [{"text": "ka lo", "head": 0}])
    assert reply.status_code == 400 and "need the PyTorch engine" in reply.json()["detail"]
    assert get(app, "/info").json()["attention"] is None


class MappingEngine(BlockingEngine):
    """A stub that also draws (fake) maps, recording the thread of every engine call."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def translate(self, texts: list[str], beam: int, nbest: int) -> list[list[tuple[str, float]]]:
        self.threads.append(threading.current_thread().name)
        return super().translate(texts, beam, nbest)

    def attention_choices(self) -> dict[str, Any]:
        return {"cross": {"layers": 1, "heads": [1], "branches": [1]}}

    def attention(self, text: str, *args: Any) -> dict[str, Any]:
        self.threads.append(threading.current_thread().name)
        return {"text": text, "weights": [[1.0]]}


def test_maps_wait_for_the_engine_thread_and_count_against_the_queue_bound():
    stub = MappingEngine()
    app = create_app(stub, ServeLimits(max_queue=1, max_wait_ms=0))
    body = {"text": "a", "head": 0}

    async def go():
        async with serving(app) as client:
            busy = asyncio.create_task(client.post("/translate", json={"texts": ["t"]}))
            await wait_until(stub.started.is_set)  # the engine thread is translating
            waiting = asyncio.create_task(client.post("/attention", json=body))
            await wait_until(lambda: app.state.batcher.depth == 1)
            refused = await client.post("/attention", json=body)
            assert not waiting.done()  # behind the translation on the one engine thread
            stub.release.set()
            return refused, await busy, await waiting

    refused, busy, waiting = run(go())
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert busy.json() == {"translations": ["T#0"]}
    assert waiting.status_code == 200 and waiting.json() == {"text": "a", "weights": [[1.0]]}
    assert len(stub.threads) == 2 and len(set(stub.threads)) == 1
    assert app.state.batcher.depth == 0


def test_a_map_not_drawn_in_time_answers_504_and_never_reaches_the_engine():
    stub = MappingEngine()
    app = create_app(stub, ServeLimits(timeout_s=0.3, max_wait_ms=0))

    async def go():
        async with serving(app) as client:
            busy = asyncio.create_task(client.post("/translate", json={"texts": ["t"]}))
            await wait_until(stub.started.is_set)
            late = await client.post("/attention", json={"text": "a", "head": 0})  # behind the busy thread
            depth = app.state.batcher.depth
            stub.release.set()
            await busy
            return late, depth, app.state.batcher.depth

    late, waiting, left = run(go())
    assert late.status_code == 504 and "within 0.3 s" in late.json()["detail"]
    assert waiting == 0 and left == 0  # dropped from the queue when it timed out
    assert stub.threads == ["multibranch-engine_0"]  # the translation only


def test_the_page_is_served_at_the_root_and_packaged(tokenizer, experiment):
    config, model = experiment
    app = create_app(TorchEngine(model, tokenizer, config.decode), static_dir=PAGE_DIR)
    page = get(app, "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for element in ('id="source"', 'id="translate"', 'id="error"', 'id="heatmap"', 'src="app.js"'):
        assert element in page.text
    script = get(app, "/app.js")
    assert script.status_code == 200 and "attention" in script.text
    for asset in ("http://", "https://"):  # nothing fetched from the internet
        assert all(asset not in path.read_text() for path in PAGE_DIR.iterdir())
    tomllib = pytest.importorskip("tomllib")
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["multibranch"]
    package = ROOT / "src" / "multibranch"
    packaged = {path for pattern in globs for path in package.glob(pattern)}
    assert {path for path in PAGE_DIR.iterdir()} <= packaged


def test_without_a_target_the_map_is_of_the_1best_with_the_requested_beam(tokenizer, experiment):
    config, model = experiment
    greedy = dataclasses.replace(config.decode, beam=1)
    translation, maps = expected_maps(model, tokenizer, greedy, TEXT)
    [reply] = post_all(create_app(TorchEngine(model, tokenizer, config.decode)), "/attention",
                       [{"text": TEXT, "layer": 0, "head": 1, "beam": 1}])
    assert reply.json()["translation"] == translation
    assert torch.tensor(reply.json()["weights"]) == pytest.approx(maps["decoder.layers.0.cross_attn"][1], abs=1e-6)
