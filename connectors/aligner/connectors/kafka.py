"""Small confluent-kafka helpers shared by sinks, readers and the marker.

Every confluent-kafka client the product creates is configured by :func:`admin`,
:func:`producer_config` or :func:`consumer_config`; they merge the Kafka client properties of
``ALIGNER_KAFKA_CONFIG`` (SASL, TLS, client.id, ...; see :func:`aligner.settings.kafka_properties`), so
the CLI, the runtime, the marker, Spark drivers and executors and Faust jobs all reach a secured
cluster through the environment they inherit. The file may tune any setting except the ones the
protocol depends on (:data:`PROTOCOL`), and it never overrides the bootstrap servers the product was given.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from aligner.errors import AlignerError, StoppedError, UnreachableError
from aligner.settings import kafka_properties

log = logging.getLogger("aligner.kafka")

LIBRDKAFKA_LOG = logging.getLogger("aligner.librdkafka")
"""Where librdkafka's own log lines go. An unreachable broker makes librdkafka log every reconnect
attempt (hundreds of lines a minute) to stderr; routed here they are dropped unless a handler is
attached to this logger, and components report outages in their own words instead."""
LIBRDKAFKA_LOG.addHandler(logging.NullHandler())
LIBRDKAFKA_LOG.propagate = False

QUIET: dict[str, Any] = {"logger": LIBRDKAFKA_LOG}
"""Settings for every confluent-kafka client the product creates: no librdkafka log flood."""

UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
                         KafkaError._RESOLVE, KafkaError._WAIT_COORD})
"""librdkafka error codes that mean the broker did not answer (not that it refused the request)."""


PROTOCOL = frozenset({"bootstrap.servers", "transactional.id", "group.id", "enable.auto.commit",
                      "enable.auto.offset.store", "isolation.level", "enable.partition.eof", "auto.offset.reset",
                      "logger"})
"""Settings the product decides (bootstrap servers come from ALIGNER_KAFKA / --kafka; exactly-once and
positions from ZooKeeper depend on the others): the client properties file cannot override them."""

_warned: set[str] = set()


def client_properties() -> dict[str, Any]:
    """The ALIGNER_KAFKA_CONFIG settings every client gets ({} when it is not set), without the ones
    the product decides (each such key is logged once, so a copied producer.properties still works)."""
    props = kafka_properties()
    for key in sorted(PROTOCOL & props.keys()):
        if key not in _warned:
            _warned.add(key)
            log.warning("Kafka client config: %s=%s is ignored (the product sets it)", key, props[key])
        del props[key]
    return props


def admin(bootstrap: str) -> AdminClient:
    return AdminClient(admin_config(bootstrap))


def admin_config(bootstrap: str) -> dict[str, Any]:
    """An admin client's settings: the client properties file, the bootstrap servers, no log flood."""
    return {**client_properties(), "bootstrap.servers": bootstrap, **QUIET}


def _bootstrap_hosts(bootstrap: str) -> list[tuple[str, int]]:
    """(host, port) of each ``[proto://]host[:port]`` in a bootstrap list."""
    hosts = []
    for item in bootstrap.split(","):
        item = item.strip().split("://", 1)[-1]
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or "]" in port:
            host, port = item, "9092"
        try:
            hosts.append((host.strip("[]"), int(port)))
        except ValueError:
            raise AlignerError(f"invalid Kafka address {item!r} in {bootstrap!r}: the port is not a number") from None
    if not hosts:
        raise AlignerError(f"invalid Kafka bootstrap servers {bootstrap!r}: give host:port[,host:port]")
    return hosts


def _os_detail(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    if isinstance(exc, TimeoutError):
        return "no answer to a TCP connect"
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


def check_reachable(bootstrap: str, timeout: float = 10.0) -> None:
    """Fail fast, with :class:`UnreachableError`, when no bootstrap server answers.

    A TCP connect first (a closed port is refused at once), then a metadata request bounded by
    ``timeout`` (a broker that accepts connections but is paused or not Kafka never answers)."""
    failure: OSError | None = None
    for host, port in _bootstrap_hosts(bootstrap):
        try:
            with socket.create_connection((host, port), timeout=min(timeout, 3.0)):
                failure = None
                break
        except OSError as exc:
            failure = exc
    if failure is not None:
        raise UnreachableError("Kafka", bootstrap, _os_detail(failure))
    try:
        admin(bootstrap).list_topics(timeout=timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if err is not None and err.code() not in UNREACHABLE:
            raise
        raise UnreachableError("Kafka", bootstrap, f"no metadata answer within {timeout:.0f}s") from None


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
        except KafkaException as exc:
            if not (exc.args and isinstance(exc.args[0], KafkaError)
                    and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS):
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


def transactional_id(subject: str, sink: str, producer: str) -> str:
    """The Kafka transactional id of a sink's producer: stable across restarts, so a new incarnation
    (or a Spark task retry) fences the transaction its predecessor left open."""
    return f"aligner.{subject}.{sink}.{producer}"


def producer_config(bootstrap: str, txn_id: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A transactional producer tuned for epochs of many small records (one transaction per epoch)."""
    return {
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 1_000_000,
        "transaction.timeout.ms": 60000,
        **client_properties(),
        "bootstrap.servers": bootstrap,
        "transactional.id": txn_id,
        **QUIET,
        **(extra or {}),
    }


def retriable(exc: KafkaException) -> bool:
    """A Kafka failure worth waiting out: the broker did not answer in time or asked to retry."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and (err.retriable() or err.code() == KafkaError._TIMED_OUT)


def requires_abort(exc: KafkaException) -> bool:
    """The transaction cannot commit any more (e.g. a record failed): abort it and write the epoch again."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.txn_requires_abort()


def consumer_config(bootstrap: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An assign-only consumer: no group offsets are ever committed, positions come from ZooKeeper."""
    return {
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "queued.min.messages": 200000,
        "fetch.wait.max.ms": 10,
        **client_properties(),
        "bootstrap.servers": bootstrap,
        "group.id": f"aligner-reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        **QUIET,
        **(extra or {}),
    }


def fetched_end_offsets(consumer: Consumer, topic: str, partitions: Sequence[int], bootstrap: str,
                        timeout: float = 30.0, stop: threading.Event | None = None) -> dict[int, int]:
    """Last stable offsets as a fetch reports them at partition EOF.

    Tansu answers ListOffsets(latest) with the base offset of the last batch plus one, which is
    short of the end when that batch holds several records. Fetching from just before that
    answer until EOF gives the true end (the LSO, for a read_committed consumer) on any broker.
    """
    listed = end_offsets(bootstrap, topic, partitions, committed_only=True, timeout=min(timeout, 3.0))
    consumer.assign([TopicPartition(topic, p, max(0, listed[p] - 1)) for p in partitions])
    ends: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while len(ends) < len(partitions):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no end-of-partition from {topic} partitions {sorted(set(partitions) - set(ends))}")
        if stop is not None and stop.is_set():
            raise StoppedError(f"stopped while reading the end offsets of {topic}")
        for m in consumer.consume(10000, timeout=0.05):
            err = m.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                # The first EOF per partition counts; pausing would survive the unassign below.
                ends.setdefault(m.partition(), m.offset())
    consumer.unassign()
    return ends
