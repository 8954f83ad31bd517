"""`multibranch serve`: an HTTP server (FastAPI + uvicorn) over one loaded translation model (or an ensemble of
several, as `translate --ckpt A B` decodes it) or classifier; a `convert ct2` directory is detected as
`translate` detects it.

API: POST /translate {"texts": [...], "beam": N?, "nbest": N?, "sampling": bool?, "temperature", "top_k",
"top_p", "seed", "prefix": [...]?} -> {"translations": [...]} (translation models; sampling and prefixes as
`translate --sampling` / `--prefix` decode them); POST /classify {"texts": [...], "probs": bool?} -> {"labels": [...], "probabilities": ...}
(classifiers; a sentence-pair classifier takes {"pairs": [[a, b], ...]} instead of "texts"); POST /attention (one attention map of one sentence, torch engine, translation models);
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

HELP = ("serve a translation model or a classifier over HTTP (a web page at /; POST /translate, /classify, "
        "/attention; /health, /info, /metrics), micro-batching requests")

logger = logging.getLogger("multibranch.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from multibranch.serve.limits import ServeLimits

    d = ServeLimits()
    parser.add_argument("--ckpt", required=True, nargs="+", metavar="PATH",
                        help="checkpoint file or `convert export` directory; several: an ensemble of translation "
                             "models that decodes with the mean of the members' per-step probabilities, as "
                             "`translate` does (one vocabulary required); or one `convert ct2` directory "
                             "(decoded by CTranslate2)")
    parser.add_argument("--engine", choices=["torch", "ct2"],
                        help="decoder to run (unset: ct2 for a `convert ct2` directory, as `translate` detects it, "
                             "else torch)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes it to the network)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (0: any free port)")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto", help="where to run the model")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads of the engine (unset: torch's choice)")
    parser.add_argument("--beam", type=int, metavar="N",
                        help="default beam size (unset: the checkpoint's; torch engine, translation models)")
    parser.add_argument("--precision", choices=["fp32", "int8", "bf16", "fp16"], default="fp32",
                        help="torch only: fp32; int8 / bf16 linear layers on the CPU; bf16 / fp16 weights on CUDA "
                             "(faster, BLEU may move slightly)")
    parser.add_argument("--long-inputs", choices=["truncate", "refuse"],
                        help="a text over the model's token limit (max_positions): translated from its first "
                             "tokens (truncate, the default, as `translate`) or refused with 413 (refuse)")
    group = parser.add_argument_group("limits and batching")
    group.add_argument("--max-items", type=int, default=d.max_items, metavar="N", help="texts per request (413)")
    group.add_argument("--max-chars", type=int, default=d.max_chars, metavar="N", help="characters per text (413)")
    group.add_argument("--max-total-chars", type=int, default=d.max_total_chars, metavar="N",
                       help="characters per request (413)")
    group.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, metavar="N",
                       help="bytes of a request body; a larger one gets 413 before it is read whole or parsed")
    group.add_argument("--max-beam", type=int, default=d.max_beam, metavar="N", help="largest beam a request may ask")
    group.add_argument("--max-queue", type=int, default=d.max_queue, metavar="N",
                       help="requests waiting for the worker; beyond it 503 with Retry-After")
    group.add_argument("--batch-tokens", type=int, default=d.batch_tokens, metavar="N",
                       help="source tokens x beam gathered into one engine call")
    group.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms, metavar="MS",
                       help="how long the worker waits for more requests after the first")
    group.add_argument("--timeout", type=float, default=d.timeout_s, metavar="S", help="request timeout (504)")


# the limit options -> the ServeLimits fields they set
LIMIT_OPTIONS = {"max_items": "max_items", "max_chars": "max_chars", "max_total_chars": "max_total_chars",
                 "max_body_bytes": "max_body_bytes", "max_queue": "max_queue", "batch_tokens": "batch_tokens",
                 "max_wait_ms": "max_wait_ms", "timeout": "timeout_s", "max_beam": "max_beam"}


def limits_from_args(args: argparse.Namespace):  # noqa: ANN201
    """The ServeLimits of the options, each checked by the field's rules and named by its option."""
    from multibranch.config import check_value
    from multibranch.serve.limits import ServeLimits

    values = {field: check_value(ServeLimits, field, getattr(args, name), f"--{name.replace('_', '-')}")
              for name, field in LIMIT_OPTIONS.items()}
    limits = ServeLimits(**values)
    limits.validate()
    return limits


