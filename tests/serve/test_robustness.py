"""The server against bad input and a stop under load:

- a text holding a lone surrogate (the JSON escape "\\ud800") is a 400 naming it on /translate,
  /classify and /attention, with no traceback and the connection kept (real uvicorn);
- every response, framework-level 400/404/405/422 and 500 included, is counted in
  multibranch_request_latency_seconds{status}; an engine failure is a JSON 500, logged once;
- request bodies are typed strictly (`beam: true`, `probs: "yes"` are 422), and GET on a POST route
  is 405 also with the web page mounted at /;
- on Ctrl-C (uvicorn's SIGINT handler, called directly on a server in a thread) requests arriving
  while the accepted ones finish get 503 with Retry-After, on new and on kept-alive connections,
  and the accepted ones are answered; a second Ctrl-C still stops at once.

Stub engines blocked on an Event make the queue deterministic; the shutdown is observed through the
log record the server writes when it begins (no sleeps).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
uvicorn = pytest.importorskip("uvicorn")

from multibranch.errors import ConfigError  # noqa: E402
from multibranch.serve.app import PAGE_DIR, create_app  # noqa: E402
from multibranch.serve.limits import ServeLimits  # noqa: E402
from multibranch.serve.server import server_class as _server_class  # noqa: E402
from tests.helpers.serve import BlockingEngine  # noqa: E402

SURROGATE = "\ud800"


class StubEngine(BlockingEngine):
    """A translation engine that upper-cases; a text "boom" makes the engine call fail; with
    `block`, every call waits for `release` (and sets `started`)."""

    default_beam = 2

    def __init__(self, block: bool = False):
        super().__init__(block)

    def translate(self, texts: list[str], beam: int, nbest: int) -> list[list[tuple[str, float]]]:
        super().translate(texts, beam, nbest)  # records the call, waits for `release`
        if "boom" in texts:
            raise RuntimeError("the engine failed")
        return [[(t.upper(), 0.0)] for t in texts]


class StubClassifier:
    task = "classification"
    labels = ["a", "b"]

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(t.split()) + 2 for t in texts]

    def classify(self, texts: list[str]) -> list[list[float] | None]:
        self.calls.append(list(texts))
        return [[0.25, 0.75] for _ in texts]

    def info(self) -> dict[str, Any]:
        return {"engine": "stub"}


def raw_json(body: Any) -> bytes:
    """`body` as JSON bytes the way a client writes a lone surrogate: as the escape \\ud800 (httpx's
    `json=` cannot encode it)."""
    return json.dumps(body).encode("ascii")


@contextlib.asynccontextmanager
async def serving(app: Any, raise_app_exceptions: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan running, and a client talking to it in process."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def post_all(app: Any, requests: list[tuple[str, Any]], raise_app_exceptions: bool = True) -> list[httpx.Response]:
    """POST each (path, body) in one server run; a bytes body is sent as is (application/json)."""
    async def go() -> list[httpx.Response]:
        async with serving(app, raise_app_exceptions) as client:
            replies = []
            for path, body in requests:
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                replies.append(await client.post(path, content=content, headers={"content-type": "application/json"}))
            return replies

    return run(go())


def latency_counts(app: Any) -> dict[str, float]:
    """multibranch_request_latency_seconds_count per status."""
    out: dict[str, float] = {}
    for family in app.state.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "multibranch_request_latency_seconds_count":
                out[sample.labels["status"]] = sample.value
    return out


# ---- a real uvicorn server in a thread ------------------------------------------------------------


@contextlib.contextmanager
def uvicorn_thread(app: Any, server_class: type | None = None) -> Iterator[Any]:
    """uvicorn (or `server_class`, e.g. `multibranch serve`'s) serving `app` on a free loopback port,
    in a thread; yields the server (its port: `port_of(server)`); stops it on exit."""
    server = (server_class or uvicorn.Server)(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="info",
                                                             log_config=None, timeout_graceful_shutdown=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(3000):
            if server.started or not thread.is_alive():
                break
            thread.join(0.01)
        assert server.started
        yield server
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive()


def port_of(server: Any) -> int:
    return server.servers[0].sockets[0].getsockname()[1]


class Connection:
    """One HTTP/1.1 connection over a plain socket, so a test can tell whether the server kept it."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.reader = self.sock.makefile("rb")

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body); ConnectionError when the server has closed it."""
        head = f"{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        self.sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        status_line = self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection without an answer")
        headers = {}
        while (line := self.reader.readline().decode("latin-1").strip()):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(status_line.split()[1]), headers, self.reader.read(int(headers.get("content-length", 0)))

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


class Records(logging.Handler):
    """Log records of some loggers, with an Event set by the first whose message starts with one of
    `wanted`."""

    def __init__(self, *wanted: str):
        super().__init__(logging.DEBUG)
        self.wanted, self.records, self.seen = wanted, [], threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if record.getMessage().startswith(self.wanted):
            self.seen.set()


@pytest.fixture
def records(caplog) -> Iterator[Records]:
    """Records of the server's logger and uvicorn's, at INFO."""
    handler = Records("shutting down", "Shutting down")
    names = ("multibranch.serve", "uvicorn.error")
    for name in names:
        caplog.set_level(logging.INFO, logger=name)
        logging.getLogger(name).addHandler(handler)
    yield handler
    for name in names:
        logging.getLogger(name).removeHandler(handler)


def tracebacks(handler: Records) -> list[str]:
    return [r.getMessage() for r in handler.records if r.exc_info]


# ---- lone surrogates ------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/translate", {"texts": ["ka lo", "mi " + SURROGATE + " ne"]}, "texts[1] is not valid Unicode"),
    ("/translate", {"texts": [SURROGATE], "nbest": 2}, "texts[0] is not valid Unicode"),
    ("/classify", {"texts": ["ka lo", "ne", "\udfff"]}, "texts[2] is not valid Unicode"),
    ("/attention", {"text": "ka " + SURROGATE, "branch": 0}, "text is not valid Unicode"),
    ("/attention", {"text": "ka lo", "target": SURROGATE, "head": 1}, "target is not valid Unicode"),
])
def test_a_lone_surrogate_is_a_400_naming_the_text(path, body, message, translation_engine, classifier_engine):
    engine = classifier_engine if path == "/classify" else translation_engine
    app = create_app(engine)
    fine = {"text": "ka lo", "branch": 0} if path == "/attention" else {"texts": ["ka lo"]}
    refused, after = post_all(app, [(path, raw_json(body)), (path, fine)])
    assert refused.status_code == 400
    detail = refused.json()["detail"]
    assert detail.startswith(message) and "lone surrogate" in detail and "\\u" in detail
    assert after.status_code == 200  # the server goes on


def test_a_lone_surrogate_as_raw_utf8_bytes_is_the_same_400(translation_engine):
    """JSON decoders take the UTF-8 bytes of a surrogate (ED A0 80) as the surrogate itself."""
    app = create_app(translation_engine)
    [reply] = post_all(app, [("/translate", b'{"texts": ["ka", "\xed\xa0\x80"]}')])
    assert reply.status_code == 400 and reply.json()["detail"].startswith("texts[1] is not valid Unicode")


@pytest.mark.parametrize("body", [{"texts": SURROGATE}, {"texts": ["a"], SURROGATE: 1}, {SURROGATE: ["a"]}])
def test_a_422_echoing_a_lone_surrogate_is_still_a_422(body):
    """FastAPI's 422 echoes the input; a surrogate in it must not turn the answer into a 500."""
    app = create_app(StubEngine())
    [reply] = post_all(app, [("/translate", raw_json(body))], raise_app_exceptions=False)
    assert reply.status_code == 422
    assert "\\ud800" in reply.text


