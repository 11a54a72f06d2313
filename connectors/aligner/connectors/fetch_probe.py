"""Time a fetch from the log start of every partition of a broker (``aligner stack status``).

Why: the embedded broker (Tansu 0.6, memory storage) answers a fetch in time growing with the record
batches of the partition (from the log start: 1k batches 0.007 s, 10k 0.06 s,
30k 0.18 s, 60k 0.48 s, 120k 1.9 s), so readers of old epochs and restores slow down as partitions
fill. Kafka's API does not tell how many batches a partition holds: the honest probe is to measure.

How: one fresh consumer per partition, one after the other, with the product's reader settings but a
generous wait (a fetch that finds data is answered at once; Tansu cuts a fetch at its wait). Not one
consumer for several partitions: librdkafka puts them in one fetch request, which the broker answers
when the slowest is read, so the small ones would look as slow as the large one. Largest partitions
first, within a time budget; what the budget left out is named. A partition spanning fewer offsets
than :data:`PROBE_FLOOR` holds fewer batches than that (each batch takes an offset) and is not probed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from aligner.connectors.kafka import UNREACHABLE, consumer_config

SLOW_FETCH_S = 0.1
"""A partition whose fetch from the log start takes longer than this is reported as slow."""
PROBE_FLOOR = 2_000
"""Partitions spanning fewer offsets are not probed: under 2k batches (1k measured at 0.007 s)."""
PROBE_BUDGET_S = 10.0
"""Time for the whole probe; partitions not reached in it are named as skipped."""
FETCH_LIMIT_S = 5.0
"""The longest one fetch is waited for (less when the budget is nearly spent): the probe ends within
about budget + limit, plus the metadata and offsets requests."""
PROBE_WAIT_MS = 10_000
"""The probe's fetch wait: longer than any fetch it waits for, so the broker never cuts one short."""
CONFIRM_BELOW = 3
"""A fetch between the threshold and this many times it is measured again before it counts as slow."""
OFFSETS_TIMEOUT_S = 5.0
"""Metadata and ListOffsets (which the embedded broker also pays per batch: ~0.4 s at 60k)."""

__all__ = ["PROBE_BUDGET_S", "PROBE_FLOOR", "SLOW_FETCH_S", "PartitionFetch", "ProbeResult", "probe"]


@dataclass(frozen=True)
class PartitionFetch:
    """One partition's measured fetch: ``seconds`` None when no answer came within ``limit``."""

    topic: str
    partition: int
    low: int
    high: int
    seconds: float | None
    limit: float

    def slow(self, threshold: float = SLOW_FETCH_S) -> bool:
        return self.seconds is None or self.seconds > threshold

    @property
    def name(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass
class ProbeResult:
    """What :func:`probe` measured, and what it did not measure and why."""

    threshold: float
    measured: list[PartitionFetch] = field(default_factory=list)
    small: int = 0
    """Partitions under :data:`PROBE_FLOOR` offsets (empty ones included): too small to be slow."""
    skipped: dict[str, str] = field(default_factory=dict)
    """``topic[partition]`` -> why it was not measured (the budget ran out, a partition error)."""
    error: str | None = None
    """Why nothing was probed (the broker did not answer metadata or offsets)."""
    seconds: float = 0.0

    @property
    def slow(self) -> list[PartitionFetch]:
        return [m for m in self.measured if m.slow(self.threshold)]


def partition_offsets(bootstrap: str, timeout: float = OFFSETS_TIMEOUT_S) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (log start, end) of every partition of the broker, within ``timeout`` in all:
    one consumer's ListOffsets per partition (not ``AdminClient.list_offsets``, which crashed processes:
    see :func:`aligner.connectors.kafka.end_offsets`)."""
    deadline = time.monotonic() + timeout
    consumer = Consumer(consumer_config(bootstrap, {"isolation.level": "read_uncommitted"}))
    try:
        topics = consumer.list_topics(timeout=timeout).topics
        spans: dict[tuple[str, int], tuple[int, int]] = {}
        for topic, meta in sorted(topics.items()):
            for partition in ([] if meta.error else sorted(meta.partitions)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no offsets for every partition within {timeout:g} s")
                tp = TopicPartition(topic, partition)
                spans[(topic, partition)] = consumer.get_watermark_offsets(tp, timeout=left, cached=False)
        return spans
    finally:
        consumer.close()


def time_first_record(bootstrap: str, topic: str, partition: int, offset: int, limit: float) -> float | None:
    """Seconds from assigning ``topic[partition]`` at ``offset`` to its first record (or its end, when
    nothing there is committed); None past ``limit``. The connection is made before the clock starts.
    A partition error (out of range, unknown) raises KafkaException."""
    consumer = Consumer(consumer_config(bootstrap, wait_ms=PROBE_WAIT_MS))
    try:
        consumer.list_topics(topic, timeout=OFFSETS_TIMEOUT_S)
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, partition, offset)])
        while (left := limit - (time.perf_counter() - started)) > 0:
            for m in consumer.consume(1, timeout=min(0.05, left)):
                err = m.error()
                if err is None or err.code() == KafkaError._PARTITION_EOF:
                    return time.perf_counter() - started
                if err.code() not in UNREACHABLE:
                    raise KafkaException(err)
        return None
    finally:
        consumer.close()


def measure(bootstrap: str, topic: str, partition: int, span: tuple[int, int], limit: float,
            threshold: float = SLOW_FETCH_S) -> PartitionFetch:
    """One fetch from the log start; one a little over ``threshold`` is measured again and the faster
    counts (a busy machine slows one fetch, the partition's size slows every fetch), waited for no
    longer than the first took. One past :data:`CONFIRM_BELOW` times it is not: a hiccup does not add
    that much, and it would cost seconds."""
    low, high = span
    tries = [time_first_record(bootstrap, topic, partition, low, limit)]
    if tries[0] is not None and threshold < tries[0] <= CONFIRM_BELOW * threshold:
        tries.append(time_first_record(bootstrap, topic, partition, low, tries[0]))
    answered = [t for t in tries if t is not None]
    return PartitionFetch(topic, partition, low, high, min(answered) if answered else None, limit)


def probe(bootstrap: str, budget: float = PROBE_BUDGET_S, floor: int = PROBE_FLOOR,
          threshold: float = SLOW_FETCH_S) -> ProbeResult:
    """Measure every partition of the broker spanning ``floor`` offsets or more, largest first, until
    ``budget`` seconds have passed. Never raises for a broker that does not answer: ``error`` says why."""
    started = time.monotonic()
    result = ProbeResult(threshold)
    try:
        spans = partition_offsets(bootstrap)
    except (KafkaException, TimeoutError) as exc:
        result.error = f"the broker did not answer metadata or offsets: {exc}"
        return result
    todo = sorted((k for k, (low, high) in spans.items() if high - low >= floor),
                  key=lambda k: (spans[k][0] - spans[k][1], k))
    result.small = len(spans) - len(todo)
    for topic, partition in todo:
        left = budget - (time.monotonic() - started)
        if left <= 0:
            result.skipped[f"{topic}[{partition}]"] = f"the probe's {budget:g} s budget was spent"
            continue
        limit = max(2 * threshold, min(FETCH_LIMIT_S, left))  # cut short, a fetch is still known slow
        try:
            result.measured.append(measure(bootstrap, topic, partition, spans[(topic, partition)], limit, threshold))
        except KafkaException as exc:
            result.skipped[f"{topic}[{partition}]"] = f"the fetch failed: {exc}"
    result.seconds = time.monotonic() - started
    return result
