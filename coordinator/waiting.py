"""How the coordinator waits for jobs: woken by ZooKeeper watches, as long as it takes, stop-aware.

A job may be quiet for hours (its input paused), so an alignment or a hot-swap has no deadline
unless the operator asks for one. The consumers report every state change to their nodes, and
kazoo's DataWatch / ChildrenWatch recipes (which re-arm themselves after a connection loss or a
new session) wake the wait the moment one changes; a slow tick re-checks in case a change fell
between two reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from aligner.ledger import Ledger
from aligner.zk import StoppedError

log = logging.getLogger("aligner.coordinator")

TICK = 1.0
"""Seconds between re-checks when no watch fired."""

REPORT_AFTER = 30.0
"""A wait longer than this is logged (then every 10 minutes), so a stuck step is visible."""


class Waiter:
    def __init__(self, ledger: Ledger, stop: threading.Event | None = None) -> None:
        self.ledger = ledger
        self.stop = stop or ledger.stop
        ledger.stop_on(self.stop)
        self._wake = threading.Event()
        self._watched: set[str] = set()

    def watch(self, paths: Iterable[str], children: Iterable[str] = ()) -> None:
        """Wake waits when any of ``paths`` changes or ``children`` gain or lose a child (idempotent)."""
        for path in paths:
            if path not in self._watched:
                self._watched.add(path)
                self.ledger.zk.DataWatch(path, self._data_fired)
        for path in children:
            key = f"children:{path}"
            if key not in self._watched:
                self._watched.add(key)
                self.ledger.zk.ChildrenWatch(path, self._children_fired)

    def _data_fired(self, _data: Any, _stat: Any) -> None:
        self._wake.set()

    def _children_fired(self, _children: Any) -> None:
        self._wake.set()

    def until(self, cond: Callable[[], bool], what: str, timeout: float | None = None,
              on_wait: Callable[[], None] | None = None) -> None:
        """Return once ``cond`` holds. No deadline unless ``timeout`` (seconds) is given."""
        started = time.monotonic()
        reported = 0.0
        while True:
            self._wake.clear()
            if cond():
                return
            if on_wait is not None:
                on_wait()
            now = time.monotonic()
            if timeout is not None and now - started > timeout:
                raise TimeoutError(f"gave up after {timeout:.0f}s waiting for {what}")
            if now - started >= REPORT_AFTER and now - reported >= (600.0 if reported else 0.0):
                reported = now
                log.info("still waiting for %s (%.0fs)", what, now - started)
            self._wake.wait(TICK)
            if self.stop.is_set():
                raise StoppedError(f"stopped while waiting for {what}")
