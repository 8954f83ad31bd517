"""The FastAPI application: POST /translate or /classify (by the engine's task), POST /attention,
GET /health, /info, /metrics.

`create_app(engine, limits)` builds it around an already loaded engine (one model copy); the
batcher's worker starts with the app and, on shutdown, finishes every accepted request before it
stops. `static_dir` mounts a directory of static files at / after the API routes: `multibranch
serve` mounts PAGE_DIR, the packaged web page (static/: translation, n-best, attention heat map;
labels and probabilities for a classifier); an API path asked with another method still gets 405.

Request bodies are checked strictly (no `true` for a number, no `"yes"` for a flag: 422; decoding values as
`multibranch translate` checks its options, NaN and Infinity included: 422); a text that is not valid Unicode
(a lone surrogate such as the JSON escape "\\ud800") gets 400 naming it, and a body that is not UTF-8 gets
400 naming its first bad byte. A body over `limits.max_body_bytes`
gets 413 before it is read whole or parsed, and a 422 never echoes more of the input than a short value.
With the engine's `long_inputs` "refuse" (`serve --long-inputs refuse`), a text over the model's token limit
gets 413 naming it; otherwise it is translated from its first tokens, as `translate` does.
Every response (but those to the monitoring's GET /health, /info, /metrics) is timed in
multibranch_request_latency_seconds{status}, 400s, 404s, 405s, 422s and 500s included; an exception
no handler answered becomes a 500 with a JSON detail and one log record with its traceback. Once
`app.state.batcher` stops accepting (`multibranch serve` drains it on Ctrl-C / SIGTERM before it
closes its port), new requests get 503 with Retry-After, /health too, and every response closes its
connection.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import typing
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, create_model
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from multibranch.analysis.attention_maps import SelectionError
from multibranch.config import check_value
from multibranch.errors import ConfigError, DataError, UserError
from multibranch.experiment.decoding import REQUEST_FIELDS, SAMPLING_ONLY, DecodeConfig, check_sampling_only
from multibranch.serve.attention import check_selection
from multibranch.serve.batcher import MicroBatcher, QueueFull, ShuttingDown
from multibranch.serve.engine import DecodeOptions, Engine
from multibranch.serve.limits import ServeLimits
from multibranch.serve.metrics import ServeMetrics

PAGE_DIR = Path(__file__).with_name("static")
UNTIMED = ("/health", "/info", "/metrics")  # GET / HEAD of these (monitoring): not in the latency histogram

logger = logging.getLogger("multibranch.serve")


class _TranslateRequest(BaseModel):
    """texts: the sentences; beam: beam size (unset: the model's); nbest: hypotheses per text (unset:
    plain strings; set: a list of {text, score} per text, best first, nbest <= beam); alignment: also
    return `alignments`, per translation its attention-based 'i-j ...' pairs between source and
    output SentencePiece pieces (last decoder layer, docs/decoding.md); prefix: per text the target text its
    translation must start with ("": none). Every other decode setting a call may change
    (`experiment.decoding.REQUEST_FIELDS`: sampling, temperature, top_k, top_p, seed, length_penalty,
    length_penalty_kind, min_len, max_len_a, max_len_b, no_repeat_ngram_size) is a field of its own name,
    unset: the model's, as `multibranch translate` takes them (docs/decoding.md)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    texts: list[str]
    beam: int | None = Field(default=None, ge=1)
    nbest: int | None = Field(default=None, ge=1)
    alignment: bool = False
    prefix: list[str] | None = None


# the decode fields a request sets by name, beyond beam and nbest
REQUEST_DECODE_FIELDS = tuple(name for name in REQUEST_FIELDS if name not in ("beam", "nbest"))
_HINTS = typing.get_type_hints(DecodeConfig)
TranslateRequest = create_model(  # type: ignore[call-overload]
    "TranslateRequest", __base__=_TranslateRequest, __doc__=_TranslateRequest.__doc__,
    **{name: (_HINTS[name], False) if _HINTS[name] is bool else (_HINTS[name] | None, None)
       for name in REQUEST_DECODE_FIELDS})


def _decode_fields(body: Any) -> dict[str, Any]:
    """The decode fields a request set (sampling only when true)."""
    given = {name: getattr(body, name) for name in REQUEST_DECODE_FIELDS}
    return {name: value for name, value in given.items() if value is not None and value is not False}


