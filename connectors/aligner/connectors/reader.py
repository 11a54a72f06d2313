"""Exact epoch reader: the committed records of a span of epochs, the same records every time.

Each partition is read once across the whole span by an assigned (never subscribed) consumer.
A record counts when its offset lies in an epoch's range and its stamp is the attempt ZooKeeper
committed for that epoch. The reader stops on position, not on a record at ``end - 1``: commit
markers and dropped attempts occupy offsets too.

Stamps are checked per segment, after it is read: when the committed contribution recorded how
many records its attempt wrote in the partition and the segment's range holds exactly that many,
they are all that attempt's (partitions are private, and every record of the committed attempt lies
in its range), so no header is read. Any other record in the range (an aborted attempt the broker
leaked, a crash between the Kafka and the ZooKeeper commit, a zombie) makes the count differ, and
then every record's stamp is checked.

A read waits as long as it takes: fetches that come back empty (a paused broker, or the embedded
broker taking longer to find the data than the fetch may wait) are reported by the watchdog and
waited out with longer fetch waits. Only evidence that the log no longer holds the offsets raises
DataLossError: the broker says they are out of range, or its log now starts past them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition

from aligner.connectors.kafka import MAX_FETCH_WAIT_MS as MAX_WAIT
from aligner.connectors.kafka import FetchingConsumer, end_offsets, escalate_after, probe, stall_cause
from aligner.connectors.watchdog import CrawlWindow, Stall
from aligner.epochs import CommittedEpoch, Slice, check_retention
from aligner.errors import DataLossError, UndecodableRecordError
from aligner.ledger import Ledger
from aligner.metrics import RECORDS_DROPPED, RECORDS_READ
from aligner.stamps import stamp_of


@dataclass(frozen=True, slots=True)
class EpochRecord:
    epoch: int
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int

    def as_json(self, decode_json: bool, subject: str = "?") -> dict[str, Any]:
        """The record as plain data; with ``decode_json`` a value that is not JSON is a clear error
        naming where it is (outside producers can write anything), never a JSONDecodeError."""
        value: Any = self.value
        if value is not None:
            if decode_json:
                try:
                    value = json.loads(value)
                except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
                    detail = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
                    raise UndecodableRecordError(subject, self.epoch, self.partition, self.offset, detail) from None
            else:
                value = value.decode(errors="replace")
        return {
            "epoch": self.epoch, "partition": self.partition, "offset": self.offset,
            "key": None if self.key is None else self.key.decode(errors="replace"), "value": value,
        }


@dataclass(frozen=True, slots=True)
class Segment:
    """A non-empty slice of one partition in one epoch; plain data, so Spark can ship it to executors."""

    epoch: int
    slice: Slice


def segments_by_partition(committed: list[CommittedEpoch]) -> dict[int, list[Segment]]:
    by_partition: dict[int, list[Segment]] = {}
    for ce in committed:
        for p, sl in ce.slices.items():
            if not sl.empty:
                by_partition.setdefault(p, []).append(Segment(ce.epoch, sl))
    for segs in by_partition.values():
        segs.sort(key=lambda s: s.slice.start)
    return by_partition


class EpochReader:
    """Reads committed epochs of subjects; reusable, one Kafka consumer per reader."""

    def __init__(self, ledger: Ledger, bootstrap: str, *, stall_timeout: float = 30.0,
                 consumer_extra: dict[str, Any] | None = None) -> None:
        """``stall_timeout``: seconds without progress before a read warns (it goes on waiting)."""
        self.ledger = ledger
        self.stall_timeout = stall_timeout
        self._bootstrap = bootstrap
        self._extra = consumer_extra
        self._fetching = FetchingConsumer(bootstrap, consumer_extra)
        self._pool = [self._fetching]
        self._used: dict[int, float] = {}
        """When each pooled consumer last finished a partition (by id)."""

    def close(self) -> None:
        for fc in self._pool:
            fc.close()

    def _next_consumer(self) -> FetchingConsumer:
        """The pooled consumer idle longest; a new one (up to POOL) if every one finished a partition
        within its fetch wait. librdkafka keeps one fetch per broker in flight, and a consumer that read a
        partition to its end has one waiting there for up to the wait: reusing it at once would hold the
        next partition's first fetch back that long."""
        fc = min(self._pool, key=lambda f: self._used.get(id(f), 0.0))
        if time.monotonic() - self._used.get(id(fc), 0.0) < fc.wait_ms / 1000 and len(self._pool) < POOL:
            fc = FetchingConsumer(self._bootstrap, self._extra)
            self._pool.append(fc)
        return fc

    def __enter__(self) -> EpochReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def epochs(self, subject: str, first: int, last: int) -> list[CommittedEpoch]:
        """The committed epochs of the span; a clear error for any epoch not committed."""
        return self.ledger.epochs.committed_many(subject, first, last)

    def read_batches(self, subject: str, first: int, last: int) -> Iterator[tuple[int, int, list[Message]]]:
        """Yield (epoch, partition, messages) in partition then offset order; the fast path."""
        meta = self.ledger.subjects.subject(subject)
        by_partition = segments_by_partition(self.epochs(subject, first, last))
        read_counter, drop_counter = RECORDS_READ.labels(subject), RECORDS_DROPPED.labels(subject)
        log_start = end_offsets(self._bootstrap, meta.topic, list(by_partition), earliest=True) if by_partition else {}
        for partition in sorted(by_partition):
            segments = by_partition[partition]
            check_retention(subject, segments[0].epoch, partition, segments[0].slice.start, log_start[partition])
            fc = self._next_consumer()
            try:
                for epoch, kept, dropped in read_partition(fc, meta.topic, partition, segments,
                                                           self.stall_timeout):
                    read_counter.inc(len(kept))
                    if dropped:
                        drop_counter.inc(dropped)
                    if kept:
                        yield epoch, partition, kept
            finally:
                self._used[id(fc)] = time.monotonic()

    def read(self, subject: str, first: int, last: int | None = None) -> Iterator[EpochRecord]:
        last = first if last is None else last
        for epoch, partition, messages in self.read_batches(subject, first, last):
            for m in messages:
                yield EpochRecord(epoch, partition, m.offset(), m.key(), m.value(),  # type: ignore[arg-type]
                                  m.timestamp()[1])


