"""How a job worker waits for input: as long as it takes, woken by ZooKeeper watches, stop-aware,
and visibly (a gauge, a log line, the consumer nodes behind ``aligner status``).

Streams go quiet every night, so no wait here has a deadline. A wait sleeps on one event that
one-shot ZooKeeper watches, commands and swap decisions set; at most one watch of ours is
outstanding per node (a quiet input would otherwise pile up watches), and a one-second tick
checks the stop flag.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from aligner.errors import StoppedError
from aligner.metrics import INPUT_WAIT
from aligner.models import now_ms

log = logging.getLogger(__name__)

WAIT_LOG_AFTER = 30.0
"""Seconds without input after which a worker says (once, then every 10 minutes) that it waits."""
WAIT_REPORT_AFTER = 5.0
"""Seconds of waiting before the consumer nodes say so (a brief gap between epochs is no news)."""


class Idle:
    def __init__(self, job: str, worker: int, report: Callable[[], None]) -> None:
        self.job = job
        self.worker = worker
        self._report = report
        """Writes the worker's consumer nodes (they carry ``reported_since``)."""
        self.wake = threading.Event()
        """Set by watches, commands and swap decisions: ends the current sleep."""
        self._armed: set[str] = set()
        self._lock = threading.Lock()
        self.since: float | None = None
        """Monotonic time since which the worker has had no input to read (None while reading)."""
        self._since_ms = 0
        self._logged = 0.0
        self._reported = False
        self._gauge = INPUT_WAIT.labels(job, str(worker))

    @property
    def reported_since(self) -> int | None:
        """Wall-clock ms since which the worker waits, once the wait is long enough to report."""
        return self._since_ms if self._reported else None

    def arm(self, path: str, arm: Callable[[Callable[[Any], None]], object]) -> None:
        """Keep exactly one one-shot watch of ours on ``path``: it wakes the worker and disarms."""
        with self._lock:
            if path in self._armed:
                return
            self._armed.add(path)

        def fired(_event: Any) -> None:
            with self._lock:
                self._armed.discard(path)
            self.wake.set()

        try:
            arm(fired)
        except BaseException:
            with self._lock:
                self._armed.discard(path)
            raise

    def sleep(self, stop: threading.Event, seconds: float) -> None:
        """Wait for a watch, a command or ``seconds`` (at most one); StoppedError once ``stop`` is set."""
        if stop.is_set():
            raise StoppedError(f"{self.job} worker {self.worker} stopped")
        self.wake.wait(min(seconds, 1.0))
        self.wake.clear()
        if stop.is_set():
            raise StoppedError(f"{self.job} worker {self.worker} stopped")

    def waiting(self, what: str) -> None:
        """Make a long wait visible: a gauge of seconds waiting, the consumer nodes, a log line."""
        now = time.monotonic()
        if self.since is None:
            self.since, self._since_ms, self._logged = now, now_ms(), 0.0
        waited = now - self.since
        self._gauge.set(waited)
        if waited >= WAIT_REPORT_AFTER and not self._reported:
            self._reported = True  # once per wait: `aligner status` computes the seconds itself
            self._report()
        if waited >= WAIT_LOG_AFTER and now - self._logged >= (600.0 if self._logged else 0.0):
            self._logged = now
            log.info("%s worker %d: waiting %.0fs for %s", self.job, self.worker, waited, what)

    def got_input(self) -> None:
        if self.since is not None:
            self.since = None
            self._gauge.set(0)
            if self._reported:
                self._reported = False
                self._report()

    def close(self) -> None:
        self._gauge.set(0)