def test_over_uvicorn_a_lone_surrogate_leaves_no_traceback_and_the_connection_open(translation_engine, records):
    app = create_app(translation_engine)
    with uvicorn_thread(app) as server:
        connection = Connection(port_of(server))
        try:
            status, _, body = connection.request("POST", "/translate", raw_json({"texts": ["ka", SURROGATE]}))
            again, _, translated = connection.request("POST", "/translate", raw_json({"texts": ["ka lo"]}))
        finally:
            connection.close()
    assert status == 400 and json.loads(body)["detail"].startswith("texts[1] is not valid Unicode")
    assert again == 200 and len(json.loads(translated)["translations"]) == 1
    assert tracebacks(records) == []


def test_over_uvicorn_an_engine_failure_is_a_json_500_logged_once_and_the_connection_kept(records):
    stub = StubEngine()
    app = create_app(stub)
    with uvicorn_thread(app) as server:
        connection = Connection(port_of(server))
        try:
            status, _, body = connection.request("POST", "/translate", raw_json({"texts": ["boom"]}))
            again, _, translated = connection.request("POST", "/translate", raw_json({"texts": ["ok"]}))
        finally:
            connection.close()
    assert status == 500 and "log" in json.loads(body)["detail"]
    assert again == 200 and json.loads(translated) == {"translations": ["OK"]}
    assert [r.name for r in records.records if r.exc_info] == ["multibranch.serve"]
    assert latency_counts(app) == {"500": 1.0, "200": 1.0}