def engine_of(ckpt: list[str], engine: str | None) -> str:
    """The engine asked for, or (unset) the one the first --ckpt needs: ct2 for a `convert ct2` directory,
    detected as `translate` detects it, else torch."""
    from multibranch.tasks.translation.ct2 import is_ct2_directory

    if engine is not None:
        return engine
    return "ct2" if is_ct2_directory(ckpt[0]) else "torch"


def _check_arguments(args: argparse.Namespace) -> None:
    from pathlib import Path

    from multibranch.errors import UserError
    from multibranch.loading.model import check_ct2_options, check_paths

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: must be between 0 and 65535")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads {args.threads}: must be >= 1")
    if args.beam is not None:
        from multibranch.config import check_value
        from multibranch.experiment.decoding import DecodeConfig

        check_value(DecodeConfig, "beam", args.beam, "--beam")
        if args.max_beam is not None and args.beam > args.max_beam:
            raise UserError(f"--beam {args.beam}: over --max-beam {args.max_beam}, the largest beam a request may "
                            "ask; every request without a beam would be refused")
    args.engine = engine_of(args.ckpt, args.engine)
    check_paths(args.ckpt)
    if args.engine == "ct2" and len(args.ckpt) > 1:
        raise UserError("--engine ct2 serves one `convert ct2` directory; an ensemble of several --ckpt needs the "
                        "torch engine")
    if args.engine == "ct2" and not Path(args.ckpt[0]).is_dir():
        raise UserError(f"--ckpt {args.ckpt[0]}: --engine ct2 needs a directory written by `multibranch convert ct2`")
    for path in args.ckpt if args.engine == "torch" else []:
        if not Path(path).exists():  # a directory: the loader says what it holds
            raise FileNotFoundError(f"--ckpt {path}: no such checkpoint file")
    if args.engine == "ct2":
        check_ct2_options(args.ckpt[0], {"precision": args.precision})
    if args.engine == "torch":
        from multibranch.device import resolve_device
        from multibranch.inference.precision import check_precision

        check_precision(args.precision, resolve_device(args.device))
    if args.engine == "ct2" and args.beam is not None:
        raise UserError(f"--beam {args.beam}: not with a CTranslate2 directory ({args.ckpt[0]}): its decode "
                        "settings are used (requests may still ask for a beam)")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError("serve needs FastAPI and uvicorn: pip install 'multibranch[serve]'") from None
    from multibranch.serve.server import check_address

    check_address(args.host, args.port)


def build_server(args: argparse.Namespace):  # noqa: ANN201
    """The uvicorn server of `multibranch serve`: arguments checked, the engine loaded once, the API
    and the web page mounted; `.run()` serves until SIGINT/SIGTERM or `should_exit`."""
    _check_arguments(args)
    limits = limits_from_args(args)
    from multibranch.serve.server import create_server, load_engine

    engine = load_engine(args.engine, args.ckpt if len(args.ckpt) > 1 else args.ckpt[0], args.device,
                         threads=args.threads, precision=args.precision, beam=args.beam,
                         long_inputs=args.long_inputs)
    return create_server(engine, limits, args.host, args.port)


def run(args: argparse.Namespace) -> int:
    from multibranch.inference.allocator import keep_freed_memory, loaded_objects_frozen

    keep_freed_memory()  # decoding reuses its freed step buffers instead of page-faulting them in again
    server = build_server(args)
    served = args.ckpt if isinstance(args.ckpt, str) else " ".join(args.ckpt)
    if args.port:
        logger.info("serving %s (%s engine) on http://%s:%d", served, args.engine, args.host, args.port)
    else:  # the port is chosen when uvicorn binds; it logs the address it got
        logger.info("serving %s (%s engine) on a free port of %s", served, args.engine, args.host)
    with loaded_objects_frozen():  # the loaded engine is never garbage: the collector need not walk it again
        server.run()
    return 130 if server.force_exit else 0  # 130: stopped by a second Ctrl-C, as a shell reports it
