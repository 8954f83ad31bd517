"""Loopback load test of `multibranch serve`: throughput with many concurrent clients vs one at a time.

Starts `multibranch serve` on 127.0.0.1 (a free port) in a subprocess, waits for /health, then
1. sends `--sequential` requests one at a time (one client), and
2. lets `--clients` concurrent clients send `--requests` requests in all (each one sentence from
   `--src`, or generated text), stopping early after `--duration` seconds;
and reports sentences/s of each phase, p50/p99 latency, the status counts, 5xx other than the
deliberate 503 (queue full), and whether every accepted request got one translation per text;
3. (unless `--shutdown-warmup 0`) stops the server with SIGINT under load: `--clients` clients send
   without pause, SIGINT goes out once `--shutdown-warmup` of their requests are answered, and each
   client goes on until the server answers it 503 (shutting down), refuses its connection (the port
   is closed) or drops it; reported: the outcomes of the requests sent before and after the signal
   (status, refused: nothing was sent, reset: sent and never answered) and the server's exit code.
Otherwise the server is stopped with SIGINT after phase 2 (it finishes accepted requests first).
Bounded in requests and time.

    python bench/serve_load.py --ckpt runs/bench/quality/transformer-tiny/best.pt --src test.src
    python bench/serve_load.py --ckpt CKPT --duration 10 --name serve_load_smoke   # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "src"))

from bench.common import environment, save_results  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sentences(path: str | None, n: int) -> list[str]:
    if path:
        lines = [line.rstrip("\n") for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        return lines[:n] or sys.exit(f"{path}: no sentences")
    rng = random.Random(0)
    words = ["".join(rng.choice("aeioklmnprst") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 15))) for _ in range(n)]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def phase(client: Any, texts: list[str], clients: int, total: int, deadline: float) -> dict[str, Any]:
    """`clients` workers share `total` requests (one sentence each) until done or the deadline."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    unanswered = 0
    next_index = 0
    translated = 0

    async def worker() -> None:
        nonlocal next_index, unanswered, translated
        while next_index < total and time.monotonic() < deadline:
            text = texts[next_index % len(texts)]
            next_index += 1
            start = time.perf_counter()
            try:
                reply = await client.post("/translate", json={"texts": [text]})
            except Exception:  # connection error: counted, never silently lost
                statuses[-1] += 1
                continue
            statuses[reply.status_code] += 1
            if reply.status_code == 503:
                await asyncio.sleep(float(reply.headers.get("retry-after", "1")) / 10)
                continue
            latencies.append(time.perf_counter() - start)
            if reply.status_code == 200 and len(reply.json().get("translations", [])) == 1:
                translated += 1
            else:
                unanswered += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    return {
        "clients": clients, "requests_sent": sum(statuses.values()), "seconds": round(elapsed, 3),
        "sentences_per_s": round(translated / elapsed, 2) if elapsed else None,
        "latency_p50_ms": None if not latencies else round(1000 * percentile(latencies, 0.5), 2),
        "latency_p99_ms": None if not latencies else round(1000 * percentile(latencies, 0.99), 2),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "5xx_other_than_503": sum(v for k, v in statuses.items() if k >= 500 and k != 503),
        "connection_errors": statuses.get(-1, 0),
        "accepted_unanswered": unanswered,
    }