# ---- every response in the latency histogram ------------------------------------------------------


def test_every_response_is_counted_in_the_latency_histogram_by_its_status():
    stub = StubEngine()
    app = create_app(stub, ServeLimits(max_items=2, max_beam=4), static_dir=PAGE_DIR)

    async def go() -> list[httpx.Response]:
        async with serving(app, raise_app_exceptions=False) as client:
            def post(path: str, content: bytes) -> Any:
                return client.post(path, content=content, headers={"content-type": "application/json"})

            replies = [
                await post("/translate", raw_json({"texts": ["a"]})),                   # 200
                await post("/translate", b'{"texts": ["a"'),                            # 422: not JSON
                await post("/translate", raw_json({"texts": "a"})),                     # 422: schema
                await post("/translate", raw_json({"texts": ["a"], "beam": 9})),        # 422: ours
                await post("/translate", raw_json({"texts": ["a", "b", "c"]})),         # 413
                await post("/translate", b'{"texts": ["\xff"]}'),                       # 400: not UTF-8
                await post("/translate", raw_json({"texts": [SURROGATE]})),             # 400: lone surrogate
                await post("/classify", raw_json({"texts": ["a"]})),                    # 400: the other task
                await post("/attention", raw_json({"text": "a", "head": 0})),           # 400: no maps
                await post("/translate", raw_json({"texts": ["boom"]})),                # 500: engine failure
                await client.get("/translate"),                                         # 405
                await client.get("/no-such-page"),                                      # 404
                await client.post("/health"),                                           # 405
                await client.get("/"),                                                  # 200: the page
            ]
            for path in ("/health", "/info", "/metrics"):  # the monitoring's own requests are not counted
                assert (await client.get(path)).status_code == 200
            return replies

    replies = run(go())
    statuses = Counter(str(r.status_code) for r in replies)
    assert latency_counts(app) == statuses
    assert statuses == {"200": 2, "422": 3, "413": 1, "400": 4, "500": 1, "405": 2, "404": 1}


# ---- strict types, methods ------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/translate", {"texts": ["a"], "beam": True}, "beam"),
    ("/translate", {"texts": ["a"], "beam": "2"}, "beam"),
    ("/translate", {"texts": ["a"], "beam": 2.0}, "beam"),
    ("/translate", {"texts": ["a"], "nbest": True}, "nbest"),
    ("/classify", {"texts": ["a"], "probs": "yes"}, "probs"),
    ("/classify", {"texts": ["a"], "probs": 1}, "probs"),
    ("/attention", {"text": "ka lo", "layer": False, "branch": 0}, "layer"),
    ("/attention", {"text": "ka lo", "head": "1"}, "head"),
])
def test_request_fields_are_strictly_typed(path, body, field, translation_engine):
    engine = StubClassifier() if path == "/classify" else translation_engine if path == "/attention" else StubEngine()
    app = create_app(engine)
    [reply] = post_all(app, [(path, body)])
    assert reply.status_code == 422
    assert [error["loc"] for error in reply.json()["detail"]] == [["body", field]]
    assert getattr(engine, "calls", []) == []


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", "/translate", "POST"), ("GET", "/classify", "POST"), ("GET", "/attention", "POST"),
    ("PUT", "/translate", "POST"), ("POST", "/health", "GET, HEAD"), ("DELETE", "/info", "GET"),
])
def test_a_route_asked_with_another_method_is_405_with_the_page_mounted(method, path, allow):
    app = create_app(StubEngine(), static_dir=PAGE_DIR)

    async def go() -> tuple[httpx.Response, httpx.Response]:
        async with serving(app) as client:
            return await client.request(method, path), await client.get("/")

    reply, page = run(go())
    assert reply.status_code == 405 and reply.headers["allow"] == allow
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


