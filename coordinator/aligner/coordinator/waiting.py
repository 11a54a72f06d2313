"""How the coordinator waits for jobs: woken by ZooKeeper watches, as long as it takes, stop-aware.

A job may be quiet for hours (its input paused), so an alignment or a hot-swap has no deadline
unless the operator asks for one. The consumers report every state change to their nodes, and
ledger's watches (kazoo's DataWatch / ChildrenWatch recipes, which re-arm themselves after a
connection loss or a new session, see ``JobLedger.on_data_change``) wake the wait the moment one
changes. A slow tick notices the stop flag and re-checks conditions that read nodes nobody
watches (a subject's frontier); it is a backstop, not the way a wait learns of progress.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from aligner.ledger import Ledger
from aligner.zk import StoppedError

log = logging.getLogger(__name__)

TICK = 1.0
"""Seconds between re-checks when no watch fired."""

REPORT_AFTER = 30.0
"""A wait longer than this is logged (then every 10 minutes), so a stuck step is visible."""


class Waiter:
    def __init__(self, ledger: Ledger, stop: threading.Event | None = None) -> None:
        self.ledger = ledger
        self.jobs = ledger.jobs
        self.stop = stop or ledger.stop
        ledger.stop_on(self.stop)
        self._wake = threading.Event()
        self._watched: set[str] = set()
        self._deadline: tuple[float, float] | None = None
        """(monotonic deadline, the command's timeout) shared by every wait of one command."""

    @contextlib.contextmanager
    def within(self, timeout: float | None) -> Iterator[None]:
        """Every wait inside shares one deadline: a command's ``--timeout`` bounds the whole command, not
        each of its steps (an alignment that aborts and starts again, a hot-swap that aligns first)."""
        outer = self._deadline
        if timeout is not None and (outer is None or time.monotonic() + timeout < outer[0]):
            self._deadline = (time.monotonic() + timeout, timeout)
        try:
            yield
        finally:
            self._deadline = outer

    def watch(self, paths: Iterable[str], children: Iterable[str] = ()) -> None:
        """Wake waits when any of ``paths`` changes or ``children`` gain or lose a child (idempotent)."""
        for path in paths:
            if path not in self._watched:
                self._watched.add(path)
                self.jobs.on_data_change(path, self._wake.set)
        for path in children:
            key = f"children:{path}"
            if key not in self._watched:
                self._watched.add(key)
                self.jobs.on_children_change(path, self._wake.set)

    def watch_job(self, job: str, subjects: Iterable[str]) -> None:
        """Wake waits on every consumer report of ``job`` on ``subjects`` (idempotent)."""
        for subject in subjects:
            key = f"consumers:{job}/{subject}"
            if key not in self._watched:
                self._watched.add(key)
                self.jobs.watch_consumers(job, [subject], self._wake.set)

    def watch_swap(self, old_job: str) -> None:
        """Wake waits whenever the hot-swap node of ``old_job`` is written (idempotent)."""
        key = f"swap:{old_job}"
        if key not in self._watched:
            self._watched.add(key)
            self.jobs.watch_swap(old_job, self._wake.set)

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
            if self._deadline is not None and now > self._deadline[0]:
                raise TimeoutError(f"gave up after {self._deadline[1]:.0f}s waiting for {what}")
            if now - started >= REPORT_AFTER and now - reported >= (600.0 if reported else 0.0):
                reported = now
                log.info("still waiting for %s (%.0fs)", what, now - started)
            self._wake.wait(TICK)
            if self.stop.is_set():
                raise StoppedError(f"stopped while waiting for {what}")
