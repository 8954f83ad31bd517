"""`multibranch serve` decodes as `multibranch translate` does: sampling (temperature, top-k, top-p, seed),
target prefixes and ensembles of several --ckpt, through the same Translator; a `convert ct2` directory
is detected without --engine; messages name the request field at fault."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from multibranch.cli import build_parser  # noqa: E402
from multibranch.loading.model import LoadedModel  # noqa: E402
from multibranch.serve.app import create_app  # noqa: E402
from multibranch.serve.engine import Ct2Engine, TorchEngine, load_torch_engine  # noqa: E402
from multibranch.serve.limits import ServeLimits  # noqa: E402
from multibranch.tasks.translation.translator import Translator  # noqa: E402
from tests.helpers.serve import BlockingEngine, run, serving  # noqa: E402
from tests.helpers.translation import corpus_lines  # noqa: E402

LINES = corpus_lines(6, seed=31)


@pytest.fixture
def engine(tokenizer, experiment) -> TorchEngine:
    config, model = experiment
    return TorchEngine(model, tokenizer, config.decode, kind="transformer")


def post(app: Any, *bodies: dict[str, Any]) -> list[Any]:
    async def go() -> list[Any]:
        async with serving(app) as client:
            return [await client.post("/translate", json=body) for body in bodies]

    return run(go())


def test_seeded_sampling_gives_the_samples_of_translate_and_again_for_the_same_seed(engine, tokenizer, experiment):
    config, model = experiment
    body = {"texts": LINES, "sampling": True, "nbest": 3, "top_k": 10, "temperature": 0.9, "seed": 5}
    first, again, other, plain = post(create_app(engine), body, body, {**body, "seed": 6},
                                      {"texts": LINES[:2], "sampling": True})
    assert {r.status_code for r in (first, again, other, plain)} == {200}
    cfg = dataclasses.replace(config.decode, nbest=1, sampling=True, temperature=0.9, top_k=10, seed=5)
    expected = Translator(model, tokenizer, cfg).translate_nbest(LINES, 3)  # what `translate --sampling` writes
    got = first.json()["translations"]
    assert [[h["text"] for h in entries] for entries in got] == [[t for t, _ in e] for e in expected]
    assert [h["score"] for e in got for h in e] == pytest.approx([s for e in expected for _, s in e], abs=1e-5)
    assert again.json() == first.json() and other.json() != first.json()
    assert all(isinstance(t, str) for t in plain.json()["translations"])


def test_prefixes_start_the_translations_as_translate_decodes_them(engine, tokenizer, experiment):
    config, model = experiment
    prefixes = ["ka", "", "lo mi", "", "", "ne"]
    reply, nbest, aligned = post(create_app(engine), {"texts": LINES, "prefix": prefixes},
                                 {"texts": LINES[:2], "prefix": prefixes[:2], "nbest": 2},
                                 {"texts": LINES[:2], "prefix": prefixes[:2], "alignment": True})
    translator = Translator(model, tokenizer, config.decode)
    assert reply.status_code == 200
    assert reply.json()["translations"] == translator.translate(LINES, prefixes=prefixes)
    assert reply.json()["translations"][0].startswith("ka")
    expected = translator.translate_nbest(LINES[:2], 2, prefixes=prefixes[:2])
    assert [[h["text"] for h in e] for e in nbest.json()["translations"]] == [[t for t, _ in e] for e in expected]
    assert len(aligned.json()["alignments"]) == 2


@pytest.mark.parametrize(("body", "message"), [
    ({"texts": ["a"], "temperature": 0.5}, '"temperature" applies only to "sampling": true; add "sampling": true'),
    ({"texts": ["a"], "top_k": 3, "seed": 1}, '"top_k", "seed" apply only to "sampling": true'),
    ({"texts": ["a"], "sampling": True, "beam": 2}, "drop beam"),
    ({"texts": ["a"], "sampling": True, "temperature": 0.0}, "temperature=0.0 must be in [0.001, 1000]"),
    ({"texts": ["a"], "sampling": True, "temperature": 1e-39}, "temperature=1e-39 must be in [0.001, 1000]"),
    ({"texts": ["a"], "sampling": True, "temperature": 1e39}, "temperature=1e+39 must be in [0.001, 1000]"),
    ({"texts": ["a"], "length_penalty": 1000}, "length_penalty=1000.0 must be in [-10, 10]"),
    ({"texts": ["a"], "sampling": True, "top_p": 1.5}, "top_p=1.5 must be in (0, 1]"),
    ({"texts": ["a"], "sampling": True, "nbest": 9}, "nbest=9: at most 8 samples per text"),
    ({"texts": ["a", "b"], "prefix": ["x"]}, "prefix has 1 entries for 2 texts"),
    ({"texts": ["a"], "prefix": ["x" * 11]}, "prefix[0] has 11 characters"),
])
def test_bad_sampling_and_prefix_requests_are_422_or_413_naming_the_field(body, message):
    stub = BlockingEngine(block=False)
    reply, = post(create_app(stub, ServeLimits(max_chars=10, max_beam=8)), body)
    assert reply.status_code in (413, 422)
    assert message in str(reply.json()["detail"])
    assert stub.calls == []


def test_extreme_lengths_and_nucleus_within_bounds_decode_as_their_limits_say(engine, tokenizer, experiment):
    """max_len_a/b far past the model's positions stop at its position limit (as the largest sensible values do),
    and a nucleus p that rounds to 0 in fp32 keeps the best token (as a tiny p does): answers, never a 500 or
    an empty sample."""
    config, model = experiment
    huge, reasonable, nucleus = post(create_app(engine), {"texts": LINES[:2], "max_len_a": 1e20},
                                     {"texts": LINES[:2], "max_len_b": 2**70},
                                     {"texts": LINES[:2], "sampling": True, "top_p": 1e-300, "nbest": 2, "seed": 3})
    capped = Translator(model, tokenizer, dataclasses.replace(config.decode, max_len_a=0.0,
                                                              max_len_b=model.config.max_positions))
    assert huge.status_code == reasonable.status_code == nucleus.status_code == 200
    assert huge.json()["translations"] == reasonable.json()["translations"] == capped.translate(LINES[:2])
    greedy = Translator(model, tokenizer, dataclasses.replace(config.decode, beam=1, nbest=1)).translate(LINES[:2])
    samples = nucleus.json()["translations"]
    assert [[h["text"] for h in entries] for entries in samples] == [[g, g] for g in greedy]  # p -> 0: the argmax
    assert all(h["score"] is not None for entries in samples for h in entries)


def test_a_prefix_longer_than_the_translation_may_be_is_422(engine):
    reply, = post(create_app(engine), {"texts": ["ka"], "prefix": [" ".join(["lo mi ne su"] * 8)]})
    assert reply.status_code == 422 and "prefix line 1 has" in reply.json()["detail"]


def test_an_ensemble_of_several_ckpt_decodes_as_translate_does(checkpoint, tmp_path):
    args = build_parser().parse_args(["serve", "--ckpt", str(checkpoint), str(checkpoint), "--port", "0",
                                      "--device", "cpu"])
    from multibranch.commands.serve import build_server

    server = build_server(args)
    engine = server.config.app.state.engine
    assert isinstance(engine, TorchEngine) and engine.ensemble
    loaded = LoadedModel.load([str(checkpoint)] * 2, "cpu")
    reference = Translator(loaded.module, loaded.tokenizer, loaded.config.decode)
    single = load_torch_engine(str(checkpoint), "cpu")
    reply, sampled, attention = post_with_attention(create_app(engine))
    assert reply.json()["translations"] == reference.translate(LINES)
    assert reply.json()["translations"] == [e[0][0] for e in single.translate(LINES, single.default_beam, 1)]
    assert sampled.status_code == 200
    assert attention.status_code == 400 and "ensemble" in attention.json()["detail"]
    assert engine.info()["config"]["ensemble"] == [str(checkpoint)] * 2


def post_with_attention(app: Any) -> list[Any]:
    async def go() -> list[Any]:
        async with serving(app) as client:
            return [await client.post("/translate", json={"texts": LINES}),
                    await client.post("/translate", json={"texts": LINES, "sampling": True, "seed": 1}),
                    await client.post("/attention", json={"text": LINES[0], "head": 0})]

    return run(go())


def test_serve_detects_a_ct2_directory_as_translate_does(checkpoint, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.cli import main
    from multibranch.commands.serve import build_server
    from multibranch.convert.ct2 import export_ct2

    directory = Path(export_ct2(load_checkpoint(checkpoint), tmp_path / "ct2"))
    for extra in ([], ["--engine", "ct2"]):
        args = build_parser().parse_args(["serve", "--ckpt", str(directory), "--port", "0", "--device", "cpu",
                                          *extra])
        engine = build_server(args).config.app.state.engine
        assert isinstance(engine, Ct2Engine) and args.engine == "ct2"
    sampled, prefixed = post(create_app(engine), {"texts": ["ka"], "sampling": True},
                             {"texts": ["ka"], "prefix": ["lo"]})
    assert sampled.status_code == prefixed.status_code == 422
    assert "sampling: not with a CTranslate2 directory" in sampled.json()["detail"]
    assert "prefix: not with a CTranslate2 directory" in prefixed.json()["detail"]
    settings = {"length_penalty": 0.3, "min_len": 2, "no_repeat_ngram_size": 1}
    decoded, = post(create_app(engine), {"texts": LINES, **settings})  # mapped onto CTranslate2's options
    assert decoded.status_code == 200
    assert decoded.json()["translations"] == engine.translator.with_decode(**settings).translate(LINES)
    capsys.readouterr()
    assert main(["serve", "--ckpt", str(directory), str(checkpoint), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot be an ensemble member" in err and "\n" not in err


def test_every_per_call_decode_setting_reaches_a_request_as_translate_decodes_it(engine, tokenizer, experiment):
    """Length penalty, minimum length, n-gram blocking, ...: each field of REQUEST_FIELDS is a request field of its
    own name, decoded as `translate` decodes it with the same setting."""
    from multibranch.experiment.decoding import DECODE_OPTIONS, REQUEST_FIELDS
    from multibranch.serve.app import TranslateRequest

    assert set(REQUEST_FIELDS) <= set(TranslateRequest.model_fields) and "batch_tokens" not in REQUEST_FIELDS
    assert set(DECODE_OPTIONS) == {f.name for f in dataclasses.fields(Translator(experiment[1], tokenizer).cfg)}
    config, model = experiment
    settings = {"no_repeat_ngram_size": 1, "min_len": 3, "length_penalty": 0.3, "length_penalty_kind": "gnmt",
                "max_len_a": 0.5, "max_len_b": 6}
    replies = post(create_app(engine), *({"texts": LINES, "nbest": 2, name: value} for name, value in settings.items()))
    for (name, value), reply in zip(settings.items(), replies, strict=True):
        assert reply.status_code == 200, reply.json()
        cfg = dataclasses.replace(config.decode, **{name: value})
        expected = Translator(model, tokenizer, cfg).translate_nbest(LINES, 2)
        got = reply.json()["translations"]
        assert [[h["text"] for h in e] for e in got] == [[t for t, _ in e] for e in expected], name
    bad, = post(create_app(engine), {"texts": ["ka"], "no_repeat_ngram_size": -1})
    assert bad.status_code == 422 and "no_repeat_ngram_size=-1" in bad.json()["detail"]
