"""The stamped transactional producer: the Kafka half of every sink (SinkProducer, the Spark writer).

One Kafka transaction per epoch; a stamped epoch's records carry the stamp (sink, epoch, attempt) in
their headers, so readers keep only the attempt ZooKeeper names. The producer writes one or several
subjects in the same transaction, each on its own private partitions (a :class:`~.lane.Lane` per
subject): a job's output and its changelog subject commit together or not at all. It is composed of
a Kafka producer and its lanes, as confluent-kafka's own exactly-once example composes a producer,
and it knows nothing of ZooKeeper: its owner (a sink) takes each lane's ranges from
:meth:`StampedProducer.flush_epoch`, commits the Kafka transaction (the pre-commit) and then commits
the epoch through the ledger (the commit point).

An epoch may be written without stamps (its owner's choice): it then commits only if each partition's
records lie at consecutive offsets (:func:`aligner.epochs.dense_ranges`), which the delivery reports of the
first and the last record show.

Hot path: ``send`` is the main lane's own bound method (no hop through the producer); see
:mod:`aligner.connectors.lane` for the held-back records. A failed delivery of a record produced
without a report still fails the epoch: librdkafka puts the transaction in an abortable error state
and ``commit_transaction`` raises, which the producer turns into :class:`EpochFailedError` for its
owner to abort, as for a failed delivery report.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import KafkaException, Producer

from aligner.connectors.kafka import producer_config, requires_abort, retriable
from aligner.connectors.lane import Lane, Written, epoch_ranges
from aligner.connectors.watchdog import WARN_AFTER
from aligner.errors import AlignerError, EpochFailedError, StoppedError
from aligner.stamps import Stamp

__all__ = ["SLICE", "BrokerWait", "Lane", "OpenEpoch", "ReleasingProducer", "StampedProducer", "Written",
           "epoch_ranges"]

log = logging.getLogger(__name__)

SLICE = 1.0
"""Seconds a blocking Kafka call waits before the stop flag is checked again."""


class BrokerWait:
    """One wait of a producer on the broker (its epoch's records, or the end of its transaction): when it
    lasts :data:`~aligner.connectors.watchdog.WARN_AFTER` seconds the producer says why it commits nothing
    (once), and says so again when the broker answers. A component cut off from Kafka but not from
    ZooKeeper otherwise waits without a word: librdkafka's own log is silenced (:data:`~.kafka.QUIET`) and
    a silent partition breaks no connection for a minute."""

    def __init__(self, producer: str, what: str, warn_after: float = WARN_AFTER) -> None:
        self.producer, self.what, self.warn_after = producer, what, warn_after
        self.since = time.monotonic()
        self.warned = False

    def still(self, detail: str) -> None:
        waited = time.monotonic() - self.since
        if not self.warned and waited >= self.warn_after:
            self.warned = True
            log.warning("producer %s: the broker has not answered for %.0fs (%s: %s); nothing is committed until "
                        "it does; still waiting", self.producer, waited, self.what, detail)

    def answered(self) -> None:
        if self.warned:
            log.warning("producer %s: the broker answered again after %.0fs", self.producer,
                        time.monotonic() - self.since)
            self.warned = False


@dataclass(frozen=True)
class OpenEpoch:
    """The epoch a producer began and its owner has not ended. Its Kafka transaction is open until
    ``precommitted``; a sink ends the epoch only once ZooKeeper committed it (the commit point), so an
    epoch whose ZooKeeper commit failed stays open, precommitted, until the sink aborts it."""

    number: int
    precommitted: bool = False
    stamped: bool = True
    """Whether its records carry stamps; without, its ranges must be dense (:func:`aligner.epochs.dense_ranges`)."""


class ReleasingProducer(Producer):
    """The Kafka producer: ``flush`` first hands over the records the lanes hold back, so anyone
    flushing it (the sink, the Spark writer, a test reaching for it) still gets every sent record to the broker."""

    stale = False
    """A commit or abort of this producer timed out before the broker answered: it is replaced before the
    next transaction (see :meth:`StampedProducer._renew`)."""

    def __init__(self, config: dict[str, Any], release: Callable[[], None]) -> None:
        super().__init__(config)
        self._release = release

    def flush(self, *args: Any) -> int:
        self._release()
        return super().flush(*args)


class StampedProducer:
    """A transactional Kafka producer writing stamped epochs of one or several subjects.

    It owns ``partitions`` of ``subject`` (its main lane: ``send`` and ``send_many`` are that lane's bound
    methods, a plain call on the hot path) and, in the same transactions, the partitions ``also`` gives of
    further subjects (see :meth:`send_to`). ``stopping`` ends waits for an unreachable broker with
    StoppedError; without it they last as long as the outage.
    """

    def __init__(self, bootstrap: str, txn_id: str, subject: str, partitions: Sequence[int], *,
                 also: Mapping[str, Sequence[int]] | None = None, name: str = "producer",
                 kafka_config: Mapping[str, Any] | None = None, stopping: Callable[[], bool] | None = None) -> None:
        if subject in (also or {}):
            raise AlignerError(f"producer {name} writes {subject!r} already; it cannot be among the also subjects")
        self.name = name
        self.subject = subject
        self.bootstrap = bootstrap
        self._config = producer_config(bootstrap, txn_id, kafka_config)
        self.main = Lane(self, subject, partitions)
        self.lanes: dict[str, Lane] = {subject: self.main}
        """Every subject written, the main one first."""
        self.lanes.update({s: Lane(self, s, parts) for s, parts in (also or {}).items()})
        self.send = self.main.send
        self.send_many = self.main.send_many
        self.error: Exception | None = None
        """The first failure of the open epoch's writes (a delivery report, a produce call)."""
        self.open_epoch: OpenEpoch | None = None
        """The epoch begun and not yet ended (the one field that says which epoch is open)."""
        self._stopping = stopping or (lambda: False)
        self._kp: ReleasingProducer | None = None

    # ---- lifecycle ----------------------------------------------------------------------------

    @property
    def kp(self) -> ReleasingProducer:
        if self._kp is None:
            raise AlignerError(f"producer {self.name} is not open")
        return self._kp

    @property
    def started(self) -> bool:
        """Whether the Kafka producer is open (between :meth:`start` and :meth:`close`)."""
        return self._kp is not None

    @property
    def epoch(self) -> int | None:
        """The open epoch (see :attr:`open`)."""
        return None if self.open_epoch is None else self.open_epoch.number

    @property
    def in_transaction(self) -> bool:
        """Whether the open epoch's Kafka transaction is still open (not yet committed in Kafka)."""
        return self.open_epoch is not None and not self.open_epoch.precommitted

    @property
    def counts(self) -> dict[int, int]:
        """Per partition of the main subject: records sent in the open epoch."""
        return self.main.counts

    @property
    def partitions(self) -> list[int]:
        return self.main.partitions

    @property
    def topic(self) -> str:
        return self.main.topic

    def start(self, topics: Mapping[str, str], partitions: Mapping[str, int] | None = None) -> None:
        """Create the Kafka producer for the subjects' ``topics`` and fence any older incarnation's
        open transaction (same transactional id). ``partitions``: each subject's partition count, which
        keyed records are routed by (see :meth:`Lane.route`)."""
        self._kp = ReleasingProducer(self._config, self._release_held)
        for subject, lane in self.lanes.items():
            lane.attach(topics[subject], self._kp.produce)
            if partitions is not None:
                lane.route(partitions[subject])
        self.patiently(lambda t: self.kp.init_transactions(t))

    def close(self) -> None:
        """Release the producer without waiting on the broker: an open epoch's transaction is aborted
        if the broker answers at once, else left to the next incarnation, which fences it."""
        kp, self._kp = self._kp, None
        aborting, self.open_epoch = self.in_transaction, None
        if kp is None:
            return
        for lane in self.lanes.values():
            lane.detach()
        if aborting:
            with contextlib.suppress(Exception):  # safe: an abort left undone is fenced by the next incarnation
                kp.abort_transaction(SLICE)
        with contextlib.suppress(Exception):  # safe: records left queued are in a transaction nobody commits
            kp.purge()
        kp.flush(0)

    def patiently(self, call: Callable[[float], Any], ends_transaction: bool = False) -> Any:
        """Run a blocking transactional call in slices until it answers: a paused or unreachable
        broker is waited for (retriable timeouts), a stop request ends the wait. A commit or abort
        (``ends_transaction``) that had to be waited for marks the producer stale (see :meth:`_renew`)."""
        waiting = BrokerWait(self.name, "the end of its transaction" if ends_transaction else "a transactional call")
        while True:
            try:
                answer = call(SLICE)
                waiting.answered()
                return answer
            except KafkaException as exc:
                if not retriable(exc):
                    raise
                if ends_transaction and self._kp is not None:
                    self._kp.stale = True
                waiting.still(str(exc.args[0]) if exc.args else type(exc).__name__)
            if self._stopping():
                raise StoppedError(f"producer {self.name}: stopped waiting for Kafka")

    # ---- epochs -------------------------------------------------------------------------------

    def lane(self, subject: str) -> Lane:
        try:
            return self.lanes[subject]
        except KeyError:
            raise AlignerError(f"producer {self.name} does not write subject {subject!r}; "
                               f"it writes {sorted(self.lanes)}") from None

    def send_to(self, subject: str, value: bytes | None, key: bytes | None = None, partition: int | None = None,
                headers: list[tuple[str, bytes]] | None = None) -> None:
        """``send`` to any subject of this producer (the main one or an ``also`` one), in the same transaction."""
        self.lane(subject).send(value, key, partition, headers)

    def begin_epoch(self, epoch: int, stamps: Mapping[str, Stamp | None]) -> None:
        """Open the epoch's transaction; each subject's records carry its own stamp (None: no stamps)."""
        if self.open_epoch is not None:
            raise AlignerError(f"epoch {self.open_epoch.number} is still open; commit or abort it first")
        if self.kp.stale:
            self._renew()
        self.kp.begin_transaction()
        self.error = None
        for subject, lane in self.lanes.items():
            lane.begin(stamps[subject])
        self.open_epoch = OpenEpoch(epoch, stamped=None not in stamps.values())

    def _release_held(self, report: bool = True) -> None:
        for lane in self.lanes.values():
            lane.release(report)

    def flush_epoch(self, starts: Mapping[str, Mapping[int, int]]) -> dict[str, Written]:
        """Get every record of the open epoch to the broker and return what each subject got, its
        ranges starting at ``starts``. Raises EpochFailedError when a write failed: the caller aborts."""
        if self.open_epoch is None or self.open_epoch.precommitted:
            raise AlignerError("no open epoch to commit")
        epoch = self.open_epoch.number
        try:
            self._release_held()
        except Exception as exc:  # recorded, and raised below as the epoch's EpochFailedError
            self.error = self.error or exc
        kp = self.kp
        waiting = BrokerWait(self.name, f"epoch {epoch}'s records")
        while (left := kp.flush(SLICE)) and self.error is None:  # librdkafka fails a delivery after its own timeout
            if self._stopping():
                raise StoppedError(f"producer {self.name}: stopped during epoch {epoch}")
            waiting.still(f"{left} not delivered yet")
        waiting.answered()
        if self.error is not None:
            raise EpochFailedError(f"epoch {epoch} of producer {self.name}: delivery failed ({self.error})"
                                   ) from self.error
        return {subject: lane.written(starts[subject], epoch) for subject, lane in self.lanes.items()}

    def commit_transaction(self, end: bool = True) -> None:
        """The pre-commit: commit the Kafka transaction, waiting out an unreachable broker. A transaction
        that can no longer commit raises EpochFailedError: the caller aborts. ``end=False`` keeps the epoch
        open, precommitted, until its owner's commit point calls :meth:`end_epoch`."""
        epoch = self.epoch
        try:
            self.patiently(lambda t: self.kp.commit_transaction(t), ends_transaction=True)
        except KafkaException as exc:
            if not requires_abort(exc):
                raise
            raise EpochFailedError(f"epoch {epoch}: Kafka refused the commit ({exc.args[0]})") from exc
        if end:
            self.end_epoch()
        elif self.open_epoch is not None:
            self.open_epoch = replace(self.open_epoch, precommitted=True)
            for lane in self.lanes.values():
                lane.stop_accepting()

    def abort_transaction(self) -> None:
        """Abort the open epoch's transaction (its records carry an attempt nobody will name) and end the
        epoch; a precommitted epoch only ends (its Kafka transaction committed: the owner takes a new attempt)."""
        if self._kp is None or self.open_epoch is None:
            return
        try:
            if self.in_transaction:
                with contextlib.suppress(Exception):  # safe: the epoch is being aborted anyway
                    self._release_held(report=False)  # the broker sees what it would without holding back
                self.patiently(lambda t: self.kp.abort_transaction(t), ends_transaction=True)
        finally:
            self.end_epoch()

    def end_epoch(self) -> None:
        """The open epoch is over (committed at its owner's commit point, or aborted)."""
        self.open_epoch = None
        for lane in self.lanes.values():
            lane.stop_accepting()

    def _renew(self) -> None:
        """Kafka's defence against a late write of a finished transaction (KIP-890: a new producer epoch per
        transaction, from Kafka 4.0 with Java clients) needs client support librdkafka lacks. After a commit or
        abort that timed out, a produce request of that transaction may still be in flight: a new producer with the same
        transactional id (InitProducerId bumps its epoch) makes the broker fence it. Done before the next
        transaction, so the commit that timed out reaches ZooKeeper without waiting for it."""
        topics = {s: lane.topic for s, lane in self.lanes.items()}
        self.close()
        self.start(topics)
        log.info("producer %s: its last commit or abort timed out before the broker answered; recreated to "
                 "fence late requests of that transaction", self.name)
