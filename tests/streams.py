"""In-process streams for alignment tests: an upstream generator and job workers on threads."""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from dataclasses import dataclass, field

from aligner.connectors.reader import EpochReader
from aligner.connectors.runtime import JobFunction, JobSpec
from aligner.connectors.runtime.worker import WorkerThread
from aligner.connectors.sink import SinkProducer
from aligner.embedded.stack import StackInfo
from aligner.ledger import Ledger
from tests import guard
from tests.helpers import json_value


@dataclass(eq=False)
class Generator:
    """Writes numbered records (``per_epoch`` an epoch) to a subject on a thread, then finishes it.

    How many epochs: ``epochs``; with ``until``, until it is set (at most ``epochs``); with ``hold``, until
    it is set and then ``epochs`` more, so a test gets that many epochs after its alignment whatever the
    machine's speed.

    Stoppable on every path: ``close()`` (or leaving its ``with`` block) sets a stop flag the loop checks,
    joins the thread with a bound and, should it be stuck in a ZooKeeper or broker call, closes its
    ZooKeeper session under it. Get one from the ``spawn`` fixture, which closes it whatever the test did.
    """

    stack: StackInfo
    root: str
    subject: str
    epochs: int
    per_epoch: int = 20
    pace: float = 0.03
    until: threading.Event | None = None
    """When given, keep writing (up to ``epochs``) until it is set, then finish."""
    hold: threading.Event | None = None
    """When given, keep writing until it is set (a test's alignment is done), then ``epochs`` more."""
    keys: int | None = None
    """When given, records are keyed by ``n % keys`` (so keys repeat), else each by its own number."""
    sent: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _ledger: Ledger | None = field(default=None, repr=False)
    _held_at: int | None = field(default=None, repr=False)

    def start(self) -> Generator:
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"generator-{self.subject}")
        guard.register(self)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            led = self._ledger = Ledger.connect(self.stack.zk, self.root)
            led.stop_on(self._stop)  # close() ends ZooKeeper and Kafka waits (an outage) at once
            try:
                parts = list(range(led.subjects.subject(self.subject).partitions))
                with SinkProducer(led, self.stack.kafka, self.subject, "gen", 0, parts) as p:
                    i = 0
                    while self._more(i):
                        i += 1
                        p.begin()
                        for _ in range(self.per_epoch):
                            p.send(json.dumps({"n": self.sent}).encode(),
                                   key=str(self.sent if self.keys is None else self.sent % self.keys).encode())
                            self.sent += 1
                        p.commit()
                        self._stop.wait(self.pace)
                    if not self._stop.is_set():
                        p.finish()
            finally:
                led.close()
        except BaseException as exc:  # surfaced by the test through .error / .finished()
            if not self._stop.is_set():  # a wait ended by close() is no error
                self.error.append(exc)
        finally:
            self.done.set()

    def _more(self, written: int) -> bool:
        if self._stop.is_set():
            return False
        if self.hold is not None:
            if not self.hold.is_set():
                return True
            if self._held_at is None:
                self._held_at = written
            return written < self._held_at + self.epochs
        if self.until is not None and self.until.is_set() and written > 0:
            return False
        return written < self.epochs

    def finished(self, timeout: float = 120.0) -> int:
        """Wait (a liveness bound, not a speed check) until it finished the subject; the records sent."""
        assert self.done.wait(timeout), f"generator of {self.subject} did not finish in {timeout:.0f}s"
        if self.error:
            raise self.error[0]
        return self.sent

    def owns(self, thread: threading.Thread) -> bool:
        return thread is self._thread

    def close(self, timeout: float = 30.0) -> None:
        """Stop writing (without finishing the subject unless it already did) and end the thread."""
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join(timeout)
        if self._thread.is_alive() and self._ledger is not None:
            with contextlib.suppress(Exception):
                self._ledger.close()  # stuck in a ZooKeeper call: fail it
            self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"generator of {self.subject} did not stop in {2 * timeout:.0f}s")

    def __enter__(self) -> Generator:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JobThread(WorkerThread):
    """One job worker on a thread, started at once. ``join`` expects it to end by itself (its inputs
    finished); ``close()`` (or the ``spawn`` fixture, or a ``with`` block) stops it on any path."""

    def __init__(self, stack: StackInfo, root: str, spec: JobSpec, fn: JobFunction, worker: int = 0) -> None:
        super().__init__(stack.zk, root, stack.kafka, spec, worker, fn)
        self._released = False
        guard.register(self)
        self.start()

    def join(self, timeout: float = 180.0) -> None:
        """Wait until the job ends by itself: a liveness bound, generous on a busy machine."""
        self._released = True
        assert self.finish(timeout), f"job worker {self.thread.name} did not finish in {timeout:.0f}s"
        assert not self.error, self.error

    def owns(self, thread: threading.Thread) -> bool:
        return thread is self.thread

    def close(self) -> None:
        """Stop the worker if it still runs and release its clients (once)."""
        if self._released:
            return
        self._released = True
        self.stop.set()
        self.finish(30)
        if self.thread.is_alive():
            raise RuntimeError(f"job worker {self.thread.name} did not stop in 60s")

    def __enter__(self) -> JobThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_all(ledger: Ledger, bootstrap: str, subject: str) -> list[tuple[int, dict]]:
    """(epoch, value) of every committed record of a subject."""
    last = ledger.epochs.frontier(subject)
    if last is None:
        return []
    first = ledger.subjects.epoch_numbers(subject)[0]
    with EpochReader(ledger, bootstrap) as reader:
        return [(r.epoch, json_value(r.value)) for r in reader.read(subject, first, last)]


def assert_exactly_once(outputs: list[tuple[int, dict]], inputs: int) -> None:
    """Every input number 0..inputs-1 has exactly one result."""
    seen = Counter(v["in"]["n"] for _, v in outputs)
    missing = [n for n in range(inputs) if seen[n] == 0]
    dup = {n: c for n, c in seen.items() if c > 1}
    dup_sample = dict(list(dup.items())[:10])
    assert not missing and not dup, f"lost {missing[:10]} (of {len(missing)}), duplicated {dup_sample}"
    assert len(seen) == inputs