class Hypothesis(BaseModel):
    text: str
    score: float


class TranslateResponse(BaseModel):
    translations: list[str] | list[list[Hypothesis]]
    alignments: list[str] | list[list[str]] | None = None  # only when the request asked for them


class ClassifyRequest(BaseModel):
    """texts: the texts to label, or (a sentence-pair classifier) pairs: [a, b] per example; exactly one of
    them; probs: also return every label's probability."""

    model_config = ConfigDict(extra="forbid", strict=True)
    texts: list[str] | None = None
    pairs: list[Annotated[list[str], Field(min_length=2, max_length=2)]] | None = None
    probs: bool = False


class ClassifyResponse(BaseModel):
    """labels: the most probable label per text (None for a blank text); probabilities (with probs):
    label -> probability per text, in the model's label order (None for a blank text)."""

    labels: list[str | None]
    probabilities: list[dict[str, float] | None] | None = None


class AttentionRequest(BaseModel):
    """One attention map of `text`: `kind` (attention type), `layer`, and exactly one of `head` or
    `branch` (a MAT branch: the mean of its heads; branch 0 of a one-branch module: all its heads).
    The translation is `target` when given, else the model's 1-best with `beam` (unset: the model's)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: str
    kind: Literal["cross", "encoder_self", "decoder_self"] = "cross"
    layer: int = 0
    head: int | None = None
    branch: int | None = None
    beam: int | None = Field(default=None, ge=1)
    target: str | None = None


def _unavailable(err: Exception, limits: ServeLimits, metrics: ServeMetrics) -> JSONResponse:
    """The answer to a request the worker did not take (503) or did not finish in time (504)."""
    if isinstance(err, QueueFull):
        metrics.rejected.labels("queue_full").inc()
        return JSONResponse({"detail": f"the queue is full ({limits.max_queue} requests); retry later"}, 503,
                            headers={"Retry-After": str(limits.retry_after_s)})
    if isinstance(err, ShuttingDown):
        metrics.rejected.labels("shutting_down").inc()
        return JSONResponse({"detail": "the server is shutting down; retry later"}, 503,
                            headers={"Retry-After": str(limits.retry_after_s)})
    metrics.rejected.labels("timeout").inc()
    return JSONResponse({"detail": f"not answered within {limits.timeout_s:g} s"}, 504)


def _check_unicode(name: str, text: str) -> None:
    """400 when `text` is not valid Unicode: a lone surrogate (JSON lets a string hold the escape
    "\\ud800"; no tokenizer, and no UTF-8 answer, can take it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise HTTPException(400, f"{name} is not valid Unicode: a lone surrogate (\\u{ord(text[err.start]):04x}) at "
                                 f"character {err.start}") from None


def _printable(value: Any) -> Any:
    """`value` (JSON-like) with each lone surrogate in its strings written as its escape, so that the
    answer can be encoded in UTF-8 (a 422 echoes short inputs and names the fields)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable(v) for v in value]
    return value


ECHO_CHARS = 100  # the longest input a 422 shows back


def _validation_errors(errors: Any) -> list[dict[str, Any]]:
    """The 422 detail of a request that failed validation: per error its place, message and type, and the
    offending input only when it is short (a string of at most ECHO_CHARS characters, a finite number, a
    flag or null): never a large body back, and never NaN or Infinity, which JSON cannot carry."""
    out = []
    for error in errors:
        entry = {key: _printable(error[key]) for key in ("type", "loc", "msg") if key in error}
        value = error.get("input")
        short = (value is None or isinstance(value, (bool, int))
                 or (isinstance(value, float) and math.isfinite(value))
                 or (isinstance(value, str) and len(value) <= ECHO_CHARS))
        if short and "input" in error:
            entry["input"] = _printable(value)
        out.append(entry)
    return out


class _TooLarge(HTTPException):
    """A request body over the limit (raised while it is read; the app answers 413)."""

    def __init__(self, limit: int, size: int | None = None) -> None:
        has = f"has {size} bytes" if size is not None else f"is over {limit} bytes"
        super().__init__(413, f"the request body {has}: this server takes at most {limit} (serve --max-body-bytes)")


class _BodyLimit:
    """Middleware that refuses a request body over `limit` bytes with 413 before it is parsed: at once when
    its Content-Length says so (nothing read), else as soon as the bytes read pass the limit."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            error = _TooLarge(self.limit, int(declared))
            await JSONResponse({"detail": error.detail}, 413, headers={"Connection": "close"})(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _TooLarge(self.limit)  # FastAPI answers an HTTPException raised while reading the body
            return message

        await self.app(scope, counted, send)


def _check_attention(body: AttentionRequest, limits: ServeLimits, choices: dict[str, Any] | None, task: str,
                     ensemble: bool = False) -> None:
    """400 when the engine draws no maps or for a text that is not valid Unicode, 413 for too much
    text, 422 for choices out of range."""
    if task != "translation":
        raise HTTPException(400, f"attention maps are drawn for translation models; this server holds a {task} model")
    if choices is None and ensemble:
        raise HTTPException(400, "attention maps are drawn from one model; this server holds an ensemble (serve one "
                                 "--ckpt to draw them)")
    if choices is None:
        raise HTTPException(400, "attention maps need the PyTorch engine (multibranch serve --engine torch)")
    for name in ("text", "target"):
        value = getattr(body, name)
        if value is not None:
            _check_unicode(name, value)
        if value is not None and len(value) > limits.max_chars:
            raise HTTPException(413, f"{name} has {len(value)} characters: at most {limits.max_chars}")
    if not body.text.strip():
        raise HTTPException(422, "text is empty")
    if body.beam is not None and body.beam > limits.max_beam:
        raise HTTPException(422, f"beam={body.beam}: at most {limits.max_beam}")
    try:
        check_selection(choices, body.kind, body.layer, body.head, body.branch)
    except SelectionError as err:
        raise HTTPException(422, str(err)) from None


def _check_texts(texts: list[str], limits: ServeLimits, names: list[str] | None = None) -> None:
    """413 for too many texts or characters, 400 for a text that is not valid Unicode; `names` are the
    texts' places in the request, for the messages (unset: texts[i])."""
    names = names if names is not None else [f"texts[{i}]" for i in range(len(texts))]
    if len(texts) > limits.max_items:
        raise HTTPException(413, f"{len(texts)} texts: at most {limits.max_items} per request")
    for name, text in zip(names, texts, strict=True):
        _check_unicode(name, text)
        if len(text) > limits.max_chars:
            raise HTTPException(413, f"{name} has {len(text)} characters: at most {limits.max_chars} per text")
    total = sum(len(text) for text in texts)
    if total > limits.max_total_chars:
        raise HTTPException(413, f"{total} characters in all: at most {limits.max_total_chars} per request")


def _classify_examples(body: ClassifyRequest, pairs: bool, limits: ServeLimits) -> list[Any]:
    """The texts or (a, b) pairs of a /classify request; 422 for the wrong kind for the model (texts to a
    pair classifier, pairs to a single-text one), for neither or both given, and for a pair with one blank
    text; the limits of `_check_texts` count every text of the pairs."""
    if (body.texts is None) == (body.pairs is None):
        raise HTTPException(422, 'give exactly one of "texts" and "pairs"')
    if pairs and body.pairs is None:
        raise HTTPException(422, 'this classifier reads sentence pairs: send {"pairs": [[a, b], ...]}')
    if not pairs and body.pairs is not None:
        raise HTTPException(422, 'this classifier reads single texts: send {"texts": [...]}, not "pairs"')
    if body.texts is not None:
        _check_texts(body.texts, limits)
        return body.texts
    assert body.pairs is not None
    if len(body.pairs) > limits.max_items:
        raise HTTPException(413, f"{len(body.pairs)} pairs: at most {limits.max_items} per request")
    _check_texts([text for pair in body.pairs for text in pair], limits,
                 [f"pairs[{i}][{j}]" for i in range(len(body.pairs)) for j in range(2)])
    for i, (a, b) in enumerate(body.pairs):
        if bool(a.strip()) != bool(b.strip()):
            raise HTTPException(422, f"pairs[{i}]: empty {'first' if not a.strip() else 'second'} text")
    return [(a, b) for a, b in body.pairs]


def _check_limits(body: TranslateRequest, limits: ServeLimits, beam: int) -> None:
    """413 for too much text, 422 for settings out of range (the decode config's rules, as `translate` applies
    them to its options)."""
    _check_texts(body.texts, limits)
    if body.prefix is not None:
        if len(body.prefix) != len(body.texts):
            raise HTTPException(422, f"prefix has {len(body.prefix)} entries for {len(body.texts)} texts: give one "
                                     'per text ("": no prefix)')
        _check_texts(body.prefix, limits, [f"prefix[{i}]" for i in range(len(body.prefix))])
    try:
        check_sampling_only([f'"{name}"' for name in SAMPLING_ONLY if getattr(body, name) is not None],
                            body.sampling, '"sampling": true')
        for name, value in _decode_fields(body).items():
            check_value(DecodeConfig, name, value)
    except ConfigError as err:
        raise HTTPException(422, str(err)) from None
    if body.sampling:
        _check_sampling(body, limits)
        return
    if beam > limits.max_beam:
        raise HTTPException(422, f"beam={beam}: at most {limits.max_beam}")
    if body.nbest is not None and body.nbest > beam:
        raise HTTPException(422, f"nbest={body.nbest} must be <= beam={beam}")


def _check_sampling(body: TranslateRequest, limits: ServeLimits) -> None:
    """422 for sampling settings that `multibranch translate --sampling` refuses."""
    if body.beam is not None:
        raise HTTPException(422, "sampling draws nbest samples per text instead of a beam search; drop beam")
    if body.nbest is not None and body.nbest > limits.max_beam:
        raise HTTPException(422, f"nbest={body.nbest}: at most {limits.max_beam} samples per text")


def _check_lengths(texts: list[str], tokens: list[int], engine: Any, names: list[str] | None = None) -> None:
    """413 naming the first text over the model's token limit when the engine refuses long inputs
    (`long_inputs` "refuse"); otherwise such texts are translated from their first tokens. `names`: the texts'
    places in the request (unset: texts[i])."""
    limit = getattr(engine, "input_limit", None)
    decode = getattr(engine, "decode", None)
    if limit is None or getattr(decode, "long_inputs", "truncate") != "refuse":
        return
    for i, count in enumerate(tokens):
        if count > limit and texts[i].strip():
            name = names[i] if names is not None else f"texts[{i}]"
            raise HTTPException(413, f"{name} has {count} tokens (EOS included): the model takes at most {limit}")


def _decode_options(body: Any, beam: int) -> DecodeOptions:
    """The request's DecodeOptions (checked by `_check_limits`)."""
    return DecodeOptions(beam=beam, nbest=body.nbest or 1, fields=tuple(sorted(_decode_fields(body).items())),
                         prefixed=body.prefix is not None, aligned=body.alignment)


def _translations(results: list[list[tuple[str, float, str | None]]], nbest: int | None, alignment: bool
                  ) -> dict[str, Any]:
    """The answer of /translate from (text, score, alignment) hypotheses per text."""
    if nbest is None:
        out: dict[str, Any] = {"translations": [entries[0][0] for entries in results]}
        if alignment:
            out["alignments"] = [entries[0][2] or "" for entries in results]
        return out
    out = {"translations": [[{"text": t, "score": s} for t, s, _ in entries] for entries in results]}
    if alignment:
        out["alignments"] = [[a or "" for _, _, a in entries] for entries in results]
    return out


class _Answered:
    """Middleware around the whole app: times every response in the latency histogram by status (but
    GET / HEAD of UNTIMED paths), answers an exception no handler answered with a 500 (JSON detail,
    its traceback logged once, the connection kept), and closes each connection after its response
    once the batcher is shutting down (so a keep-alive client reconnects rather than sends on a
    connection the server is about to close)."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics, batcher: MicroBatcher):
        self.app, self.metrics, self.batcher = app, metrics, batcher

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: int | None = None

        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if self.batcher.closing:
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, receive, answer)
        except Exception:
            logger.exception("%s %s: internal error", scope.get("method"), scope.get("path"))
            if status is not None:  # the answer was begun: only the server can end the connection
                self._observe(scope, status, start)
                raise
            await JSONResponse({"detail": "internal server error (the server's log has the traceback)"},
                               500)(scope, receive, answer)
        if status is not None:
            self._observe(scope, status, start)

    def _observe(self, scope: Scope, status: int, start: float) -> None:
        if scope.get("path") not in UNTIMED or scope.get("method") not in ("GET", "HEAD"):
            self.metrics.latency.labels(str(status)).observe(time.perf_counter() - start)


class _PageFiles:
    """The static page mounted at /, except that a request for an API path with a method the API does
    not take gets 405 with Allow (the router would otherwise hand it to the page: 404), and a request other than
    GET or HEAD for any other path gets 404 (the page's files would answer 405: a mistyped route is not a wrong
    method)."""

    def __init__(self, files: ASGIApp, api_methods: dict[str, set[str]]):
        self.files, self.api_methods = files, api_methods

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        methods = self.api_methods.get(scope.get("path", "")) if scope["type"] == "http" else None
        if methods is not None:
            await JSONResponse({"detail": "Method Not Allowed"}, 405,
                               headers={"Allow": ", ".join(sorted(methods))})(scope, receive, send)
            return
        if scope["type"] == "http" and scope.get("method") not in ("GET", "HEAD"):
            await JSONResponse({"detail": "Not Found"}, 404)(scope, receive, send)
            return
        await self.files(scope, receive, send)


def create_app(engine: Engine, limits: ServeLimits | None = None, static_dir: str | Path | None = None) -> FastAPI:
    """The server around `engine` (already loaded)."""
    limits = limits or ServeLimits()
    limits.validate()
    default_beam = getattr(engine, "default_beam", None)
    if default_beam is not None and default_beam > limits.max_beam:  # every request without a beam would be refused
        raise ConfigError(f"the model's default beam {default_beam} (--beam) is over max_beam={limits.max_beam} "
                          "(--max-beam): raise --max-beam or lower --beam")
    metrics = ServeMetrics()
    batcher = MicroBatcher(engine, limits, metrics)
    choices_of = getattr(engine, "attention_choices", None)  # engines without it draw no maps
    choices = choices_of() if choices_of is not None else None
    task = getattr(engine, "task", "translation")
    info = {"task": task, **engine.info(), "attention": choices}

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        batcher.start()
        yield
        await batcher.close()

    app = FastAPI(title="multibranch", lifespan=lifespan)
    app.state.batcher, app.state.metrics, app.state.limits, app.state.engine = batcher, metrics, limits, engine
    app.add_middleware(_BodyLimit, limit=limits.max_body_bytes)
    app.add_middleware(_Answered, metrics=metrics, batcher=batcher)  # the outer one: it times the 413s too

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        kind = request.headers.get("content-type", "")
        if not kind.split(";")[0].strip().lower().endswith(("/json", "+json")):  # e.g. curl -d without -H
            return JSONResponse({"detail": f"send the body as JSON with content-type: application/json (this "
                                           f"request's content-type: {kind or 'none'})"}, 415)
        return JSONResponse({"detail": _validation_errors(err.errors())}, 422)

    @app.exception_handler(StarletteHTTPException)  # what FastAPI raises for a body it cannot parse
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        cause = err.__cause__  # FastAPI's "error parsing the body" 400 raised from the JSON parser's error
        if err.status_code == 400 and isinstance(cause, UnicodeDecodeError):
            bad = cause.object[cause.start:cause.start + 1].hex()
            return JSONResponse({"detail": f"the request body is not valid UTF-8: byte 0x{bad} at offset "
                                           f"{cause.start} (send JSON encoded in UTF-8)"}, 400)
        return await http_exception_handler(request, err)

    async def queued(handle: Callable[[], Awaitable[Any]]) -> Any:
        """Answer a request that goes through the queue, counted in the in-flight gauge; 503 / 504 when
        the worker did not take it or did not finish it in time."""
        metrics.in_flight.inc()
        try:
            return await handle()
        except (QueueFull, ShuttingDown, TimeoutError) as err:
            return _unavailable(err, limits, metrics)
        finally:
            metrics.in_flight.dec()

    def require_task(wanted: str, other_route: str) -> None:
        if task != wanted:
            raise HTTPException(400, f"this server holds a {task} model: POST {other_route}")

    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True)
    async def translate(body: TranslateRequest) -> Any:
        async def handle() -> Any:
            require_task("translation", "/classify")
            beam = body.beam if body.beam is not None else engine.default_beam  # type: ignore[attr-defined]
            _check_limits(body, limits, beam)
            if not body.texts:
                return {"translations": []}
            lengths = engine.count_tokens(body.texts)
            _check_lengths(body.texts, lengths, engine)
            tokens = sum(lengths)
            if _decode_fields(body) or body.prefix is not None:
                return await options_call(body, beam, tokens)
            if body.alignment:
                if not hasattr(engine, "translate_aligned"):
                    raise HTTPException(422, "alignment: this engine has no attention to align with (use the "
                                             "torch engine)")
                results = await batcher.submit_call(body.texts, tokens, ("translate_aligned", beam, body.nbest or 1),
                                                    weight=beam)
                if body.nbest is None:
                    return {"translations": [entries[0][0] for entries in results],
                            "alignments": [entries[0][2] for entries in results]}
                return {"translations": [[{"text": t, "score": s} for t, s, _ in entries] for entries in results],
                        "alignments": [[a for _, _, a in entries] for entries in results]}
            results = await batcher.submit(body.texts, tokens, beam, body.nbest or 1)
            if body.nbest is None:
                return {"translations": [entries[0][0] for entries in results]}
            return {"translations": [[{"text": t, "score": s} for t, s in entries] for entries in results]}

        return await queued(handle)

    async def options_call(body: Any, beam: int, tokens: int) -> Any:
        """Decode settings of the request's own (sampling, prefixes, length penalty, ...): the engine's
        `translate_with`, as `multibranch translate` decodes them; 422 for what the engine cannot do."""
        options = _decode_options(body, beam)
        try:
            engine.decode_options(options)  # type: ignore[attr-defined]
        except UserError as err:
            raise HTTPException(422, str(err)) from None
        items: list[Any] = list(body.texts)
        if body.prefix is not None:
            try:
                engine.check_prefixes(body.texts, body.prefix)  # type: ignore[attr-defined]
            except DataError as err:
                raise HTTPException(422, str(err)) from None
            items = list(zip(body.texts, body.prefix, strict=True))
        weight = options.nbest if options.sampling else beam
        results = await batcher.submit_call(items, tokens, ("translate_with", options), weight=weight,
                                            alone=options.seed is not None)
        return _translations(results, body.nbest, body.alignment)

    @app.post("/classify", response_model=ClassifyResponse)
    async def classify(body: ClassifyRequest) -> Any:
        async def handle() -> Any:
            require_task("classification", "/translate")
            examples = _classify_examples(body, getattr(engine, "pairs", False), limits)
            if not examples:
                return {"labels": [], "probabilities": [] if body.probs else None}
            tokens = sum(engine.count_tokens(examples))  # type: ignore[attr-defined]
            results = await batcher.submit_call(examples, tokens, ("classify",))
            names = engine.labels  # type: ignore[attr-defined]
            best = [None if p is None else names[max(range(len(p)), key=p.__getitem__)] for p in results]
            probs = [None if p is None else dict(zip(names, p)) for p in results] if body.probs else None
            return {"labels": best, "probabilities": probs}

        return await queued(handle)

    @app.post("/attention")
    async def attention(body: AttentionRequest) -> Any:
        _check_attention(body, limits, choices, task, getattr(engine, "ensemble", False))
        _check_lengths([body.text], engine.count_tokens([body.text]), engine, names=["text"])  # type: ignore[attr-defined]

        async def handle() -> Any:
            try:
                return await batcher.run_exclusive(engine.attention, body.text, body.kind, body.layer,  # type: ignore[attr-defined]
                                                   body.head, body.branch, body.beam, body.target)
            except SelectionError as err:
                raise HTTPException(422, str(err)) from None
            except DataError as err:  # a text over the model's limit, refused (`long_inputs` "refuse")
                raise HTTPException(413, str(err)) from None

        return await queued(handle)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Any:
        if batcher.closing:
            return JSONResponse({"status": "shutting down", "queue_depth": batcher.depth}, 503,
                                headers={"Retry-After": str(limits.retry_after_s)})
        return {"status": "ok", "queue_depth": batcher.depth}

    @app.get("/info")
    async def get_info() -> dict[str, Any]:
        return {**info, "limits": dataclasses.asdict(limits)}

    @app.get("/metrics")
    async def get_metrics(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    if static_dir is not None:
        from fastapi.staticfiles import StaticFiles

        api_methods: dict[str, set[str]] = {}
        for route in app.routes:
            if isinstance(route, Route) and route.methods:
                api_methods.setdefault(route.path, set()).update(route.methods)
        app.mount("/", _PageFiles(StaticFiles(directory=str(static_dir), html=True), api_methods), name="static")
    return app
