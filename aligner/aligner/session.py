"""How long a one-shot command rides out a lost ZooKeeper connection.

The ledger's session retries forever, which is right for long-running components. A command
a user typed should give up instead: :class:`OutageLimit` sets the ledger's stop flag once the
connection has been down for ``limit`` seconds, which ends the command's pending ZooKeeper wait
with :class:`~aligner.errors.StoppedError`; ``gave_up`` tells the caller why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kazoo.client import KazooState

from aligner.ledger import Ledger
from aligner.models import now_ms


class OutageLimit:
    def __init__(self, ledger: Ledger, limit: float) -> None:
        self.limit = limit
        self.gave_up = threading.Event()
        """Set when the connection was down ``limit`` seconds and the ledger was stopped for it."""
        self._stop = ledger.stop
        self._closing = threading.Event()
        self._timers: list[threading.Timer] = []
        self._lock = threading.Lock()
        ledger.zk.add_listener(self._on_state)

    def close(self) -> None:
        """The session is being closed on purpose: its LOST state is no outage."""
        self._closing.set()
        self._cancel()

    def _cancel(self) -> None:
        with self._lock:
            while self._timers:
                self._timers.pop().cancel()

    def _expire(self) -> None:
        if not self._closing.is_set():
            self.gave_up.set()
            self._stop.set()

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED or self._closing.is_set():
            self._cancel()
            return
        with self._lock:
            if not self._timers:
                timer = threading.Timer(self.limit, self._expire)
                timer.daemon = True
                self._timers.append(timer)
                timer.start()


class Reachability:
    """Whether the ledger's session is connected, and since when it is not (epoch ms): for a component that
    keeps serving what it read last during an outage and says since when it has been cut off.

    ``on_change`` is called from kazoo's event thread on every change; it must not block."""

    def __init__(self, ledger: Ledger, on_change: Callable[[], object] | None = None) -> None:
        self.down_since: int | None = None if ledger.zk.connected else now_ms()
        self._on_change = on_change
        ledger.zk.add_listener(self._on_state)

    @property
    def connected(self) -> bool:
        return self.down_since is None

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self.down_since = None
        elif self.down_since is None:
            self.down_since = now_ms()
        if self._on_change is not None:
            self._on_change()
