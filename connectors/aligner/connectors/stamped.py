"""The stamped transactional producer: the Kafka half of every sink (SinkProducer, the Spark writer).

One Kafka transaction per epoch; every record carries the stamp (sink, epoch, attempt) in its
headers, so readers keep only the attempt ZooKeeper names. The producer writes one or several
subjects in the same transaction, each on its own private partitions (a :class:`Lane` per subject;
the producer is itself the lane of its main subject): a job's output and its changelog subject
commit together or not at all. It knows nothing of ZooKeeper: its owner
(a sink) takes each lane's ranges from :meth:`StampedProducer.flush_epoch`, commits the Kafka
transaction (the pre-commit) and then commits the epoch through the ledger (the commit point).

Hot path: only the last record of each partition in an epoch needs a delivery report (its offset
ends the range), so ``send`` holds back the latest record per partition and produces the one
before it without a Python callback. ``flush_epoch`` produces the held-back records with the
callback, then flushes. A failed delivery of any other record still fails the epoch: librdkafka
puts the transaction in an abortable error state and ``commit_transaction`` raises, which the
producer turns into :class:`EpochFailedError` for its owner to abort, as for a failed delivery report.
"""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from time import time_ns
from typing import Any

from confluent_kafka import KafkaException, Producer

from aligner.connectors.kafka import producer_config, requires_abort, retriable
from aligner.connectors.watchdog import WARN_AFTER
from aligner.epochs import ranges_for
from aligner.errors import AlignerError, EpochFailedError, StoppedError
from aligner.keys import routes
from aligner.models import Range
from aligner.stamps import HEADER, Stamp

log = logging.getLogger(__name__)

SLICE = 1.0
"""Seconds a blocking Kafka call waits before the stop flag is checked again."""

_key_of = itemgetter(0)


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
class Written:
    """What one lane wrote in an epoch: its ranges (from where the epoch started) and counts."""

    ranges: dict[int, Range]
    counts: dict[int, int]
    last: dict[int, int]
    """The last delivered offset per partition (partitions without a record are absent)."""

    @property
    def records(self) -> int:
        return sum(self.counts.values())


def epoch_ranges(starts: Mapping[int, int], last: Mapping[int, int], counts: Mapping[int, int],
                 what: str) -> dict[int, Range]:
    """The ranges of an epoch; refuses (EpochFailedError) a range that cannot hold the records sent:
    a missing delivery report must never shorten an epoch."""
    ranges = ranges_for(starts, last)
    short = [p for p, n in counts.items() if n > ranges[p].end - ranges[p].start]
    if short:
        raise EpochFailedError(f"{what}: ranges of partitions {short} cannot hold the records sent")
    return ranges


class _Producer(Producer):
    """The Kafka producer: ``flush`` first hands over the records the lanes hold back, so anyone
    flushing it (the sink, a test reaching for it) still gets every sent record to the broker."""

    stale = False
    """A commit or abort of this producer timed out before the broker answered: it is replaced before the
    next transaction (see :meth:`StampedProducer._renew`)."""

    def __init__(self, config: dict[str, Any], release: Callable[[], None]) -> None:
        super().__init__(config)
        self._release = release

    def flush(self, *args: Any) -> int:
        self._release()
        return super().flush(*args)


