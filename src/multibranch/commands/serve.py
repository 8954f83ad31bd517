"""`multibranch serve`: an HTTP server (FastAPI + uvicorn) over one loaded translation model or classifier.

API: POST /translate {"texts": [...], "beam": N?, "nbest": N?} -> {"translations": [...]} (translation
models); POST /classify {"texts": [...], "probs": bool?} -> {"labels": [...], "probabilities": ...}
(classifiers); POST /attention (one attention map of one sentence, torch engine, translation models);
GET /health, /info, /metrics (Prometheus); a web page at / (translation, n-best, attention heat map;
labels and probabilities). Concurrent requests are micro-batched by one worker.
Binds 127.0.0.1 unless --host says otherwise. Ctrl-C / SIGTERM: stop accepting (requests arriving
meanwhile get 503 with Retry-After; the port stays open until the accepted requests are answered),
finish the accepted requests, exit as interrupted (status 130 after Ctrl-C); a second Ctrl-C while
shutting down stops at once, dropping what is not answered yet (one warning line, status 130).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

HELP = ("serve a translation model or a classifier over HTTP (a web page at /; POST /translate, /classify, "
        "/attention; /health, /info, /metrics), micro-batching requests")

logger = logging.getLogger("multibranch.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from multibranch.serve.limits import ServeLimits

    d = ServeLimits()
    parser.add_argument("--ckpt", required=True, metavar="PATH",
                        help="checkpoint file (--engine torch) or directory from `convert ct2` (--engine ct2)")
    parser.add_argument("--engine", choices=["torch", "ct2"], default="torch", help="decoder to run")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes it to the network)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (0: any free port)")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto", help="where to run the model")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads of the engine (unset: torch's choice)")
    parser.add_argument("--beam", type=int, metavar="N",
                        help="default beam size (unset: the checkpoint's; torch engine, translation models)")
    parser.add_argument("--precision", choices=["fp32", "int8"], default="fp32",
                        help="torch only: fp32, or int8 linear layers (CPU; faster, BLEU may move slightly)")
    group = parser.add_argument_group("limits and batching")
    group.add_argument("--max-items", type=int, default=d.max_items, metavar="N", help="texts per request (413)")
    group.add_argument("--max-chars", type=int, default=d.max_chars, metavar="N", help="characters per text (413)")
    group.add_argument("--max-total-chars", type=int, default=d.max_total_chars, metavar="N",
                       help="characters per request (413)")
    group.add_argument("--max-beam", type=int, default=d.max_beam, metavar="N", help="largest beam a request may ask")
    group.add_argument("--max-queue", type=int, default=d.max_queue, metavar="N",
                       help="requests waiting for the worker; beyond it 503 with Retry-After")
    group.add_argument("--batch-tokens", type=int, default=d.batch_tokens, metavar="N",
                       help="source tokens x beam gathered into one engine call")
    group.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms, metavar="MS",
                       help="how long the worker waits for more requests after the first")
    group.add_argument("--timeout", type=float, default=d.timeout_s, metavar="S", help="request timeout (504)")


def limits_from_args(args: argparse.Namespace):  # noqa: ANN201
    from multibranch.serve.limits import ServeLimits

    limits = ServeLimits(max_items=args.max_items, max_chars=args.max_chars, max_total_chars=args.max_total_chars,
                         max_queue=args.max_queue, batch_tokens=args.batch_tokens, max_wait_ms=args.max_wait_ms,
                         timeout_s=args.timeout, max_beam=args.max_beam)
    limits.validate()
    return limits


def _check_arguments(args: argparse.Namespace) -> None:
    from pathlib import Path

    from multibranch.cli import UserError

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: must be between 0 and 65535")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads {args.threads}: must be >= 1")
    if args.beam is not None and args.beam < 1:
        raise UserError(f"--beam {args.beam}: must be >= 1")
    path = Path(args.ckpt)
    if args.engine == "ct2" and not path.is_dir():
        raise UserError(f"--ckpt {args.ckpt}: --engine ct2 needs a directory written by `multibranch convert ct2`")
    if args.engine == "torch" and not path.is_file():
        raise FileNotFoundError(f"--ckpt {args.ckpt}: no such checkpoint file")
    if args.engine == "ct2" and args.precision != "fp32":
        raise UserError("--precision is for --engine torch; a CT2 directory has the quantization it was "
                        "converted with (`multibranch convert ct2 --quantization int8`)")
    if args.engine == "torch":
        from multibranch.device import resolve_device
        from multibranch.inference.precision import check_precision

        check_precision(args.precision, resolve_device(args.device))
    if args.engine == "ct2" and args.beam is not None:
        raise UserError("--beam is for --engine torch; the CT2 directory's decode settings are used "
                        "(requests may still ask for a beam)")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError("serve needs FastAPI and uvicorn: pip install 'multibranch[serve]'") from None
    _check_address(args.host, args.port)


def _check_address(host: str, port: int) -> None:
    """One clear error, before the model is loaded, when HOST:PORT cannot be bound (in use, no such
    address); the socket is closed again at once, so uvicorn binds it next."""
    import socket

    from multibranch.cli import UserError

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


def load_engine(args: argparse.Namespace):  # noqa: ANN201
    """The engine named by --engine, loaded once."""
    if args.engine == "ct2":
        from multibranch.serve.engine import Ct2Engine

        return Ct2Engine(args.ckpt, device="cpu" if args.device == "auto" else args.device, threads=args.threads or 1)
    from multibranch.serve.engine import load_torch_engine

    overrides = {} if args.beam is None else {"beam": args.beam}
    return load_torch_engine(args.ckpt, args.device, precision=args.precision, **overrides)


def build_server(args: argparse.Namespace):  # noqa: ANN201
    """The uvicorn server of `multibranch serve`: arguments checked, the engine loaded once, the API
    and the web page (PAGE_DIR at /) mounted; `.run()` serves until SIGINT/SIGTERM or `should_exit`."""
    import uvicorn

    from multibranch.serve.app import PAGE_DIR, create_app

    _check_arguments(args)
    limits = limits_from_args(args)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    engine = load_engine(args)
    app = create_app(engine, limits, static_dir=PAGE_DIR)
    return _server_class()(uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                          timeout_graceful_shutdown=None))


def _server_class() -> type:
    """uvicorn's Server, which on Ctrl-C / SIGTERM first drains the app (`app.state.batcher.drain()`:
    requests arriving get 503 with Retry-After while the accepted ones are answered, the port still
    open) and only then does uvicorn's shutdown (close the port, wait for open connections, the app's
    shutdown); uvicorn alone closes the port at once, so a client under load gets its connection
    refused or reset instead of a 503. One line instead of a traceback on a forced stop: a second
    Ctrl-C while shutting down makes uvicorn skip the app's shutdown (requests still queued are
    dropped), and the app's lifespan task is then cancelled as the loop closes, which uvicorn logs as
    a traceback."""
    import asyncio

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


def run(args: argparse.Namespace) -> int:
    server = build_server(args)
    if args.port:
        logger.info("serving %s (%s engine) on http://%s:%d", args.ckpt, args.engine, args.host, args.port)
    else:  # the port is chosen when uvicorn binds; it logs the address it got
        logger.info("serving %s (%s engine) on a free port of %s", args.ckpt, args.engine, args.host)
    server.run()
    return 130 if server.force_exit else 0  # 130: stopped by a second Ctrl-C, as a shell reports it