async def shutdown_phase(client: Any, texts: list[str], clients: int, warmup: int, server: Any,
                         deadline: float) -> dict[str, Any]:
    """SIGINT to `server` under load from `clients` clients (see the module's docstring): the outcome
    of every request, split by whether it was sent before or after the signal."""
    import httpx

    outcomes: dict[str, Counter[str]] = {"before": Counter(), "after": Counter()}
    answered = 0
    signalled = asyncio.Event()
    signal_time = 0.0
    index = 0

    async def worker() -> None:
        nonlocal answered, index, signal_time
        while time.monotonic() < deadline:
            text = texts[index % len(texts)]
            index += 1
            when = "after" if signalled.is_set() else "before"
            try:
                reply = await client.post("/translate", json={"texts": [text]})
            except httpx.ConnectError:  # refused: the port is closed, nothing was sent
                outcomes[when]["refused"] += 1
                return
            except httpx.TransportError as err:  # sent, then the connection was dropped: never answered
                outcomes[when][f"reset ({type(err).__name__})"] += 1
                return
            ok = reply.status_code == 200 and len(reply.json().get("translations", [])) == 1
            retry = " with Retry-After" if reply.status_code == 503 and "retry-after" in reply.headers else ""
            outcomes[when][f"{reply.status_code}{retry}" if reply.status_code != 200 or ok else "200 unanswered"] += 1
            answered += 1
            if answered >= warmup and not signalled.is_set():
                signal_time = time.perf_counter()
                server.send_signal(signal.SIGINT)
                signalled.set()
            if signalled.is_set() and reply.status_code == 503 and "shutting down" in reply.text:
                return  # told the server is going: a client retries elsewhere

    await asyncio.gather(*(worker() for _ in range(clients)))
    try:
        code = await asyncio.to_thread(server.wait, 60)
    except subprocess.TimeoutExpired:
        code = None
    after = outcomes["after"]
    return {
        "clients": clients, "warmup_answered": warmup,
        "sent_before_signal": dict(sorted(outcomes["before"].items())),
        "sent_after_signal": dict(sorted(after.items())),
        "after_signal_reset": sum(v for k, v in after.items() if k.startswith("reset")),
        "after_signal_refused": after.get("refused", 0),
        "after_signal_503_retry_after": after.get("503 with Retry-After", 0),
        "exit_seconds_after_signal": round(time.perf_counter() - signal_time, 3) if signal_time else None,
        "server_exit_code": code,
    }


async def load(args: argparse.Namespace, port: int, server: Any) -> dict[str, Any]:
    import httpx

    texts = sentences(args.src, 2000)
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60, limits=limits) as client:
        for _ in range(600):
            try:
                if (await client.get("/health")).status_code == 200:
                    break
            except httpx.TransportError:
                await asyncio.sleep(0.1)
        else:
            sys.exit("the server did not come up within 60 s")
        end = time.monotonic() + args.duration
        seq_end = time.monotonic() + args.duration / 3
        sequential = await phase(client, texts, 1, args.sequential, seq_end)
        concurrent = await phase(client, texts, args.clients, args.requests, end)
        metrics = (await client.get("/metrics")).text
        shutdown = None
        if args.shutdown_warmup:
            shutdown = await shutdown_phase(client, texts, args.clients, args.shutdown_warmup, server,
                                            time.monotonic() + 120)
    batches = [line for line in metrics.splitlines() if line.startswith("multibranch_batch_requests_")]
    latency = [line for line in metrics.splitlines() if line.startswith("multibranch_request_latency_seconds_count")]
    return {"sequential": sequential, "concurrent": concurrent, "batch_metrics": batches, "latency_counts": latency,
            "speedup": (round(concurrent["sentences_per_s"] / sequential["sentences_per_s"], 2)
                        if sequential["sentences_per_s"] else None),
            "shutdown_under_load": shutdown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", required=True, help="checkpoint (or CT2 directory with --engine ct2)")
    parser.add_argument("--engine", choices=["torch", "ct2"], default="torch")
    parser.add_argument("--src", help="source sentences, one per line (default: generated text)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=3000, help="requests of the concurrent phase")
    parser.add_argument("--sequential", type=int, default=200, help="requests of the one-at-a-time phase")
    parser.add_argument("--duration", type=float, default=300, help="stop both phases after this many seconds")
    parser.add_argument("--threads", type=int, default=1, help="engine threads")
    parser.add_argument("--serve-args", default="", help="extra `multibranch serve` flags, e.g. '--max-wait-ms 10'")
    parser.add_argument("--shutdown-warmup", type=int, default=200, metavar="N",
                        help="phase 3: SIGINT once N requests of --clients clients are answered (0: no phase 3)")
    parser.add_argument("--name", default="serve_load", help="bench/results/NAME.json")
    args = parser.parse_args()

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "multibranch", "serve", "--ckpt", args.ckpt, "--engine", args.engine,
               "--port", str(port), "--threads", str(args.threads), *args.serve_args.split()]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # its log
    try:
        result = asyncio.run(load(args, port, server))
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)  # clean shutdown: finish accepted requests, then exit
        try:
            result_code = server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            result_code = None
    result = {**result, "server_exit_code": result_code, "engine": args.engine, "ckpt": args.ckpt,
              "environment": environment(amp="none")}
    path = save_results(args.name, result)
    print(json.dumps(result, indent=2))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
