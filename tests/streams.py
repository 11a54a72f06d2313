"""In-process streams for alignment tests: an upstream generator and job workers on threads."""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field

from aligner.ledger import Ledger
from connectors.reader import EpochReader
from connectors.runtime import JobFunction, JobSpec, WorkerThread
from connectors.sink import SinkProducer
from coordinator.stack import StackInfo


@dataclass
class Generator:
    """Writes ``epochs`` epochs of ``per_epoch`` numbered records to a subject, then finishes it.

    ``gate`` (when given) is waited on before each epoch, so a test decides the pace by condition.
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
    """When given, write ``epochs`` epochs and more until it is set (a test's alignment is done)."""
    sent: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)

    def start(self) -> Generator:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            led = Ledger.connect(self.stack.zk, self.root)
            parts = list(range(led.subject(self.subject).partitions))
            stop = threading.Event()
            with SinkProducer(led, self.stack.kafka, self.subject, "gen", 0, parts) as p:
                i = 0
                while i < self.epochs or (self.hold is not None and not self.hold.is_set()):
                    if self.until is not None and self.until.is_set() and i > 0:
                        break
                    i += 1
                    p.begin()
                    for _ in range(self.per_epoch):
                        p.send(json.dumps({"n": self.sent}).encode(), key=str(self.sent).encode())
                        self.sent += 1
                    p.commit()
                    stop.wait(self.pace)
                p.finish()
            led.close()
        except BaseException as exc:  # surfaced by the test through .error
            self.error.append(exc)
        finally:
            self.done.set()


class JobThread(WorkerThread):
    """One job worker on a thread, started at once; ``join`` expects it to end by itself."""

    def __init__(self, stack: StackInfo, root: str, spec: JobSpec, fn: JobFunction, worker: int = 0) -> None:
        super().__init__(stack.zk, root, stack.kafka, spec, worker, fn)
        self.start()

    def join(self, timeout: float) -> None:
        assert self.finish(timeout), "job did not finish in time"
        assert not self.error, self.error


def read_all(ledger: Ledger, bootstrap: str, subject: str) -> list[tuple[int, dict]]:
    """(epoch, value) of every committed record of a subject."""
    last = ledger.frontier(subject)
    if last is None:
        return []
    first = ledger.epoch_numbers(subject)[0]
    with EpochReader(ledger, bootstrap) as reader:
        return [(r.epoch, json.loads(r.value)) for r in reader.read(subject, first, last)]


def assert_exactly_once(outputs: list[tuple[int, dict]], inputs: int) -> None:
    """Every input number 0..inputs-1 has exactly one result."""
    seen = Counter(v["in"]["n"] for _, v in outputs)
    missing = [n for n in range(inputs) if seen[n] == 0]
    dup = {n: c for n, c in seen.items() if c > 1}
    dup_sample = dict(list(dup.items())[:10])
    assert not missing and not dup, f"lost {missing[:10]} (of {len(missing)}), duplicated {dup_sample}"
    assert len(seen) == inputs