def _stamped(messages: list[Message], stamp: bytes) -> list[Message]:
    """The messages carrying ``stamp``: the committed attempt's."""
    kept = []
    for m in messages:
        h: list[tuple[str, bytes]] | None = m.headers()  # type: ignore[assignment]
        if h is not None and (h[0][1] == stamp or stamp_of(h) == stamp):
            kept.append(m)
    return kept


def _settle(seg: Segment, in_range: list[Message], dropped: int) -> tuple[int, list[Message], int]:
    """A segment's (epoch, kept, dropped) from all the data records read inside its range."""
    sl = seg.slice
    if sl.only_committed(len(in_range)):
        return seg.epoch, in_range, dropped
    assert sl.stamp is not None
    kept = _stamped(in_range, sl.stamp)
    return seg.epoch, kept, dropped + len(in_range) - len(kept)


POOL = 4
"""Consumers an EpochReader keeps, so that reading partition after partition rarely waits (see
``EpochReader._next_consumer``)."""

_DATA_LOST = frozenset({KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET})
"""Fetch errors meaning the log no longer holds the offsets asked for; any other error is waited out."""


def _wanted(next_offset: int, end: int) -> int:
    """How many messages to ask ``consume`` for: what the rest of the range can hold.

    ``consume`` returns at its count or its timeout, and the newest range never fills a larger count (the
    broker reports the partition's end only with a later fetch), so asking for more waits out the timeout
    on every call. A commit marker takes the offset at a range's start, hence one less: a range whose start
    holds a record costs one more call, never a wait.
    """
    return min(10000, max(1, end - next_offset - 1))