@pytest.mark.parametrize("path", ["/nope", "/translate/", "/v1/translate", "/index.html"])
def test_a_post_to_no_route_is_404_with_the_page_mounted(path):
    app = create_app(StubEngine(), static_dir=PAGE_DIR)

    async def go() -> httpx.Response:
        async with serving(app) as client:
            return await client.post(path, json={"texts": ["a"]})

    reply = run(go())
    assert reply.status_code == 404 and reply.json() == {"detail": "Not Found"}


@pytest.mark.parametrize("headers", [{}, {"content-type": "application/x-www-form-urlencoded"},
                                     {"content-type": "text/plain"}])
def test_a_body_not_sent_as_json_is_415_naming_its_content_type(headers):
    app = create_app(StubEngine())

    async def go() -> httpx.Response:
        async with serving(app) as client:
            return await client.post("/translate", content=b'{"texts": ["a"]}', headers=headers)

    reply = run(go())
    assert reply.status_code == 415
    assert reply.json()["detail"].startswith("send the body as JSON with content-type: application/json")
    assert headers.get("content-type", "none") in reply.json()["detail"]


@pytest.mark.parametrize("path", ["/translate", "/attention"])
def test_a_body_that_is_not_utf8_is_400_naming_the_byte(path):
    app = create_app(StubEngine())
    body = b'{"texts": ["a\xff b"], "text": "a\xff b"}'  # Latin-1 bytes sent as JSON
    reply, = post_all(app, [(path, body)])
    assert reply.status_code == 400
    offset = body.index(b"\xff")
    assert reply.json()["detail"] == (f"the request body is not valid UTF-8: byte 0xff at offset {offset} "
                                      "(send JSON encoded in UTF-8)")
    assert latency_counts(app).get("400") == 1


def test_health_answers_head_for_load_balancers():
    app = create_app(StubEngine(), static_dir=PAGE_DIR)

    async def go() -> tuple[httpx.Response, httpx.Response]:
        async with serving(app) as client:
            return await client.head("/health"), await client.get("/health")

    head, get = run(go())
    assert head.status_code == get.status_code == 200 and head.content == b""


def test_a_default_beam_over_max_beam_is_refused_when_the_app_is_made(translation_engine):
    with pytest.raises(ConfigError, match=rf"default beam {translation_engine.default_beam} \(--beam\) is over "
                                          r"max_beam=1 \(--max-beam\)"):
        create_app(translation_engine, ServeLimits(max_beam=1))


# ---- Ctrl-C under load ----------------------------------------------------------------------------


