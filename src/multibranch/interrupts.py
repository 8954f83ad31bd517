"""What Ctrl-C and SIGTERM do to a command: stop it as cleanly as a KeyboardInterrupt, but never mid-save.

`sigterm_as_interrupt` (the CLI wraps every command in it) turns SIGTERM into `Terminated`, a
KeyboardInterrupt, so one cleanup path serves both signals. `deferred_interrupt` holds either signal back
while a block that must finish runs (a checkpoint save, a training update), then lets it act; a second
signal interrupts at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `timeout`, systemd, docker, SLURM) while the CLI runs: a KeyboardInterrupt, so
    every cleanup that a Ctrl-C runs runs for it too; the CLI ends it with exit status 143 (128 + 15)."""


@contextlib.contextmanager
def _handling(handlers: dict[int, Callable[[int, Any], None]], previous: dict[int, Any]) -> Iterator[None]:
    """`handlers` (signal -> handler) set for the block, the handlers they replace kept in `previous` and set
    back afterwards. Outside the main thread of the main interpreter, where Python cannot set a handler,
    nothing is set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        for signum, handler in handlers.items():
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main interpreter (nothing was set: the first call fails)
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def sigterm_as_interrupt(enabled: bool = True) -> Iterator[None]:
    """While the command runs, SIGTERM raises Terminated (a KeyboardInterrupt) in this process, so it stops
    as after a Ctrl-C: temporaries removed, outputs left whole. A child process started by forking (an
    encoding worker, a data loader worker) inherits the handler; there SIGTERM keeps its default effect.
    The previous handler is restored afterwards."""
    owner = os.getpid()

    def terminate(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked child: die of the signal, as without the handler
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated

    with _handling({signal.SIGTERM: terminate} if enabled else {}, {}):
        yield


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold back Ctrl-C (SIGINT), and SIGTERM where a handler for it is set (the CLI sets one), until the
    block is done, then let the signal act (KeyboardInterrupt, or the CLI's Terminated): a save that has
    started finishes (and stays whole) before the program stops. A second signal inside the block
    interrupts at once (`atomic_write` then removes its temporary, so the target stays as it was).
    Outside the main thread (where signal handlers cannot be set) the block runs unprotected."""
    pending: list[int] = []
    previous: dict[int, Any] = {}

    def hold(signum: int, frame: Any) -> None:
        if pending:
            _deliver(signum, previous.get(signum))
        pending.append(signum)

    held = {signum: hold for signum in (signal.SIGINT, signal.SIGTERM)
            if callable(signal.getsignal(signum))}  # a default or ignored signal stays so
    with _handling(held, previous):
        yield
    if pending:
        _deliver(pending[0], previous.get(pending[0]))


def _deliver(signum: int, handler: Any) -> None:
    """Run the handler that a held signal would have run (Python's SIGINT handler raises KeyboardInterrupt)."""
    if callable(handler):
        handler(signum, None)
    else:
        raise KeyboardInterrupt
