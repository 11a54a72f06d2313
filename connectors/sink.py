"""Transactional subject sink: one Kafka transaction per epoch, every record stamped.

A producer owns private partitions of the subject. ``commit`` flushes, takes each partition's
range from the delivery reports, commits the Kafka transaction (the pre-commit) and then commits
the epoch in ZooKeeper (the commit point for aligned readers). A crash between the two leaves
Kafka records whose attempt ZooKeeper never names; readers drop them and the epoch is written
again by the next incarnation.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, Producer

from aligner.epochs import ranges_for
from aligner.errors import AlignerError
from aligner.ledger import Lease, Ledger
from aligner.metrics import EPOCHS_COMMITTED, LAST_EPOCH, RECORDS_SENT
from aligner.models import Range
from aligner.stamps import HEADER, Stamp
from connectors.kafka import QUIET, end_offsets

FaultHook = Callable[[str], None]
"""Called at named points of the commit ("before_kafka_commit", "after_kafka_commit",
"after_zk_commit"); tests use it to crash a producer exactly there."""


@dataclass(frozen=True)
class EpochCommit:
    epoch: int
    attempt: int
    ranges: dict[int, Range]
    records: int


def partitions_for(index: int, parallelism: int, partitions: int) -> list[int]:
    """Round-robin private partitions for producer ``index`` of ``parallelism``."""
    if not 0 <= index < parallelism <= partitions:
        raise AlignerError(f"producer {index} of {parallelism} needs 0 <= index < parallelism <= {partitions}")
    return list(range(index, partitions, parallelism))


class SinkProducer:
    """One parallel producer of a sink, writing exact epochs of one subject."""

    def __init__(
        self,
        ledger: Ledger,
        bootstrap: str,
        subject: str,
        sink: str,
        producer: str | int,
        partitions: Sequence[int],
        *,
        kafka_config: dict[str, Any] | None = None,
        fault: FaultHook | None = None,
    ) -> None:
        self.ledger = ledger
        self.bootstrap = bootstrap
        self.subject = subject
        self.sink = sink
        self.producer_id = str(producer)
        self.partitions = sorted(partitions)
        self._kafka_config = kafka_config or {}
        self._fault = fault or (lambda point: None)
        self._lease: Lease | None = None
        self._kp: Producer | None = None
        self._epoch: int | None = None
        self._writers = None
        self._rr = 0
        self._last: dict[int, int] = {}
        self._error: Exception | None = None
        self._count = 0
        self._metric = RECORDS_SENT.labels(subject, sink)

    # ---- lifecycle ----------------------------------------------------------------------------

    def open(self) -> SinkProducer:
        meta = self.ledger.subject(self.subject)
        self.topic = meta.topic
        self._lease = self.ledger.claim(
            self.subject, self.sink, self.producer_id, self.partitions,
            lambda: end_offsets(self.bootstrap, self.topic, self.partitions, committed_only=False),
        )
        self._kp = Producer({
            "bootstrap.servers": self.bootstrap,
            "transactional.id": f"aligner.{self.subject}.{self.sink}.{self.producer_id}",
            "linger.ms": 5,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
            "transaction.timeout.ms": 60000,
            **QUIET,
            **self._kafka_config,
        })
        self._kp.init_transactions(30)
        return self

    def close(self) -> None:
        if self._kp is not None:
            if self._epoch is not None:
                self.abort()
            self._kp.flush(10)
            self._kp = None

    def __enter__(self) -> SinkProducer:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def lease(self) -> Lease:
        if self._lease is None:
            raise AlignerError("producer is not open")
        return self._lease

    @property
    def next_epoch(self) -> int:
        """The epoch ``begin`` will open: one after the last epoch ZooKeeper holds for this producer."""
        return self.lease.next_epoch

    @property
    def attempt(self) -> int:
        return self.lease.node.incarnation

    # ---- epochs -------------------------------------------------------------------------------

    def begin(self) -> int:
        if self._epoch is not None:
            raise AlignerError(f"epoch {self._epoch} is still open; commit or abort it first")
        epoch = self.lease.next_epoch
        self._writers = self.ledger.ensure_epoch(self.subject, epoch, self._writers)
        assert self._kp is not None
        self._kp.begin_transaction()
        self._headers = [(HEADER, Stamp(self.sink, epoch, self.attempt).encode())]
        self._last = {}
        self._error = None
        self._count = 0
        self._epoch = epoch
        return epoch

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._error = KafkaException(err)
            return
        p, o = msg.partition(), msg.offset()
        if o > self._last.get(p, -1):
            self._last[p] = o

    def _pick(self, key: bytes | None) -> int:
        if key is not None:
            return self.partitions[zlib.crc32(key) % len(self.partitions)]
        self._rr += 1
        return self.partitions[self._rr % len(self.partitions)]

    def send(self, value: bytes | None, key: bytes | None = None, partition: int | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> None:
        if self._epoch is None:
            raise AlignerError("send outside an epoch: call begin() first")
        if partition is None:
            partition = self._pick(key)
        elif partition not in self.partitions:
            raise AlignerError(f"producer {self.producer_id} does not own partition {partition}")
        hdrs = self._headers if headers is None else self._headers + headers
        kp = self._kp
        assert kp is not None
        while True:
            try:
                kp.produce(self.topic, value, key, partition=partition, headers=hdrs, on_delivery=self._delivered)
                break
            except BufferError:
                kp.poll(0.05)
        self._count += 1
        if self._count % 2000 == 0:
            kp.poll(0)

    def commit(self, extra: Sequence[tuple[Any, ...]] = ()) -> EpochCommit:
        """Pre-commit in Kafka, then commit in ZooKeeper; returns the committed ranges.

        ``extra`` ZooKeeper ops (a job's input offsets and state) commit atomically with the epoch.
        """
        if self._epoch is None:
            raise AlignerError("no open epoch to commit")
        kp, epoch = self._kp, self._epoch
        assert kp is not None
        self._fault("before_kafka_commit")
        remaining = kp.flush(60)
        if remaining or self._error is not None:
            self.abort()
            raise AlignerError(f"epoch {epoch}: delivery failed ({self._error or f'{remaining} undelivered'}); aborted")
        ranges = ranges_for(self.lease.node.next_offsets, self._last)
        kp.commit_transaction(60)
        self._fault("after_kafka_commit")
        attempt = self.attempt
        self._lease = self.ledger.commit(self.lease, epoch, attempt, ranges, extra)
        self._epoch = None
        self._fault("after_zk_commit")
        self._metric.inc(self._count)
        EPOCHS_COMMITTED.labels(self.subject, self.sink).inc()
        LAST_EPOCH.labels(self.subject, self.sink, self.producer_id).set(epoch)
        return EpochCommit(epoch, attempt, ranges, self._count)

    def finish(self) -> int | None:
        """No more epochs from this producer: readers of the subject may drain and stop."""
        if self._epoch is not None:
            raise AlignerError("commit or abort the open epoch before finishing")
        return self.ledger.finish(self.lease)

    def abort(self) -> None:
        """Abort the open epoch; it will be written again under a new attempt number."""
        if self._kp is not None and self._epoch is not None:
            try:
                self._kp.abort_transaction(30)
            finally:
                self._epoch = None
                self._lease = self.ledger.reincarnate(self.lease)