class Lane:
    """One subject written by a :class:`StampedProducer`: its topic, private partitions and the
    records of the open epoch. ``send`` is the per-record hot path.

    Keep the attributes of a lane plus its subclasses (a SinkProducer is one) under 30: CPython
    3.11 reads attributes of larger instances through a slower path, measurably on ``send``."""

    def __init__(self, owner: StampedProducer, subject: str, partitions: Sequence[int]) -> None:
        self.owner = owner
        self.subject = subject
        self.topic = ""
        """The subject's Kafka topic, known once the producer starts."""
        self.partitions = sorted(partitions)
        self.accepting: frozenset[int] = frozenset()
        """The partitions ``send`` takes: the owned ones while an epoch is open, else none."""
        self.headers: list[tuple[str, bytes]] = []
        self.held: dict[int, tuple[Any, ...]] = {}
        """Per partition: the produce() arguments of the latest record sent and not yet produced."""
        self.counts: dict[int, int] = {}
        """Per partition: records sent in the open epoch."""
        self.last: dict[int, int] = {}
        self._produce: Callable[..., None] | None = None
        self._rr = 0
        self.routes: list[int] = routes(self.partitions, None)
        """Keyed records go to ``routes[crc32(key) % len(routes)]`` (:func:`aligner.keys.routes`)."""

    def _open_epoch(self, stamp: Stamp) -> None:
        self.headers = [(HEADER, stamp.encode())]
        self.held = {}
        self.counts = dict.fromkeys(self.partitions, 0)
        self.last = {}
        self.accepting = frozenset(self.partitions)

    def _stop_accepting(self) -> None:
        self.accepting = frozenset()
        self.held = {}

    def route(self, partitions: int | None) -> None:
        """Route keyed records by the subject's partition count: a key goes to its own partition
        (``crc32(key) % partitions``, :mod:`aligner.keys`) when this producer owns it, so it keeps its
        partition across versions of a job of any parallelism that divides the count."""
        self.routes = routes(self.partitions, partitions)

    def pick(self, key: bytes | None) -> int:
        """A keyed record goes to the owned partition its key hashes to; others round-robin."""
        if key is not None:
            table = self.routes
            return table[zlib.crc32(key) % len(table)]
        self._rr += 1
        return self.partitions[self._rr % len(self.partitions)]

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.owner.error = KafkaException(err)
            return
        p, o = msg.partition(), msg.offset()
        if o > self.last.get(p, -1):
            self.last[p] = o

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
                self.owner.kp.poll(0.05)
            except Exception as exc:
                # The record was accepted by an earlier send(): the epoch must not commit without it.
                self.owner.error = exc
                raise

    def _release(self, report: bool = True) -> None:
        """Produce the held-back records, with the delivery report that gives each range its end."""
        held, self.held = self.held, {}
        for args in held.values():
            self._produce_one(args, self._delivered if report else None)

    def _refusal(self, partition: int) -> AlignerError:
        if not self.partitions:
            return AlignerError(f"producer {self.owner.name} writes no partition of {self.subject!r} yet "
                                f"(a new version, until its hot-swap hands it the old version's)")
        if not self.accepting:
            return AlignerError("send outside an epoch: call begin() first")
        return AlignerError(f"producer {self.owner.name} does not own partition {partition} of {self.subject!r}")

    def send(self, value: bytes | None, key: bytes | None = None, partition: int | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> None:
        """Write one record in the open epoch (to ``partition``, or the one ``key`` picks)."""
        if partition is None:
            if not self.accepting:
                raise self._refusal(-1)
            partition = self.pick(key)
        elif partition not in self.accepting:  # the owned partitions while an epoch is open, else none
            raise self._refusal(partition)
        counts = self.counts
        n = counts[partition] + 1
        counts[partition] = n
        # produce()'s positional parameters: topic, value, key, partition, callback, on_delivery (an
        # alias, ignored when callback is given, even as None), timestamp (taken now: the record is
        # produced later), headers. Passing them by keyword costs ~0.4 us more per record.
        args = (self.topic, value, key, partition, None, None, time_ns() // 1_000_000,
                self.headers if headers is None else self.headers + headers)
        held = self.held
        previous = held.get(partition)
        held[partition] = args
        if previous is None:
            return
        try:  # the record sent before this one, without a delivery report
            self._produce(*previous)  # type: ignore[misc]
        except BufferError:
            self._produce_one(previous)  # waits for room in the queue
        except Exception as exc:
            self.owner.error = exc  # accepted by an earlier send(): the epoch must not commit without it
            raise
        if n % 2000 == 0:
            self.owner.kp.poll(0)

    def send_many(self, pairs: Iterable[tuple[bytes | None, bytes | None]]) -> int:
        """``send(value, key)`` for each ``(key, value)``; returns how many. The batch form of the hot path:
        the batch's partitions are picked first, so only its last record per partition is held back (``send``
        holds every record until the next one to its partition) and the others are produced in a plain loop
        (the aligned pipeline went from 0.61 to 0.68 of the raw loop). An
        unkeyed batch is spread in one contiguous run per partition, starting one partition further each call
        (sticky, as Kafka's own producers spread unkeyed records), not record by record. The records share one
        timestamp."""
        if not self.accepting:
            raise self._refusal(-1)
        batch = pairs if isinstance(pairs, list) else list(pairs)
        if not batch:
            return 0
        keys = list(map(_key_of, batch))
        ps = self._spread(len(batch)) if keys.count(None) == len(keys) else self._picks(keys)
        counts, held, n = self.counts, self.held, len(ps)
        seen = Counter(ps)
        for p, c in seen.items():
            counts[p] += c
        backwards = ps[::-1]
        last = sorted(n - 1 - backwards.index(p) for p in seen)
        for p in seen.keys() & held.keys():  # held back by an earlier call: no longer a partition's last
            self._produce_one(held.pop(p))
        topic, headers, ts, start = self.topic, self.headers, time_ns() // 1_000_000, 0
        for end in last:
            self._produce_run(batch, ps, start, end, ts)
            key, value = batch[end]
            held[ps[end]] = (topic, value, key, ps[end], None, None, ts, headers)  # as in send()
            start = end + 1
        return n

    def _picks(self, keys: list[bytes | None]) -> list[int]:
        """Each record's partition, as ``pick`` would choose it."""
        table, parts, crc32, rr = self.routes, self.partitions, zlib.crc32, self._rr
        n_table, n_parts = len(table), len(parts)
        ps = [table[crc32(key) % n_table] if key is not None else parts[(rr := rr + 1) % n_parts] for key in keys]
        self._rr = rr
        return ps

    def _spread(self, n: int) -> list[int]:
        """The partitions of ``n`` unkeyed records: contiguous runs of (nearly) equal size, one per partition."""
        parts = self.partitions
        self._rr += 1
        first = self._rr % len(parts)
        size, ps = -(-n // len(parts)), list[int]()
        for p in parts[first:] + parts[:first]:
            ps += [p] * min(size, n - len(ps))
        return ps

    def _produce_run(self, batch: list[tuple[bytes | None, bytes | None]], ps: list[int], start: int, end: int,
                     ts: int) -> None:
        """Produce ``batch[start:end]`` to partitions ``ps[start:end]``, without delivery reports, polling the
        producer every 2,000 records and waiting for room in its queue when it is full."""
        produce, topic, headers, kp = self._produce, self.topic, self.headers, self.owner.kp
        assert produce is not None
        i = start
        while i < end:
            stop = k = min(end, i + 2000)
            try:
                for k in range(i, stop):
                    key, value = batch[k]
                    produce(topic, value, key, ps[k], None, None, ts, headers)
            except BufferError:
                kp.poll(0.05)  # record k again once the queue has room
                i = k
                continue
            except Exception as exc:
                self.owner.error = exc  # accepted by this call: the epoch must not commit without it
                raise
            i = stop
            kp.poll(0)

    def _written(self, starts: Mapping[int, int], epoch: int) -> Written:
        counts = dict(self.counts)
        ranges = epoch_ranges(starts, self.last, counts, f"epoch {epoch} of {self.subject!r}")
        return Written(ranges, counts, dict(self.last))


class StampedProducer(Lane):
    """A transactional Kafka producer writing stamped epochs of one or several subjects.

    It owns ``partitions`` of ``subject`` (it is that subject's lane: ``send`` is a plain method
    call on the hot path) and, in the same transactions, the partitions ``also`` gives of further
    subjects (see :meth:`send_to`). ``stopping`` ends waits for an unreachable broker with
    StoppedError; without it they last as long as the outage.
    """

    def __init__(self, bootstrap: str, txn_id: str, subject: str, partitions: Sequence[int], *,
                 also: Mapping[str, Sequence[int]] | None = None, name: str = "producer",
                 kafka_config: Mapping[str, Any] | None = None, stopping: Callable[[], bool] | None = None) -> None:
        self.name = name
        super().__init__(self, subject, partitions)
        if subject in (also or {}):
            raise AlignerError(f"producer {name} writes {subject!r} already; it cannot be among the also subjects")
        self.bootstrap = bootstrap
        self._config = producer_config(bootstrap, txn_id, kafka_config)
        self.lanes: dict[str, Lane] = {subject: self}
        """Every subject written, the main one first."""
        self.lanes.update({s: Lane(self, s, parts) for s, parts in (also or {}).items()})
        self.error: Exception | None = None
        """The first failure of the open epoch's writes (a delivery report, a produce call)."""
        self.epoch: int | None = None
        """The epoch whose transaction is open."""
        self._stopping = stopping or (lambda: False)
        self._kp: _Producer | None = None

    # ---- lifecycle ----------------------------------------------------------------------------

    @property
    def kp(self) -> _Producer:
        if self._kp is None:
            raise AlignerError(f"producer {self.name} is not open")
        return self._kp

    def start(self, topics: Mapping[str, str], partitions: Mapping[str, int] | None = None) -> None:
        """Create the Kafka producer for the subjects' ``topics`` and fence any older incarnation's
        open transaction (same transactional id). ``partitions``: each subject's partition count, which
        keyed records are routed by (see :meth:`Lane.route`)."""
        self._kp = _Producer(self._config, self._release_held)
        for subject, lane in self.lanes.items():
            lane.topic = topics[subject]
            lane._produce = self._kp.produce
            if partitions is not None:
                lane.route(partitions[subject])
        self.patiently(lambda t: self.kp.init_transactions(t))

    def close(self) -> None:
        """Release the producer without waiting on the broker: an open epoch's transaction is aborted
        if the broker answers at once, else left to the next incarnation, which fences it."""
        kp, self._kp = self._kp, None
        if kp is None:
            return
        for lane in self.lanes.values():
            lane._stop_accepting()
            lane._produce = None
        if self.epoch is not None:
            self.epoch = None
            with contextlib.suppress(Exception):
                kp.abort_transaction(SLICE)
        with contextlib.suppress(Exception):
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

    def begin_epoch(self, epoch: int, stamps: Mapping[str, Stamp]) -> None:
        """Open the epoch's transaction; each subject's records carry its own stamp."""
        if self.epoch is not None:
            raise AlignerError(f"epoch {self.epoch} is still open; commit or abort it first")
        if self.kp.stale:
            self._renew()
        self.kp.begin_transaction()
        self.error = None
        for subject, lane in self.lanes.items():
            lane._open_epoch(stamps[subject])
        self.epoch = epoch

    def _release_held(self, report: bool = True) -> None:
        for lane in self.lanes.values():
            lane._release(report)

    def flush_epoch(self, starts: Mapping[str, Mapping[int, int]]) -> dict[str, Written]:
        """Get every record of the open epoch to the broker and return what each subject got, its
        ranges starting at ``starts``. Raises EpochFailedError when a write failed: the caller aborts."""
        epoch = self.epoch
        if epoch is None:
            raise AlignerError("no open epoch to commit")
        try:
            self._release_held()
        except Exception as exc:
            self.error = self.error or exc  # the epoch fails below
        kp = self.kp
        waiting = BrokerWait(self.name, f"epoch {epoch}'s records")
        while (left := kp.flush(SLICE)) and self.error is None:  # librdkafka fails a delivery after its own timeout
            if self._stopping():
                raise StoppedError(f"producer {self.name}: stopped during epoch {epoch}")
            waiting.still(f"{left} not delivered yet")
        waiting.answered()
        if self.error is not None:
            raise EpochFailedError(f"epoch {epoch} of producer {self.name}: delivery failed ({self.error})")
        return {subject: lane._written(starts[subject], epoch) for subject, lane in self.lanes.items()}

    def commit_transaction(self) -> None:
        """The pre-commit: commit the Kafka transaction, waiting out an unreachable broker. A transaction
        that can no longer commit raises EpochFailedError: the caller aborts."""
        epoch = self.epoch
        try:
            self.patiently(lambda t: self.kp.commit_transaction(t), ends_transaction=True)
        except KafkaException as exc:
            if not requires_abort(exc):
                raise
            raise EpochFailedError(f"epoch {epoch}: Kafka refused the commit ({exc.args[0]})") from exc
        self._end_epoch()

    def abort_transaction(self) -> None:
        """Abort the open epoch's transaction (its records carry an attempt nobody will name)."""
        if self._kp is None or self.epoch is None:
            return
        try:
            with contextlib.suppress(Exception):  # the epoch is being aborted anyway
                self._release_held(report=False)  # the broker sees what it would without holding back
            self.patiently(lambda t: self.kp.abort_transaction(t), ends_transaction=True)
        finally:
            self._end_epoch()

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

    def _end_epoch(self) -> None:
        self.epoch = None
        for lane in self.lanes.values():
            lane._stop_accepting()