def test_ctrl_c_under_load_answers_new_requests_503_with_retry_after_and_finishes_the_accepted(records):
    """One request in the engine, one queued, one client on an idle kept-alive connection; Ctrl-C.
    While the accepted two finish, requests on new connections and on the kept-alive one get 503 with
    Retry-After (not a refused or reset connection), /health says so; then the server stops."""
    stub = StubEngine()
    app = create_app(stub, ServeLimits(max_wait_ms=0, retry_after_s=2))
    results: dict[str, httpx.Response] = {}

    def post(name: str, port: int, text: str) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            results[name] = client.post("/translate", json={"texts": [text]})

    with uvicorn_thread(app, _server_class()) as server:
        try:
            port = port_of(server)
            kept = Connection(port)
            assert kept.request("POST", "/translate", raw_json({"texts": ["warm"]}))[0] == 200  # now idle, kept alive
            stub.release.clear()  # the engine blocks from now on
            stub.started.clear()
            running = threading.Thread(target=post, args=("running", port, "first"))
            running.start()
            assert stub.started.wait(30)  # "first" is in the engine
            queued = threading.Thread(target=post, args=("queued", port, "second"))
            queued.start()
            for _ in range(3000):  # "second" is accepted: in the queue
                if app.state.batcher.depth == 1:
                    break
                queued.join(0.01)
            assert app.state.batcher.depth == 1

            server.handle_exit(signal.SIGINT, None)  # what uvicorn's handler of Ctrl-C does
            assert records.seen.wait(30)  # the shutdown has begun

            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                fresh = client.post("/translate", json={"texts": ["late"]})
                health = client.get("/health")
            status, headers, body = kept.request("POST", "/translate", raw_json({"texts": ["late too"]}))
            kept.close()
            stub.release.set()
            running.join(30)
            queued.join(30)
        finally:
            stub.release.set()  # also when a check failed, so that the server can stop

    assert fresh.status_code == 503 and fresh.headers["retry-after"] == "2"
    assert "shutting down" in fresh.json()["detail"] and fresh.headers["connection"] == "close"
    assert health.status_code == 503 and health.json()["status"] == "shutting down"
    assert health.headers["retry-after"] == "2"
    assert status == 503 and headers["retry-after"] == "2" and "shutting down" in json.loads(body)["detail"]
    assert results["running"].json() == {"translations": ["FIRST"]}
    assert results["queued"].json() == {"translations": ["SECOND"]}
    assert stub.calls == [["warm"], ["first"], ["second"]]
    assert not server.force_exit
    assert app.state.metrics.registry.get_sample_value("multibranch_rejected_total", {"reason": "shutting_down"}) == 2
    assert tracebacks(records) == []


def test_a_second_ctrl_c_while_draining_stops_at_once(records):
    stub = StubEngine(block=True)
    app = create_app(stub, ServeLimits(max_wait_ms=0))
    outcome: dict[str, Any] = {}

    def post(port: int) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            try:
                outcome["reply"] = client.post("/translate", json={"texts": ["stuck"]})
            except httpx.TransportError as err:
                outcome["error"] = err

    try:
        with uvicorn_thread(app, _server_class()) as server:
            waiting = threading.Thread(target=post, args=(port_of(server),))
            waiting.start()
            assert stub.started.wait(30)
            server.handle_exit(signal.SIGINT, None)
            assert records.seen.wait(30)
            server.handle_exit(signal.SIGINT, None)  # the second Ctrl-C: stop without waiting for "stuck"
    finally:
        stub.release.set()
    waiting.join(30)
    assert server.force_exit
    assert any(r.getMessage().startswith("forced stop") for r in records.records)


# ---- numbers JSON cannot carry, large bodies, long texts -------------------------------------------


