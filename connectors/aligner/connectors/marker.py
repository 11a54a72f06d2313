"""Epoch marker for topics written by outside producers.

It claims every partition of the subject and, each interval, commits one subject epoch whose
ranges end at the partitions' last stable offsets. Its epochs carry no stamp (attempt None):
the data was never stamped, so readers keep every record in range.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from aligner.connectors.kafka import FetchingConsumer, end_offsets, fetched_end_offsets
from aligner.connectors.sink import TRANSIENT
from aligner.ledger import Lease, Ledger
from aligner.models import Range, WritersNode
from aligner.zk import StoppedError

MARKER_SINK = "marker"

log = logging.getLogger(__name__)


class EpochMarker:
    def __init__(self, ledger: Ledger, bootstrap: str, subject: str, name: str = MARKER_SINK,
                 from_beginning: bool = True) -> None:
        self.ledger = ledger
        self.bootstrap = bootstrap
        self.subject = subject
        self.name = name
        self.from_beginning = from_beginning
        self._lease: Lease | None = None
        self._writers: tuple[WritersNode, int] | None = None
        self._stop: threading.Event | None = None

    def open(self) -> EpochMarker:
        meta = self.ledger.subjects.subject(self.subject)
        self.topic = meta.topic
        self.partitions = list(range(meta.partitions))

        self._consumer = FetchingConsumer(self.bootstrap)

        def start() -> dict[int, int]:
            if self.from_beginning:
                return end_offsets(self.bootstrap, self.topic, self.partitions, earliest=True)
            return self._ends()

        self._lease = self.ledger.claims.claim(self.subject, self.name, "0", self.partitions, start)
        return self

    def _ends(self, known: dict[int, int] | None = None) -> dict[int, int]:
        # As long as it takes: a slow broker (the embedded one slows with batches per partition) is
        # reported and waited for with longer fetch waits, never given up on; the stop flag ends the
        # wait. An unreachable broker fails the ListOffsets call: this epoch fails and run() retries it.
        return fetched_end_offsets(self._consumer, self.topic, self.partitions, self.bootstrap, stop=self._stop,
                                   known=known, component=f"marker of {self.subject}")

    def finish(self) -> int | None:
        """The outside producers are done: mark the subject finished so aligned readers drain and stop."""
        assert self._lease is not None, "open() first"
        return self.ledger.commits.finish(self._lease)

    def close(self) -> None:
        self._consumer.close()

    def mark(self) -> tuple[int, dict[int, Range]]:
        """Commit one epoch up to the current stable end of every partition."""
        assert self._lease is not None, "open() first"
        epoch = self._lease.next_epoch
        self._writers = self.ledger.commits.ensure_epoch(self.subject, epoch, self._writers)
        ends = self._ends(dict(self._lease.node.next_offsets))
        ranges = {p: Range(start=s, end=max(s, ends[p])) for p, s in self._lease.node.next_offsets.items()}
        self._lease = self.ledger.commits.commit(self._lease, epoch, None, ranges)
        return epoch, ranges

    def run(self, interval: float, stop: threading.Event, count: int | None = None,
            on_epoch: Callable[[int, dict[int, Range]], None] | None = None) -> int:
        """Mark every ``interval`` seconds until ``stop`` is set or ``count`` epochs are marked.

        Always on: a broker or ZooKeeper outage delays the next epoch (retried with backoff, the
        same epoch number: a half-done mark is finished, never doubled), and ``stop`` ends any wait.
        """
        self.ledger.stop_on(stop)
        self._stop = stop
        marked = failures = 0
        while not stop.is_set() and (count is None or marked < count):
            try:
                epoch, ranges = self.mark()
            except StoppedError:
                break
            except TRANSIENT as exc:
                failures += 1
                log.warning("marker of %s: epoch failed (%s); retrying", self.subject,
                            " ".join(str(exc).split()) or type(exc).__name__)
                stop.wait(min(0.2 * 2 ** min(failures, 5), 5.0))
                continue
            failures = 0
            marked += 1
            if on_epoch:
                on_epoch(epoch, ranges)
            if count is None or marked < count:
                stop.wait(interval)
        return marked
