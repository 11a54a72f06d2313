"""Run the console: the hub's reader thread and uvicorn, both stopped within seconds by SIGTERM or SIGINT."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator

import uvicorn

from aligner.coordinator.console.actions import Runner
from aligner.coordinator.console.app import Guard, create_app
from aligner.coordinator.console.hub import Hub
from aligner.errors import AlignerError
from aligner.ledger import Ledger

GRACE = 2.0
"""Seconds open pages get to close their streams when the console stops."""


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything starts: a port in use is one clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise AlignerError(f"cannot serve the console on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(sock: socket.socket, connect: Callable[[], Ledger], guard: Guard, runner_args: list[str],
          stop: threading.Event, min_gap: float = 1.0, interval: float = 5.0,
          ready: Callable[[], object] | None = None) -> None:
    """Serve until SIGTERM or SIGINT (uvicorn's handlers; ``stop`` is set with them)."""
    hub = Hub(min_gap=min_gap, interval=interval)

    def report(row: dict[str, object]) -> None:
        hub.action = row
        hub.publish()

    runner = Runner(runner_args, report)
    reader = threading.Thread(target=hub.run, args=(connect, stop), name="console-reader", daemon=True)
    reader.start()
    config = uvicorn.Config(create_app(hub, runner, guard, stop), log_level="warning", access_log=False,
                            timeout_graceful_shutdown=int(GRACE), lifespan="off")
    server = uvicorn.Server(config)

    def exiting(_sig: int, _frame: object) -> None:
        stop.set()  # first: the event streams end, so the graceful shutdown has nothing to wait for
        hub.wake()  # and the reader stops waiting for a change
        server.force_exit = server.should_exit  # a second signal: stop now
        server.should_exit = True

    @contextlib.contextmanager
    def signals() -> Iterator[None]:
        """uvicorn's own handlers re-raise SIGTERM once it has shut down (the process dies of the signal);
        a console asked to stop exits 0, as every long-running command here does."""
        previous = {sig: signal.signal(sig, exiting) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    server.capture_signals = signals  # type: ignore[method-assign]
    if ready is not None:
        ready()
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        hub.wake()
        runner.stop(grace=1.0)
        reader.join(GRACE)
