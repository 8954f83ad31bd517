"""`multibranch serve` end to end: a real uvicorn server on an ephemeral loopback port (in a thread),
the command in its own process stopped by Ctrl-C (once: graceful; twice: at once, in one line), the
command's argument errors, and the CTranslate2 engine through the same API."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import httpx
import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from multibranch.cli import main  # noqa: E402
from multibranch.serve.app import create_app  # noqa: E402
from multibranch.serve.engine import TorchEngine  # noqa: E402
from multibranch.serve.limits import ServeLimits  # noqa: E402
from tests.helpers.serve import READY_TIMEOUT_S, ServerProcess  # noqa: E402
from tests.helpers.translation import corpus_lines, translator_of  # noqa: E402

LINES = corpus_lines(6, seed=21)


def test_real_uvicorn_server_on_loopback(checkpoint):
    engine = TorchEngine.from_checkpoint(str(checkpoint), "cpu")
    app = create_app(engine, ServeLimits(max_wait_ms=5))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S  # a bound a loaded machine cannot miss
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.01)
        assert server.started
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        assert host == "127.0.0.1"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            assert client.get("/health").json()["status"] == "ok"
            replies = [client.post("/translate", json={"texts": [line]}) for line in LINES[:3]]
            info = client.get("/info").json()
    finally:
        server.should_exit = True
        thread.join(30)
    assert not thread.is_alive()
    reference = translator_of(str(checkpoint))
    assert [r.json()["translations"][0] for r in replies] == reference.translate(LINES[:3])
    assert info["decode"]["beam"] == reference.cfg.beam


@pytest.mark.parametrize(("argv", "message"), [
    (["--ckpt", "missing.pt"], "missing.pt"),
    (["--ckpt", "CKPT", "--port", "70000"], "--port 70000"),
    (["--ckpt", "CKPT", "--engine", "ct2"], "needs a directory"),
    (["--ckpt", "CKPT", "--max-queue", "0"], "--max-queue 0: must be >= 1"),
    (["--ckpt", "CKPT", "--timeout", "0"], "--timeout 0.0: must be > 0"),
    (["--ckpt", "CKPT", "--beam", "8", "--max-beam", "4"], "--beam 8: over --max-beam 4"),
])
def test_serve_argument_errors_are_one_line(argv, message, checkpoint, capsys):
    argv = [str(checkpoint) if a == "CKPT" else a for a in argv]
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("multibranch serve: error:") and message in err and "\n" not in err


def test_ct2_engine_through_the_api_equals_ctranslate2(checkpoint, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install '.[ct2]')")
    import sentencepiece as spm

    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.convert.ct2 import SETTINGS_FILE, export_ct2, max_decoding_length, translate_options
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.serve.engine import Ct2Engine

    directory = export_ct2(load_checkpoint(checkpoint), tmp_path / "ct2")
    settings = json.loads((Path(directory) / SETTINGS_FILE).read_text())
    decode = DecodeConfig(**settings["decode"])
    sp = spm.SentencePieceProcessor(model_file=str(Path(directory) / settings["tokenizer"]["src"]))
    direct = ctranslate2.Translator(str(directory), intra_threads=1)
    lines = [line for line in corpus_lines(60, seed=22) if len(sp.encode(line)) <= 12][:6]  # within 24 positions
    assert len(lines) >= 4
    expected = []
    for line in lines:  # one sentence at a time, each with its own length limit
        pieces = sp.encode(line, out_type=str)
        tokens = direct.translate_batch([pieces], max_decoding_length=max_decoding_length(decode, len(pieces)),
                                        **translate_options(decode))[0].hypotheses[0]
        expected.append(sp.decode_pieces(tokens[:-1] if tokens[-1] == "</s>" else tokens))

    app = create_app(Ct2Engine(str(directory)))

    async def go():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                replies = await asyncio.gather(*(client.post("/translate", json={"texts": [line, ""]})
                                                 for line in lines))
                return replies, (await client.get("/info")).json()

    replies, info = asyncio.run(go())
    assert [r.json()["translations"] for r in replies] == [[e, ""] for e in expected]
    assert info["engine"] == "ct2" and info["decode"]["beam"] == decode.beam


def test_a_port_in_use_is_one_line_before_the_model_is_loaded(checkpoint, capsys, monkeypatch):
    import socket

    loaded = []
    monkeypatch.setattr(TorchEngine, "from_checkpoint", classmethod(lambda cls, *a, **k: loaded.append(a)))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--ckpt", str(checkpoint), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("multibranch serve: error:") and f"--port {port}" in err and "\n" not in err
    assert not loaded


@pytest.mark.parametrize(("port", "expected"), [(0, "on a free port of 127.0.0.1"), (8123, "on http://127.0.0.1:8123")])
def test_serve_names_the_port_it_asked_for_never_port_zero(port, expected, monkeypatch, caplog):
    """With --port 0 the port is chosen when uvicorn binds (and uvicorn logs it): the command's own
    line must not announce a URL with port 0."""
    import argparse

    from multibranch.commands import serve

    class Server:
        ran = False
        force_exit = False

        def run(self) -> None:
            Server.ran = True

    monkeypatch.setattr(serve, "build_server", lambda args: Server())
    args = argparse.Namespace(ckpt="model.pt", engine="torch", host="127.0.0.1", port=port)
    with caplog.at_level("INFO", logger=serve.logger.name):
        assert serve.run(args) == 0
    assert Server.ran
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("serving model.pt"))
    assert line.endswith(expected) and ":0" not in line


@pytest.mark.parametrize(("settings", "message"), [
    ("{not json", "corrupted, not valid JSON"),
    ('{"decode": {}, "tokenizer": {}}', "incomplete or foreign settings"),
])
def test_ct2_engine_with_broken_settings_is_one_line(settings, message, tmp_path, capsys):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install '.[ct2]')")
    from multibranch.convert.ct2 import SETTINGS_FILE

    (tmp_path / SETTINGS_FILE).write_text(settings)
    assert main(["serve", "--engine", "ct2", "--ckpt", str(tmp_path), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("multibranch serve: error:") and message in err and "\n" not in err


@pytest.fixture
def start_server() -> Iterator[Callable[[list[str]], ServerProcess]]:
    """Starts server commands in their own processes; every one is ended when the test ends, however it ends."""
    started: list[ServerProcess] = []

    def start(command: list[str]) -> ServerProcess:
        started.append(ServerProcess(command))
        return started[-1]

    try:
        yield start
    finally:
        for server in started:
            server.stop()


def _start_serve(start_server: Callable[[list[str]], ServerProcess], ckpt: Path) -> tuple[ServerProcess, int]:
    """`multibranch serve --port 0` in its own process, ready (/health answers); (the process, the port it bound)."""
    server = start_server([sys.executable, "-m", "multibranch", "serve", "--ckpt", str(ckpt), "--port", "0",
                           "--device", "cpu", "--threads", "1"])
    seen = server.until("Uvicorn running on")
    port = int(re.search(r"127\.0\.0\.1:(\d+)", seen[-1]).group(1))
    server.wait_healthy(port)
    return server, port


def test_a_server_that_never_gets_ready_fails_the_test_and_is_ended(start_server):
    sleeper = start_server([sys.executable, "-c", "import time; time.sleep(600)"])
    with pytest.raises(AssertionError, match="no 'Uvicorn running on' from the server in 1 s"):
        sleeper.until("Uvicorn running on", timeout_s=1)
    sleeper.stop()
    assert sleeper.process.poll() is not None


def test_a_server_that_exits_before_it_is_ready_fails_at_once(start_server):
    started = time.monotonic()
    crashed = start_server([sys.executable, "-c", "import sys; print('bad config', file=sys.stderr); sys.exit(2)"])
    with pytest.raises(AssertionError, match=r"exited \(2\) before 'Uvicorn running on': bad config"):
        crashed.until("Uvicorn running on")
    with pytest.raises(AssertionError, match=r"exited \(2\) before /health answered"):
        crashed.wait_healthy(9)
    assert time.monotonic() - started < 60


def test_a_server_that_ignores_sigterm_is_killed():
    stubborn = ServerProcess([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); print('ready', file=sys.stderr); time.sleep(600)"])
    try:
        stubborn.until("ready")
        with mock.patch("tests.helpers.serve.STOP_TIMEOUT_S", 1.0):
            stubborn.stop()
        assert stubborn.process.returncode == -signal.SIGKILL
    finally:
        stubborn.stop()


def test_ctrl_c_finishes_cleanly_and_a_second_one_stops_at_once_in_one_line(checkpoint, start_server):
    # one Ctrl-C: graceful stop (the app's shutdown runs), then status 130 as for any interrupt
    server, port = _start_serve(start_server, checkpoint)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        assert client.post("/translate", json={"texts": LINES[:1]}).status_code == 200
    server.process.send_signal(signal.SIGINT)
    code, rest = server.rest()
    assert code == 130 and "Application shutdown complete" in rest
    assert "multibranch serve: interrupted" in rest and "Traceback" not in rest

    # a request still arriving keeps the graceful stop waiting; a second Ctrl-C then stops at once
    server, port = _start_serve(start_server, checkpoint)
    with socket.create_connection(("127.0.0.1", port)) as half_sent:
        half_sent.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100\r\nExpect: 100-continue\r\n\r\n")
        # the server answers "100 Continue" once the app asks for the body: the request is in progress
        half_sent.settimeout(60)
        interim = b""
        while b"\r\n\r\n" not in interim:
            interim += half_sent.recv(1024)
        assert interim.startswith(b"HTTP/1.1 100 "), interim
        half_sent.sendall(b"{\"texts\": ")
        server.process.send_signal(signal.SIGINT)
        server.until("Waiting for connections to close")
        server.process.send_signal(signal.SIGINT)
        code, rest = server.rest()
    assert code == 130 and "Application shutdown complete" not in rest
    assert "forced stop: requests not answered yet were dropped" in rest
    assert "Traceback" not in rest and "CancelledError" not in rest
