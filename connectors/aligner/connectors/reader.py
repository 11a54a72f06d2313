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
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from aligner.connectors.kafka import consumer_config, end_offsets
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
        self.ledger = ledger
        self.stall_timeout = stall_timeout
        self._bootstrap = bootstrap
        self._consumer = Consumer(consumer_config(bootstrap, consumer_extra))

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> EpochReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def epochs(self, subject: str, first: int, last: int) -> list[CommittedEpoch]:
        """The committed epochs of the span; a clear error for any epoch not committed."""
        return self.ledger.committed_many(subject, first, last)

    def read_batches(self, subject: str, first: int, last: int) -> Iterator[tuple[int, int, list[Message]]]:
        """Yield (epoch, partition, messages) in partition then offset order; the fast path."""
        meta = self.ledger.subject(subject)
        by_partition = segments_by_partition(self.epochs(subject, first, last))
        read_counter, drop_counter = RECORDS_READ.labels(subject), RECORDS_DROPPED.labels(subject)
        log_start = end_offsets(self._bootstrap, meta.topic, list(by_partition), earliest=True) if by_partition else {}
        for partition in sorted(by_partition):
            segments = by_partition[partition]
            check_retention(subject, segments[0].epoch, partition, segments[0].slice.start, log_start[partition])
            for epoch, kept, dropped in read_partition(self._consumer, meta.topic, partition, segments,
                                                       self.stall_timeout):
                read_counter.inc(len(kept))
                if dropped:
                    drop_counter.inc(dropped)
                if kept:
                    yield epoch, partition, kept

    def read(self, subject: str, first: int, last: int | None = None) -> Iterator[EpochRecord]:
        last = first if last is None else last
        for epoch, partition, messages in self.read_batches(subject, first, last):
            for m in messages:
                yield EpochRecord(epoch, partition, m.offset(), m.key(), m.value(), m.timestamp()[1])


def _stamped(messages: list[Message], stamp: bytes) -> list[Message]:
    """The messages carrying ``stamp``: the committed attempt's."""
    kept = []
    for m in messages:
        h = m.headers()
        if h is not None and (h[0][1] == stamp or stamp_of(h) == stamp):
            kept.append(m)
    return kept


def _settle(seg: Segment, in_range: list[Message], dropped: int) -> tuple[int, list[Message], int]:
    """A segment's (epoch, kept, dropped) from all the data records read inside its range."""
    sl = seg.slice
    if sl.stamp is None or len(in_range) == sl.count:
        return seg.epoch, in_range, dropped
    kept = _stamped(in_range, sl.stamp)
    return seg.epoch, kept, dropped + len(in_range) - len(kept)


def read_partition(
    consumer: Consumer, topic: str, partition: int, segments: list[Segment], stall_timeout: float = 30.0
) -> Iterator[tuple[int, list[Message], int]]:
    """Read one partition across consecutive segments: yields (epoch, kept messages, dropped count).

    The consumer is (re)assigned to this partition only; records past the last segment end it.
    """
    tp = TopicPartition(topic, partition, segments[0].slice.start)
    consumer.assign([tp])
    end = segments[-1].slice.end
    idx = 0
    seg = segments[0]
    in_range: list[Message] = []
    dropped = 0
    seg_start, seg_end = seg.slice.start, seg.slice.end
    progress = time.monotonic()
    done = False
    while not done:
        batch = consumer.consume(10000, timeout=0.05)
        if batch:
            progress = time.monotonic()
        for m in batch:
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    if m.offset() >= end:
                        done = True
                        break
                    continue
                raise DataLossError(f"{topic}[{partition}]: {m.error()}")
            o = m.offset()
            if o >= end:
                done = True
                break
            if o >= seg_end:
                yield _settle(seg, in_range, dropped)
                in_range, dropped = [], 0
                while o >= segments[idx].slice.end:
                    idx += 1
                seg = segments[idx]
                seg_start, seg_end = seg.slice.start, seg.slice.end
            if o < seg_start:
                dropped += 1  # between a writer's registration and its first epoch
                continue
            in_range.append(m)
        if not done:
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if position >= end:
                done = True
            elif time.monotonic() - progress > stall_timeout:
                _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                raise DataLossError(
                    f"{topic}[{partition}]: committed epochs need offsets up to {end} but reading stalled "
                    f"at {position} (log end {high}); was the broker's log lost?"
                )
    yield _settle(seg, in_range, dropped)
