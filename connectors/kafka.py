"""Small confluent-kafka helpers shared by sinks, readers and the marker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from aligner.errors import AlignerError

QUIET = {"log_level": 3}
"""librdkafka logs reconnects at info level; tests and the CLI only want errors."""


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **QUIET})


def ensure_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Create the topic, or check that an existing one has the expected partition count."""
    client = admin(bootstrap)
    meta = client.list_topics(topic=None, timeout=timeout)
    existing = meta.topics.get(topic)
    if existing is not None and not existing.error:
        if len(existing.partitions) != partitions:
            raise AlignerError(
                f"topic {topic!r} has {len(existing.partitions)} partitions, the subject needs {partitions}"
            )
        return
    futures = client.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=timeout)
    for fut in futures.values():
        try:
            fut.result(timeout)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


def end_offsets(
    bootstrap: str, topic: str, partitions: Sequence[int], committed_only: bool = True,
    timeout: float = 30.0, earliest: bool = False,
) -> dict[int, int]:
    """Latest (last stable, for committed_only) or earliest offset of each partition."""
    client = admin(bootstrap)
    spec = OffsetSpec.earliest() if earliest else OffsetSpec.latest()
    request = {TopicPartition(topic, p): spec for p in partitions}
    level = IsolationLevel.READ_COMMITTED if committed_only else IsolationLevel.READ_UNCOMMITTED
    futures = client.list_offsets(request, isolation_level=level, request_timeout=timeout)
    return {tp.partition: fut.result(timeout).offset for tp, fut in futures.items()}


def consumer_config(bootstrap: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An assign-only consumer: no group offsets are ever committed, positions come from ZooKeeper."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"aligner-reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "queued.min.messages": 200000,
        "fetch.wait.max.ms": 10,
        **QUIET,
        **(extra or {}),
    }


def fetched_end_offsets(consumer: Consumer, topic: str, partitions: Sequence[int], bootstrap: str,
                        timeout: float = 30.0) -> dict[int, int]:
    """Last stable offsets as a fetch reports them at partition EOF.

    Tansu answers ListOffsets(latest) with the base offset of the last batch plus one, which is
    short of the end when that batch holds several records. Fetching from just before that
    answer until EOF gives the true end (the LSO, for a read_committed consumer) on any broker.
    """
    listed = end_offsets(bootstrap, topic, partitions, committed_only=True, timeout=timeout)
    consumer.assign([TopicPartition(topic, p, max(0, listed[p] - 1)) for p in partitions])
    ends: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while len(ends) < len(partitions):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no end-of-partition from {topic} partitions {sorted(set(partitions) - set(ends))}")
        for m in consumer.consume(10000, timeout=0.05):
            err = m.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                # The first EOF per partition counts; pausing would survive the unassign below.
                ends.setdefault(m.partition(), m.offset())
    consumer.unassign()
    return ends
