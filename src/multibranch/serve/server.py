"""The HTTP server of `multibranch serve`: the engine loaded once, the app and web page mounted on
uvicorn, and uvicorn's Server with one line instead of a traceback on a forced stop.

    check_address(host, port)                     # before the model loads: can HOST:PORT be bound?
    engine = load_engine("torch", ckpt, "auto")   # or "ct2" with a `convert ct2` directory
    server = create_server(engine, limits, host, port)
    server.run()                                  # until SIGINT/SIGTERM or server.should_exit
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import torch

from multibranch.errors import UserError
from multibranch.serve.app import PAGE_DIR, create_app
from multibranch.serve.engine import Ct2Engine, load_torch_engine
from multibranch.serve.limits import ServeLimits

logger = logging.getLogger("multibranch.serve")


def check_address(host: str, port: int) -> None:
    """One clear error, before the model is loaded, when HOST:PORT cannot be bound (in use, no such
    address); the socket is closed again at once, so uvicorn binds it next."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise UserError(f"--host {host}: {error.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            probe.bind(address)
        except OSError as error:
            raise UserError(f"--port {port} on {host}: cannot listen there ({error.strerror})") from None


def load_engine(engine: str, ckpt: str | list[str], device: str, threads: int | None = None,
                precision: str = "fp32", beam: int | None = None, long_inputs: str | None = None) -> Any:
    """The engine `engine` ("torch": a checkpoint, or a list of them for an ensemble; "ct2": a `convert
    ct2` directory), loaded once. `threads` sets torch's CPU threads (and the CT2 engine's; default 1 there);
    `beam` (torch) and `long_inputs` replace the decode settings' (None: keep them)."""
    if threads is not None:
        torch.set_num_threads(threads)
    inputs = {} if long_inputs is None else {"long_inputs": long_inputs}
    if engine == "ct2":
        assert isinstance(ckpt, str), "a CTranslate2 directory is served alone"
        return Ct2Engine(ckpt, device="cpu" if device == "auto" else device, threads=threads or 1, **inputs)
    overrides = {**inputs, **({} if beam is None else {"beam": beam})}
    return load_torch_engine(ckpt, device, precision=precision, **overrides)


def create_server(engine: Any, limits: ServeLimits, host: str, port: int) -> Any:
    """The uvicorn server over `engine` with the API and the web page (PAGE_DIR at /); `.run()` serves
    until SIGINT/SIGTERM or `should_exit`."""
    import uvicorn

    app = create_app(engine, limits, static_dir=PAGE_DIR)
    return server_class()(uvicorn.Config(app, host=host, port=port, log_level="info",
                                         timeout_graceful_shutdown=None))


def server_class() -> type:
    """uvicorn's Server, which on Ctrl-C / SIGTERM first drains the app (`app.state.batcher.drain()`:
    requests arriving get 503 with Retry-After while the accepted ones are answered, the port still
    open) and only then does uvicorn's shutdown (close the port, wait for open connections, the app's
    shutdown); uvicorn alone closes the port at once, so a client under load gets its connection
    refused or reset instead of a 503. One line instead of a traceback on a forced stop: a second
    Ctrl-C while shutting down makes uvicorn skip the app's shutdown (requests still queued are
    dropped), and the app's lifespan task is then cancelled as the loop closes, which uvicorn logs as
    a traceback."""
    import uvicorn

    class Server(uvicorn.Server):
        async def drain(self) -> None:
            """Until the accepted requests are answered or a second Ctrl-C (`force_exit`), whichever
            comes first (uvicorn sets the flag from its signal handler: checked every 0.1 s, as
            uvicorn's own shutdown does)."""
            batcher = getattr(getattr(self.config.app, "state", None), "batcher", None)
            if batcher is None or self.force_exit:
                return
            batcher.stop_accepting()
            logger.info("shutting down: new requests get 503 until the accepted ones are answered "
                        "(Ctrl-C again to stop at once)")
            drained = asyncio.ensure_future(batcher.drain())
            while not drained.done() and not self.force_exit:
                await asyncio.wait({drained}, timeout=0.1)
            drained.cancel()  # a forced stop: not waited for any more (the worker itself is shielded)

        def run(self, sockets: Any = None) -> None:
            error_log = logging.getLogger("uvicorn.error")
            was_disabled = error_log.disabled
            try:
                super().run(sockets)
            finally:
                error_log.disabled = was_disabled

        async def shutdown(self, sockets: Any = None) -> None:
            await self.drain()
            await super().shutdown(sockets)
            if self.force_exit:
                logger.warning("forced stop: requests not answered yet were dropped")
                logging.getLogger("uvicorn.error").disabled = True  # the cancelled lifespan's traceback

    return Server
