"""One subject a :class:`~aligner.connectors.stamped.StampedProducer` writes: its private partitions, the
stamp of the open epoch (if it has one) and the records held back for their delivery reports. ``send`` is the
per-record hot path.

Only the first and the last record of each partition in an epoch need a delivery report (their offsets bound
the range; see :func:`aligner.epochs.dense_ranges`), so ``send`` holds back the latest record per partition and
produces the one before it without a Python callback, except the epoch's first; :meth:`Lane.release` produces
the held-back records with the callback. The lane knows nothing
of transactions: its owner opens and ends them and collects the first failure of a write (``owner.error``).
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from time import time_ns
from typing import Any, Protocol

from confluent_kafka import KafkaException, Producer

from aligner.epochs import dense_ranges, ranges_for
from aligner.errors import AlignerError, EpochFailedError
from aligner.keys import routes
from aligner.models import Range
from aligner.stamps import HEADER, Stamp

_key_of = itemgetter(0)


class LaneOwner(Protocol):
    """What a lane needs of its producer: a name for errors, the Kafka client to poll, and where the open
    epoch's first failed write is recorded (so the epoch cannot commit without it)."""

    name: str
    error: Exception | None

    @property
    def kp(self) -> Producer: ...


@dataclass(frozen=True)
class Written:
    """What one lane wrote in an epoch: its ranges (from where the epoch started) and counts."""

    ranges: dict[int, Range]
    counts: dict[int, int]
    last: dict[int, int]
    """The last delivered offset per partition (partitions without a record are absent)."""
    first: dict[int, int] = field(default_factory=dict)
    """The first delivered offset per partition (partitions without a record are absent)."""

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


def without_stamps(written: Mapping[str, Written]) -> dict[str, Written] | None:
    """What an epoch written without stamps commits: each subject's dense ranges (from its first record to its
    last, :func:`aligner.epochs.dense_ranges`), or None when another writer's records lie among its own in
    some partition, so that the attempt must be aborted and written again with stamps."""
    dense = {}
    for subject, w in written.items():
        ranges = dense_ranges({p: r.start for p, r in w.ranges.items()}, w.first, w.last, w.counts)
        if ranges is None:
            return None
        dense[subject] = replace(w, ranges=ranges)
    return dense


class Lane:
    """One subject written by a producer: its topic, private partitions and the records of the open epoch.
    ``send`` is the per-record hot path.

    Keep the attributes of a lane under 30: CPython 3.11 reads attributes of larger instances through a
    slower path, measurably on ``send``."""

    def __init__(self, owner: LaneOwner, subject: str, partitions: Sequence[int]) -> None:
        self.owner = owner
        self.subject = subject
        self.topic = ""
        """The subject's Kafka topic, known once the producer starts."""
        self.partitions = sorted(partitions)
        self.accepting: frozenset[int] = frozenset()
        """The partitions ``send`` takes: the owned ones while an epoch is open, else none."""
        self.headers: list[tuple[str, bytes]] | None = None
        """The open epoch's stamp header, or None for an epoch written without stamps."""
        self.held: dict[int, tuple[Any, ...]] = {}
        """Per partition: the produce() arguments of the latest record sent and not yet produced."""
        self.counts: dict[int, int] = {}
        """Per partition: records sent in the open epoch."""
        self.last: dict[int, int] = {}
        self.first: dict[int, int] = {}
        self._delivered = self._reporter()
        self._produce: Callable[..., None] | None = None
        self._rr = 0
        self.routes: list[int] = routes(self.partitions, None)
        """Keyed records go to ``routes[crc32(key) % len(routes)]`` (:func:`aligner.keys.routes`)."""

    def attach(self, topic: str, produce: Callable[..., None]) -> None:
        """Write to ``topic`` through ``produce`` (the owner's Kafka producer's)."""
        self.topic = topic
        self._produce = produce

    def detach(self) -> None:
        """The owner's Kafka producer closed: nothing is accepted or produced until it attaches a new one."""
        self.stop_accepting()
        self._produce = None

    def begin(self, stamp: Stamp | None) -> None:
        """Open an epoch whose records carry ``stamp`` (None: no stamp; its ranges must then be dense)."""
        self.headers = None if stamp is None else [(HEADER, stamp.encode())]
        self.held = {}
        self.counts = dict.fromkeys(self.partitions, 0)
        self.last = {}
        self.first = {}
        self._delivered = self._reporter()
        self.accepting = frozenset(self.partitions)

    def stop_accepting(self) -> None:
        self.accepting = frozenset()
        self.held = {}

    def route(self, partitions: int | None) -> None:
        """Route keyed records by the subject's partition count: a key goes to its own partition
        (``crc32(key) % partitions``, :mod:`aligner.keys`) when this producer owns it, so it keeps its
        partition across versions of a job of any parallelism that divides the count."""
        self.routes = routes(self.partitions, partitions)

    def own(self, partitions: Sequence[int], count: int | None) -> None:
        """Write ``partitions`` from the next epoch on (taken over at a hot-swap), keys routed by ``count``."""
        self.partitions = sorted(partitions)
        self.route(count)

    def pick(self, key: bytes | None) -> int:
        """A keyed record goes to the owned partition its key hashes to; others round-robin."""
        if key is not None:
            table = self.routes
            return table[zlib.crc32(key) % len(table)]
        self._rr += 1
        return self.partitions[self._rr % len(self.partitions)]

    def _reporter(self) -> Callable[[Any, Any], None]:
        """The open epoch's delivery report callback. It writes into that epoch's own ``first`` and ``last``, and
        fails only that epoch: the report of an aborted epoch's record (purged by the abort, served at a later
        poll) changes nothing of the epoch written after it."""
        first, last, owner = self.first, self.last, self.owner

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                if first is self.first:
                    owner.error = KafkaException(err)
                return
            p, o = msg.partition(), msg.offset()
            if o > last.get(p, -1):
                last[p] = o
            if o < first.get(p, o + 1):
                first[p] = o

        return delivered

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

    def release(self, report: bool = True) -> None:
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
                self.headers if headers is None else (self.headers or []) + headers)
        held = self.held
        previous = held.get(partition)
        held[partition] = args
        if previous is None:
            return
        if n == 2:  # the epoch's first record to this partition: its delivery report starts the range
            self._produce_one(previous, self._delivered)
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
        fresh = [p for p in seen if counts[p] == 0]  # their first record of the epoch is in this batch
        for p in seen.keys() & held.keys():  # held back by an earlier call: no longer a partition's last
            self._produce_one(held.pop(p), self._delivered if counts[p] == 1 else None)  # reported if the first
        for p, c in seen.items():
            counts[p] += c
        backwards = ps[::-1]
        last = {n - 1 - backwards.index(p) for p in seen}
        firsts = {ps.index(p) for p in fresh} - last  # a partition's only record is held back, reported later
        topic, headers, ts, start = self.topic, self.headers, time_ns() // 1_000_000, 0
        for end in sorted(last | firsts):
            self._produce_run(batch, ps, start, end, ts)
            key, value = batch[end]
            args = (topic, value, key, ps[end], None, None, ts, headers)  # as in send()
            if end in last:
                held[ps[end]] = args
            else:
                self._produce_one(args, self._delivered)
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

    def written(self, starts: Mapping[int, int], epoch: int) -> Written:
        counts = dict(self.counts)
        ranges = epoch_ranges(starts, self.last, counts, f"epoch {epoch} of {self.subject!r}")
        return Written(ranges, counts, dict(self.last), dict(self.first))