class _Progress:
    """Where one partition read stands, for the watchdog: it waits, reports, and raises the fetch wait."""

    def __init__(self, fetching: FetchingConsumer, topic: str, partition: int, start: int, end: int,
                 stall_timeout: float) -> None:
        self.consumer, self.fetching = fetching.consumer, fetching
        self.topic, self.partition, self.end = topic, partition, end
        self.next = start
        """The next offset this read needs (records before it were handed over)."""
        self.stall = Stall("reader", topic, partition, warn_after=stall_timeout)
        self.checked = self.assigned = time.monotonic()
        self.error = ""
        self.crawl = CrawlWindow(self.checked, end - start)

    def polled(self, batch: list[Message]) -> None:
        self.crawl.polled(len(batch))
        if batch:
            self.stall.moved()
        else:
            self.stall.polled_empty()

    @property
    def wait_ms(self) -> int:
        return self.fetching.wait_ms

    def check(self) -> None:
        """Once a second: real evidence of loss raises; while stuck or crawling, a broker that answers gets a
        longer fetch wait, and a stall is reported."""
        now = time.monotonic()
        if now - self.checked < 1.0:
            return
        self.checked = now
        fetched = self.crawl.records > 0  # the broker answers fetches, whether or not the probe gets through
        crawl = False
        if self.crawl.due(now, escalate_after(self.wait_ms)):
            crawl = self.crawl.judge(now, self.end - self.next)
        if not crawl and self.stall.idle() < min(self.stall.warn_after, escalate_after(self.wait_ms or 500)):
            return
        marks = probe(self.consumer, self.topic, self.partition)
        if marks is not None and marks[0] > self.next:
            raise DataLossError(f"{self.topic}[{self.partition}]: committed epochs need offset {self.next} but the "
                                f"log now starts at {marks[0]}")
        # The probe queues behind the consumer's fetch on its connection: once the wait passes its timeout, a crawl's
        # records are the evidence that the broker answers.
        answered = marks is not None or fetched
        raised = None
        if answered and now - self.assigned >= escalate_after(self.wait_ms) and self.wait_ms < MAX_WAIT:
            raised = self.fetching.slower()
            self.consumer = self.fetching.consumer
            self.consumer.assign([TopicPartition(self.topic, self.partition, self.next)])
            self.assigned = now
            self.crawl.restart(now, self.end - self.next)
        wanted = f"wants offsets up to {self.end}, log end {'?' if marks is None else marks[1]}"
        cause = stall_cause(answered, self.wait_ms if raised is None else raised // 4, raised)
        self.stall.report(self.next, wanted, cause + (f"; last fetch error: {self.error}" if self.error else ""))


class _Segments:
    """The segments of one partition read, and the records of the current one (the per-batch hot path)."""

    def __init__(self, segments: list[Segment], progress: _Progress) -> None:
        self.segments, self.progress = segments, progress
        self.idx, self.seg = 0, segments[0]
        self.end = segments[-1].slice.end
        self.in_range: list[Message] = []
        self.dropped = 0
        self.done = False

    def take(self, batch: list[Message]) -> list[tuple[int, list[Message], int]]:
        """Sort a fetched batch into segments; returns the segments it completed."""
        settled = []
        seg_start, seg_end, end, progress = self.seg.slice.start, self.seg.slice.end, self.end, self.progress
        for m in batch:
            err = m.error()
            if err is not None:
                if self._stops_at(m, err):
                    break
                continue
            o: int = m.offset()  # type: ignore[assignment]
            if o >= end:
                self.done = True
                break
            progress.next = o + 1
            if o >= seg_end:
                settled.append(self.settle())
                while o >= self.segments[self.idx].slice.end:
                    self.idx += 1
                self.seg = self.segments[self.idx]
                seg_start, seg_end = self.seg.slice.start, self.seg.slice.end
            if o < seg_start:
                self.dropped += 1  # between a writer's registration and its first epoch
                continue
            self.in_range.append(m)
        return settled

    def _stops_at(self, m: Message, err: KafkaError) -> bool:
        """An end-of-partition at or past the end finishes the read; a lost offset raises; the rest wait."""
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            self.done = m.offset() >= self.end  # type: ignore[operator]
            return self.done
        if code in _DATA_LOST:
            raise DataLossError(f"{m.topic()}[{m.partition()}]: {err} (committed epochs need offsets "
                                f"{self.progress.next} to {self.end})")
        self.progress.error = str(err)  # transient: librdkafka retries by itself
        return False

    def settle(self) -> tuple[int, list[Message], int]:
        out = _settle(self.seg, self.in_range, self.dropped)
        self.in_range, self.dropped = [], 0
        return out


def read_partition(
    fetching: FetchingConsumer, topic: str, partition: int, segments: list[Segment], stall_timeout: float = 30.0,
) -> Iterator[tuple[int, list[Message], int]]:
    """Read one partition across consecutive segments: yields (epoch, kept messages, dropped count).

    The fetching consumer is (re)assigned to this partition only; records past the last segment end it.
    It waits as long as the read takes: after ``stall_timeout`` seconds without progress it warns once
    (and again when it moves), and a broker that answers but returns nothing gets a longer fetch wait.
    """
    fetching.consumer.assign([TopicPartition(topic, partition, segments[0].slice.start)])
    end = segments[-1].slice.end
    progress = _Progress(fetching, topic, partition, segments[0].slice.start, end, stall_timeout)
    read = _Segments(segments, progress)
    try:
        while not read.done:
            batch = progress.consumer.consume(_wanted(progress.next, end), timeout=0.05)
            progress.polled(batch)
            yield from read.take(batch)
            if read.done:
                break
            position = progress.consumer.position([TopicPartition(topic, partition)])[0].offset
            if position > progress.next:
                progress.next = position
                progress.stall.moved()
            if progress.next >= end:
                break
            progress.check()
    finally:
        progress.stall.close()
    yield read.settle()
