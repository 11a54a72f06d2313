"""Transactional subject sink: one Kafka transaction per epoch, every record stamped.

A producer owns private partitions of the subject. ``commit`` flushes, takes each partition's
range from the delivery reports, commits the Kafka transaction (the pre-commit) and then commits
the epoch in ZooKeeper (the commit point for aligned readers). A crash between the two leaves
Kafka records whose attempt ZooKeeper never names; readers drop them and the epoch is written
again by the next incarnation.

Hot path: only the last record of each partition in an epoch needs a delivery report (its offset
ends the range), so ``send`` holds back the latest record per partition and produces the one
before it without a Python callback. ``commit`` produces the held-back records with the callback,
then flushes. A failed delivery of any other record still fails the epoch: librdkafka puts the
transaction in an abortable error state and ``commit_transaction`` raises, which ``commit`` turns
into an abort, as it does for a failed delivery report.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import time_ns
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError

from aligner.connectors.kafka import QUIET, end_offsets
from aligner.epochs import ranges_for
from aligner.errors import AlignerError, EpochFailedError
from aligner.ledger import Lease, Ledger, PendingEpoch
from aligner.metrics import EPOCHS_COMMITTED, LAST_EPOCH, RECORDS_SENT
from aligner.models import Range
from aligner.stamps import HEADER, Stamp
from aligner.zk import StoppedError

FaultHook = Callable[[str], None]
"""Called at named points of the commit ("before_kafka_commit", "after_kafka_commit",
"after_zk_commit"); tests use it to crash a producer exactly there."""


@dataclass(frozen=True)
class EpochCommit:
    epoch: int
    attempt: int
    ranges: dict[int, Range]
    records: int


TRANSIENT: tuple[type[BaseException], ...] = (EpochFailedError, KafkaException, ConnectionLoss, SessionExpiredError,
                                             OperationTimeoutError, TimeoutError, ConnectionError)
"""Failures of the broker or ZooKeeper, not of the caller: the epoch is aborted and written again."""

_SLICE = 1.0
"""Seconds a blocking Kafka call waits before the stop event is checked again."""


def _retriable(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and (err.retriable() or err.code() == KafkaError._TIMED_OUT)


def _requires_abort(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.txn_requires_abort()


def partitions_for(index: int, parallelism: int, partitions: int) -> list[int]:
    """Round-robin private partitions for producer ``index`` of ``parallelism``."""
    if not 0 <= index < parallelism <= partitions:
        raise AlignerError(f"producer {index} of {parallelism} needs 0 <= index < parallelism <= {partitions}")
    return list(range(index, partitions, parallelism))


class _Producer(Producer):
    """The sink's Kafka producer: ``flush`` first hands over the records the sink holds back, so
    anyone flushing it (the sink, a test reaching for it) still gets every sent record to the broker."""

    def __init__(self, config: dict[str, Any], release: Callable[[], None]) -> None:
        super().__init__(config)
        self._release = release

    def flush(self, *args: Any) -> int:
        self._release()
        return super().flush(*args)


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
        self._owned = frozenset(self.partitions)
        self._accepting: frozenset[int] = frozenset()
        """The partitions ``send`` takes: the owned ones while an epoch is open."""
        self._kafka_config = kafka_config or {}
        self._fault = fault or (lambda point: None)
        self._lease: Lease | None = None
        self._kp: Producer | None = None
        self._produce: Callable[..., None] | None = None
        self._epoch: int | None = None
        self._writers = None
        self._pending: PendingEpoch | None = None
        self._rr = 0
        self._held: dict[int, tuple[Any, ...]] = {}
        """Per partition: the produce() arguments of the latest record sent and not yet produced."""
        self._counts: dict[int, int] = {}
        """Per partition: records sent in the open epoch."""
        self._last: dict[int, int] = {}
        self._error: Exception | None = None
        self._metric = RECORDS_SENT.labels(subject, sink)

    # ---- lifecycle ----------------------------------------------------------------------------

    def open(self) -> SinkProducer:
        meta = self.ledger.subject(self.subject)
        self.topic = meta.topic
        self._lease = self.ledger.claim(
            self.subject, self.sink, self.producer_id, self.partitions,
            lambda: end_offsets(self.bootstrap, self.topic, self.partitions, committed_only=False),
        )
        self._kp = _Producer({
            "bootstrap.servers": self.bootstrap,
            "transactional.id": f"aligner.{self.subject}.{self.sink}.{self.producer_id}",
            "linger.ms": 5,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
            "transaction.timeout.ms": 60000,
            **QUIET,
            **self._kafka_config,
        }, self._release_held)
        self._produce = self._kp.produce
        self._patiently(self._kp.init_transactions)  # fences an older incarnation's transaction
        return self

    def _patiently(self, call: Callable[[float], Any]) -> Any:
        """Run a blocking transactional call in slices until it answers: a paused or unreachable
        broker is waited for (retriable timeouts), a stop request ends the wait."""
        while True:
            try:
                return call(_SLICE)
            except KafkaException as exc:
                if not _retriable(exc):
                    raise
            if self.ledger.stopping():
                raise StoppedError(f"producer {self.producer_id} of {self.subject!r}: stopped waiting for Kafka")

    def close(self) -> None:
        """Release the producer without waiting on the broker: an open epoch's transaction is aborted
        if the broker answers at once, else left to the next incarnation, which fences it."""
        kp, self._kp, self._produce = self._kp, None, None
        if kp is None:
            return
        if self._epoch is not None:
            self._epoch = None
            self._held = {}
            with contextlib.suppress(Exception):
                kp.abort_transaction(_SLICE)
        with contextlib.suppress(Exception):
            kp.purge()
        kp.flush(0)

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
        # Round trip 1 goes out now and is awaited in commit(), overlapping the epoch's sends.
        self._pending = self.ledger.ensure_epoch_async(self.subject, epoch, self._writers)
        assert self._kp is not None
        self._kp.begin_transaction()
        self._headers = [(HEADER, Stamp(self.sink, epoch, self.attempt).encode())]
        self._held = {}
        self._counts = dict.fromkeys(self.partitions, 0)
        self._last = {}
        self._error = None
        self._epoch = epoch
        self._accepting = self._owned
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

    def _produce_one(self, args: tuple[Any, ...], on_delivery: Any = None) -> None:
        """Produce one held-back record (its produce() arguments), waiting for room in the queue."""
        produce = self._produce
        assert produce is not None
        if on_delivery is not None:
            args = (*args[:4], on_delivery, *args[5:])  # the "callback" parameter
        while True:
            try:
                produce(*args)
                return
            except BufferError:
                self._kp.poll(0.05)  # type: ignore[union-attr]
            except Exception as exc:
                # The record was accepted by an earlier send(): the epoch must not commit without it.
                self._error = exc
                raise

    def _release_held(self, report: bool = True) -> None:
        """Produce the held-back records, with the delivery report that gives each range its end."""
        held, self._held = self._held, {}
        for args in held.values():
            self._produce_one(args, self._delivered if report else None)

    def _refusal(self, partition: int) -> AlignerError:
        if self._epoch is None:
            return AlignerError("send outside an epoch: call begin() first")
        return AlignerError(f"producer {self.producer_id} does not own partition {partition}")

    def send(self, value: bytes | None, key: bytes | None = None, partition: int | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> None:
        if partition is None:
            if self._epoch is None:
                raise self._refusal(-1)
            partition = self._pick(key)
        elif partition not in self._accepting:  # the owned partitions while an epoch is open, else none
            raise self._refusal(partition)
        counts = self._counts
        n = counts[partition] + 1
        counts[partition] = n
        # produce()'s positional parameters: topic, value, key, partition, callback, on_delivery (an
        # alias, ignored when callback is given, even as None), timestamp (taken now: the record is
        # produced later), headers. Passing them by keyword costs ~0.4 us more per record.
        args = (self.topic, value, key, partition, None, None, time_ns() // 1_000_000,
                self._headers if headers is None else self._headers + headers)
        held = self._held
        previous = held.get(partition)
        held[partition] = args
        if previous is None:
            return
        try:  # the record sent before this one, without a delivery report
            self._produce(*previous)  # type: ignore[misc]
        except BufferError:
            self._produce_one(previous)  # waits for room in the queue
        except Exception as exc:
            self._error = exc  # accepted by an earlier send(): the epoch must not commit without it
            raise
        if n % 2000 == 0:
            self._kp.poll(0)  # type: ignore[union-attr]

    def commit(self, extra: Sequence[tuple[Any, ...]] = ()) -> EpochCommit:
        """Pre-commit in Kafka, then commit in ZooKeeper; returns the committed ranges.

        ``extra`` ZooKeeper ops (a job's input offsets and state) commit atomically with the epoch.
        """
        if self._epoch is None:
            raise AlignerError("no open epoch to commit")
        kp, epoch = self._kp, self._epoch
        assert kp is not None
        try:
            self._release_held()
        except Exception as exc:
            self._error = self._error or exc  # the epoch aborts below
        self._fault("before_kafka_commit")
        while kp.flush(_SLICE) and self._error is None:  # librdkafka fails a delivery after its own timeout
            if self.ledger.stopping():
                raise StoppedError(f"producer {self.producer_id} of {self.subject!r}: stopped during epoch {epoch}")
        if self._error is not None:
            self.abort()
            raise EpochFailedError(f"epoch {epoch} of {self.subject!r}: delivery failed ({self._error}); aborted")
        ranges = ranges_for(self.lease.node.next_offsets, self._last)
        counts = dict(self._counts)
        short = [p for p, n in counts.items() if n > ranges[p].end - ranges[p].start]
        if short:  # a missing delivery report: never commit a range that cannot hold what was sent
            self.abort()
            raise EpochFailedError(f"epoch {epoch}: ranges of partitions {short} cannot hold the records sent; aborted")
        if self._pending is not None:  # round trip 1, issued by begin(); done already on a retried commit
            try:
                self._writers = self.ledger.epoch_ensured(self._pending)
            except Exception:
                self.abort()  # the epoch node could not be made: nothing was committed anywhere
                raise
            self._pending = None
        try:
            self._patiently(kp.commit_transaction)
        except KafkaException as exc:
            if not _requires_abort(exc):
                raise
            self.abort()  # e.g. a record produced without a delivery report failed
            raise EpochFailedError(f"epoch {epoch}: Kafka refused the commit ({exc.args[0]}); aborted") from exc
        self._fault("after_kafka_commit")
        attempt = self.attempt
        self._lease = self.ledger.commit(self.lease, epoch, attempt, ranges, extra, counts=counts)
        self._epoch = None
        self._accepting = frozenset()
        self._fault("after_zk_commit")
        records = sum(counts.values())
        self._metric.inc(records)
        EPOCHS_COMMITTED.labels(self.subject, self.sink).inc()
        LAST_EPOCH.labels(self.subject, self.sink, self.producer_id).set(epoch)
        return EpochCommit(epoch, attempt, ranges, records)

    def finish(self) -> int | None:
        """No more epochs from this producer: readers of the subject may drain and stop."""
        if self._epoch is not None:
            raise AlignerError("commit or abort the open epoch before finishing")
        return self.ledger.finish(self.lease)

    def abort(self) -> None:
        """Abort the open epoch; it will be written again under a new attempt number."""
        if self._kp is not None and self._epoch is not None:
            try:
                with contextlib.suppress(Exception):  # the epoch is being aborted anyway
                    self._release_held(report=False)  # the broker sees what it would without holding back
                self._patiently(self._kp.abort_transaction)
            finally:
                self._epoch = None
                self._accepting = frozenset()
                self._pending = None
                self._held = {}
                self._lease = self.ledger.reincarnate(self.lease)