def strict_json(reply: httpx.Response) -> Any:
    """The answer's JSON, refusing NaN and Infinity (which no standard JSON reader takes)."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} in the answer")

    return json.loads(reply.text, parse_constant=refuse)


@pytest.mark.parametrize(("body", "message"), [
    (b'{"texts": ["A dog"], "lenpen": NaN}', "Extra inputs are not permitted"),
    (b'{"texts": ["A dog"], "temperature": 1e400}', '"temperature" applies only to "sampling": true'),
    (b'{"texts": ["A dog"], "sampling": true, "temperature": 1e400}', "temperature: expected a finite number, got inf"),
    (b'{"texts": ["A dog"], "sampling": true, "temperature": NaN}', "temperature: expected a finite number, got nan"),
    (b'{"texts": ["A dog"], "sampling": true, "top_p": -Infinity}', "top_p: expected a finite number, got -inf"),
    (b'{"texts": ["A dog"], "beam": Infinity}', "Input should be a valid integer"),
    (b'{"texts": [NaN]}', "Input should be a valid string"),
])
def test_nan_and_infinity_in_a_request_are_a_422_not_a_500(body, message):
    stub = StubEngine()
    [reply] = post_all(create_app(stub), [("/translate", body)], raise_app_exceptions=False)
    assert reply.status_code == 422
    assert message in str(strict_json(reply)["detail"])
    assert stub.calls == []


def test_a_422_shows_back_short_values_only():
    """A 100,000-character value of the wrong type is named, not echoed; a short one is shown."""
    long_value, short_value = "x" * 100_000, "yes"
    [long, short] = post_all(create_app(StubEngine()), [("/translate", {"texts": long_value}),
                                                        ("/translate", {"texts": ["a"], "alignment": short_value})])
    assert long.status_code == short.status_code == 422
    assert len(long.content) < 1000 and strict_json(long)["detail"][0]["loc"] == ["body", "texts"]
    assert strict_json(short)["detail"][0]["input"] == short_value


def test_a_body_over_max_body_bytes_is_a_413_whether_its_length_is_declared_or_not():
    stub = StubEngine()
    app = create_app(stub, ServeLimits(max_body_bytes=2048))
    body = json.dumps({"texts": ["a dog"] * 1000}).encode()

    async def go() -> list[httpx.Response]:
        async with serving(app) as client:
            declared = await client.post("/translate", content=body, headers={"content-type": "application/json"})

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
                for start in range(0, len(body), 500):
                    yield body[start:start + 500]

            streamed = await client.post("/translate", content=chunks(), headers={"content-type": "application/json"})
            small = await client.post("/translate", json={"texts": ["a dog"]})
            return [declared, streamed, small]

    declared, streamed, small = run(go())
    assert declared.status_code == streamed.status_code == 413
    assert declared.json()["detail"] == (f"the request body has {len(body)} bytes: this server takes at most 2048 "
                                         "(serve --max-body-bytes)")
    assert streamed.json()["detail"].startswith("the request body is over 2048 bytes")
    assert small.status_code == 200 and stub.calls == [["a dog"]]
    assert latency_counts(app)["413"] == 2


def test_over_uvicorn_a_declared_50_mb_body_is_refused_before_a_byte_of_it_is_sent():
    """The answer comes at once, while the client has sent only the headers: the server never waits for (or
    reads, or parses) the body."""
    with uvicorn_thread(create_app(StubEngine())) as server:
        with socket.create_connection(("127.0.0.1", port_of(server)), timeout=20) as sock:
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 50000000\r\n\r\n")
            reply = sock.makefile("rb").readline()
    assert reply.split()[1] == b"413"


def test_a_text_over_the_models_token_limit_is_truncated_or_with_long_inputs_refuse_a_413(translation_engine):
    import dataclasses

    from multibranch.serve.engine import TorchEngine

    engine = translation_engine
    refusing = TorchEngine(engine.model, engine.tokenizer, dataclasses.replace(engine.decode, long_inputs="refuse"),
                           kind="transformer")
    limit = engine.model.config.max_positions
    long_text = " ".join(["ka lo mi ne su"] * 20)
    count = engine.count_tokens([long_text])[0]
    assert count > limit
    body = {"texts": ["ka lo", long_text]}
    [truncated] = post_all(create_app(engine), [("/translate", body)])
    [refused] = post_all(create_app(refusing), [("/translate", body)])
    assert truncated.status_code == 200 and len(truncated.json()["translations"]) == 2
    assert refused.status_code == 413
    assert refused.json()["detail"] == f"texts[1] has {count} tokens (EOS included): the model takes at most {limit}"
    [drawn] = post_all(create_app(engine), [("/attention", {"text": long_text, "head": 0})])
    [not_drawn] = post_all(create_app(refusing), [("/attention", {"text": long_text, "head": 0})])
    assert drawn.status_code == 200
    assert not_drawn.status_code == 413
    assert not_drawn.json()["detail"] == f"text has {count} tokens (EOS included): the model takes at most {limit}"
