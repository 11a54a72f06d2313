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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from aligner.connectors.watchdog import Stall
from aligner.errors import AlignerError, StoppedError, TopicMissingError, UnreachableError
from aligner.settings import kafka_properties

log = logging.getLogger(__name__)

LIBRDKAFKA_LOG = logging.getLogger(f"{__name__}.librdkafka")
"""Where librdkafka's own log lines go. An unreachable broker makes librdkafka log every reconnect
attempt (hundreds of lines a minute) to stderr; routed here they are dropped unless a handler is
attached to this logger, and components report outages in their own words instead."""
LIBRDKAFKA_LOG.addHandler(logging.NullHandler())
LIBRDKAFKA_LOG.propagate = False

QUIET: dict[str, Any] = {"logger": LIBRDKAFKA_LOG}
"""Settings for every confluent-kafka client the product creates: no librdkafka log flood."""

RECONNECT: dict[str, Any] = {"reconnect.backoff.max.ms": 1000}
"""Defaults of every client the product creates (the client properties file may override them): a broker
that comes back is found within a second. librdkafka backs off reconnecting up to 10 s, so a consumer whose
connection dropped during a 10 s broker pause read again 0.2-4.7 s after it (1 s cap: 0.9-1.2 s; 7 trials each),
and a job in CI 44 s after it, over several failed reconnects. Java clients cap this at 1 s too."""

UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
                         KafkaError._RESOLVE, KafkaError._WAIT_COORD})
"""librdkafka error codes that mean the broker did not answer (not that it refused the request)."""

UNKNOWN_TOPIC = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART})
"""Error codes of a broker that answered without the topic or partition asked for."""

UNKNOWN_TOPIC_WAIT = 5.0
"""Seconds a partition the broker does not know is asked for again before TopicMissingError: a new topic's
metadata reaches every broker within a second or two."""


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
    return {**RECONNECT, **client_properties(), "bootstrap.servers": bootstrap, **QUIET}


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
    timeout: float = 30.0, earliest: bool = False, stop: threading.Event | None = None,
) -> dict[int, int]:
    """Latest (last stable, for committed_only) or earliest offset of each partition.

    Asked through the ListOffsets of a consumer made for this call (:func:`listed_ends`), never
    ``AdminClient.list_offsets``: with confluent-kafka 2.16 that call crashed the process (SIGSEGV inside
    it) in a soak's marker and, most likely, in a CI run's job start. Not a consumer that also fetches: a
    broker answers one connection's requests in order, so the ListOffsets would wait behind a fetch the
    broker holds for up to its wait (seconds, for a consumer that raised it). A broker unreachable or paused
    is waited for, with a fresh consumer after each failed connection (librdkafka backs off reconnecting an
    old one by up to 10 s); ``stop`` ends the wait with StoppedError; TimeoutError after ``timeout`` seconds
    without an answer."""
    level = "read_committed" if committed_only else "read_uncommitted"
    deadline = time.monotonic() + timeout
    while True:
        consumer = Consumer(consumer_config(bootstrap, {"isolation.level": level}))
        try:
            return listed_ends(consumer, topic, partitions, max(0.1, deadline - time.monotonic()), stop,
                               earliest=earliest)
        except KafkaException as exc:
            err = _error(exc)
            if err is None or err.code() not in UNREACHABLE:
                raise
        finally:
            consumer.close()
        if stop is not None and stop.is_set():
            raise StoppedError(f"stopped while asking for the offsets of {topic}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no answer to ListOffsets for {topic} within {timeout:.0f}s")
        (stop or threading.Event()).wait(0.2)  # refused at once: not a busy loop


def listed_ends(consumer: Consumer, topic: str, partitions: Sequence[int], timeout: float = 30.0,
                stop: threading.Event | None = None, earliest: bool = False) -> dict[int, int]:
    """Each partition's end (last stable offset for a read_committed consumer) or, ``earliest``, its log
    start, through the consumer's own ListOffsets, not an admin client: no futures completed from
    librdkafka's background thread. The epoch marker, the one caller every half second, died once of
    SIGSEGV inside ``AdminClient.list_offsets`` (librdkafka 2.16) in a soak; this path needs no admin client.
    TimeoutError after ``timeout`` seconds without an answer; ``stop`` ends the wait with StoppedError. A
    connection that failed (all brokers down) raises: its caller retries with a fresh consumer.

    Each unanswered call is a new request, so the time a call waits doubles up to :data:`LIST_SLICE_MAX`:
    a broker that takes 0.6 s to answer (a partition of many batches on the embedded broker, a starved
    machine) is heard on the next call, not asked again every half second forever.

    A partition the broker does not know is asked for again for :data:`UNKNOWN_TOPIC_WAIT` seconds (a
    topic just created), then TopicMissingError: an answering broker without the topic is no outage, and a
    worker whose ledger outlived the broker's topics would otherwise die of the raw KafkaException."""
    started = time.monotonic()
    deadline = started + timeout
    out: dict[int, int] = {}
    for p in partitions:
        wait = 0.5
        while True:
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=wait, cached=False)
                out[p] = low if earliest else high
                break
            except KafkaException as exc:
                err = _error(exc)
                if err is not None and err.code() in UNKNOWN_TOPIC:
                    if time.monotonic() - started >= min(timeout, UNKNOWN_TOPIC_WAIT):
                        raise TopicMissingError(topic, p) from None
                    (stop or threading.Event()).wait(0.2)  # answered at once: not a busy loop
                elif not (retriable(exc) or (err is not None and err.code() == KafkaError._TIMED_OUT_QUEUE)):
                    raise
            wait = min(LIST_SLICE_MAX, wait * 2, max(0.1, deadline - time.monotonic()))
            if stop is not None and stop.is_set():
                raise StoppedError(f"stopped while asking for the offsets of {topic}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no answer to ListOffsets for {topic} within {timeout:.0f}s")
    return out


def transactional_id(subject: str, sink: str, producer: str) -> str:
    """The Kafka transactional id of a sink's producer: stable across restarts, so a new incarnation
    (or a Spark task retry) fences the transaction its predecessor left open."""
    return f"aligner.{subject}.{sink}.{producer}"


LINGER_MS = 1000
"""How long a sink's producer holds records to fill a batch. An epoch's records are read only once it
commits, and the commit flushes (librdkafka sends at once on flush, whatever the linger), so lingering
costs no latency; a full batch (``batch.num.messages``) goes at once, so it costs no throughput either.
What it saves is batches: at 150 records/s and 0.5 s epochs, 37 batches per partition per epoch with
5 ms, 1 with 1 s (measured on the embedded stack), and the embedded broker's fetches cost time
per batch held in a partition (experiments/bench_fetch.py)."""


EAGER_CONNECTIONS: dict[str, Any] = {"enable.sparse.connections": False}
"""A transactional producer connects to every broker it learns of at once, not only to the ones it needs.
librdkafka's sparse connections (the default) drop the bootstrap connection once the metadata names the
brokers and then hold the next connection back (50 ms by default), and the transaction coordinator's
connection sometimes loses a race with that and waits for a 500 ms timer. ``init_transactions`` of a new
producer, measured on the embedded broker (100 starts each, ``experiments/bench_producer_start.py``):
median 54 ms and mean 93 ms (7 of 100 over 200 ms) with sparse connections, 2 ms and 4 ms (none) without.
A Spark write task starts one producer per micro-batch, so that was about a third of its time. The cost is
a connection to each broker of the cluster per producer, which a producer writing several partitions
opens anyway."""


def producer_config(bootstrap: str, txn_id: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A transactional producer tuned for epochs of many small records (one transaction per epoch)."""
    return {
        "linger.ms": LINGER_MS,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 1_000_000,
        "transaction.timeout.ms": 60000,
        **EAGER_CONNECTIONS,
        **RECONNECT,
        **client_properties(),
        "bootstrap.servers": bootstrap,
        "transactional.id": txn_id,
        **QUIET,
        **(extra or {}),
    }


LIST_SLICE_MAX = 2.0
"""The longest one ListOffsets call of :func:`listed_ends` waits: a stop request is seen within it."""


def _error(exc: KafkaException) -> KafkaError | None:
    """The KafkaError a KafkaException carries, if any."""
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


def retriable(exc: KafkaException) -> bool:
    """A Kafka failure worth waiting out: the broker did not answer in time or asked to retry."""
    err = _error(exc)
    return err is not None and (err.retriable() or err.code() == KafkaError._TIMED_OUT)


def requires_abort(exc: KafkaException) -> bool:
    """The transaction cannot commit any more (e.g. a record failed): abort it and write the epoch again."""
    err = _error(exc)
    return err is not None and err.txn_requires_abort()


FETCH_WAIT_MS = 500
"""How long the broker may hold a fetch that finds no data (librdkafka's default; measured in
experiments/bench_fetch.py). The broker answers as soon as it finds data, so the wait costs nothing
while data flows; a caught-up consumer sends two fetches a second instead of a hundred (10 ms). The
embedded broker also treats the wait as a deadline for finding the data, which costs more the more
batches a partition holds: a short wait there means fetches that never return anything."""

MAX_FETCH_WAIT_MS = 30_000
"""The longest wait a consumer escalates to when fetches come back empty from a broker that answers."""


def consumer_config(bootstrap: str, extra: Mapping[str, Any] | None = None,
                    wait_ms: int | None = None) -> dict[str, Any]:
    """An assign-only consumer: no group offsets are ever committed, positions come from ZooKeeper.

    ``wait_ms`` overrides the fetch wait (the client properties file may set it too): a consumer that
    found the broker slow comes back with a longer one (see :class:`FetchingConsumer`)."""
    return {
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "queued.min.messages": 200000,
        "fetch.wait.max.ms": FETCH_WAIT_MS,
        "fetch.min.bytes": 1,
        **RECONNECT,
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
        **({} if wait_ms is None else {"fetch.wait.max.ms": int(wait_ms)}),
    }


_learned: dict[str, int] = {}
"""Per bootstrap list: the longest fetch wait a consumer of this process had to escalate to. New
consumers start there (up to :data:`INHERITED_WAIT_MS`): the partitions of a broker that slows with
their size do not shrink."""

INHERITED_WAIT_MS = 2000
"""The most a new consumer takes over from ``_learned``. librdkafka keeps one fetch per broker in flight,
so a consumer that moves to another partition waits out the fetch it sent before: at the 30 s cap,
every epoch a reader reads would take 30 s (measured). One that needs more raises its own wait."""


def escalate_after(wait_ms: int) -> float:
    """Seconds of empty fetches from a broker that answers before a consumer's wait is raised."""
    return max(2.0, 4 * wait_ms / 1000)


class FetchingConsumer:
    """An assign-only Consumer whose fetch wait adapts: raised (x4, up to :data:`MAX_FETCH_WAIT_MS`)
    when fetches come back empty from a broker that answers. librdkafka cannot change the wait of a
    live consumer, so the consumer is replaced; its owner assigns the new one where it stood."""

    def __init__(self, bootstrap: str, extra: Mapping[str, Any] | None = None, wait_ms: int | None = None) -> None:
        """``wait_ms``: the first fetch wait when neither ``extra`` nor the client properties file sets one
        (default FETCH_WAIT_MS)."""
        self.bootstrap = bootstrap
        self.extra = dict(extra or {})
        configured = self.extra.get("fetch.wait.max.ms", client_properties().get("fetch.wait.max.ms", wait_ms))
        configured = int(configured if configured is not None else FETCH_WAIT_MS)
        self.wait_ms = max(configured, min(_learned.get(bootstrap, 0), INHERITED_WAIT_MS))
        self.consumer = Consumer(consumer_config(bootstrap, self.extra, self.wait_ms))
        self.reopened = 0

    def slower(self) -> int:
        """Replace the consumer by one with a longer wait (the same at the cap: fresh connections);
        returns the new wait. The caller assigns the new consumer."""
        before, self.wait_ms = self.wait_ms, min(MAX_FETCH_WAIT_MS, self.wait_ms * 4)
        log.info("fetches from %s came back short: fetch wait raised from %d to %d ms", self.bootstrap, before,
                 self.wait_ms)
        _learned[self.bootstrap] = max(_learned.get(self.bootstrap, 0), self.wait_ms)
        old, self.consumer = self.consumer, Consumer(consumer_config(self.bootstrap, self.extra, self.wait_ms))
        self.reopened += 1
        old.close()
        return self.wait_ms

    def close(self) -> None:
        self.consumer.close()


def probe(consumer: Consumer, topic: str, partition: int, timeout: float = 1.0) -> tuple[int, int] | None:
    """The partition's (low, high) watermarks asked of the broker now; None when it does not answer."""
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
    except KafkaException:
        return None
    return low, high


def stall_cause(answered: bool, wait_ms: int, raised_to: int | None = None) -> str:
    """Why a read makes no progress, in the operator's words."""
    if not answered:
        return "the broker does not answer (paused, overloaded or unreachable)"
    then = f"; fetch wait raised to {raised_to} ms" if raised_to else ""
    return (f"the broker answers but fetches waiting up to {wait_ms} ms come back empty: a fetch takes longer "
            f"than its wait (the embedded broker slows with batches per partition; docs: The embedded stack){then}")


class _EndWatch:
    """The stall watch of one ``fetched_end_offsets`` call: what it saw, per partition still open."""

    def __init__(self, fc: FetchingConsumer, topic: str, component: str) -> None:
        self.fc, self.topic, self.component = fc, topic, component
        self.stalls: dict[int, Stall] = {}
        self.checked = time.monotonic()
        self.fetches_at = time.monotonic()

    def stall(self, partition: int) -> Stall:
        return self.stalls.setdefault(partition, Stall(self.component, self.topic, partition))

    def check(self, open_partitions: Iterable[int]) -> bool:
        """Once a second while partitions are open: warn when stuck; True when the consumer was
        replaced by a slower one (the caller assigns it again)."""
        now = time.monotonic()
        if now - self.checked < 1.0:
            return False
        self.checked = now
        wait = self.fc.wait_ms
        stuck = [p for p in open_partitions if self.stall(p).idle() >= min(escalate_after(wait), 10.0)]
        if not stuck:
            return False
        answered = probe(self.fc.consumer, self.topic, stuck[0]) is not None
        raise_wait = answered and now - self.fetches_at >= escalate_after(wait) and wait < MAX_FETCH_WAIT_MS
        new = self.fc.slower() if raise_wait else None
        for p in stuck:
            self.stall(p).report(None, "its end offset", stall_cause(answered, wait, new))
        if new is not None:
            self.fetches_at = now
            return True
        return False

    def done(self) -> None:
        for s in self.stalls.values():
            s.moved()
            s.close()


def fetched_end_offsets(fc: FetchingConsumer, topic: str, partitions: Sequence[int], bootstrap: str,
                        stop: threading.Event | None = None, known: Mapping[int, int] | None = None,
                        component: str = "reader") -> dict[int, int]:
    """Last stable offsets, as a read_committed fetch reaches them.

    Tansu answers ListOffsets(latest) with the base offset of the last batch plus one, which is
    short of the end when that batch holds several records. Fetching from just before that
    answer gives the true end (the LSO, for a read_committed consumer) on any broker: the position
    once it reaches the high watermark of the fetch that brought the records, or partition EOF.
    A partition whose answer is not past ``known`` (its end from an earlier call) got no new batch.
    Waits as long as it takes (a stalled fetch is reported and the wait raised, never given up on);
    ``stop`` ends the wait with StoppedError. An outage longer than 30 s raises TimeoutError from the
    ListOffsets call.
    """
    listed = listed_ends(fc.consumer, topic, partitions, timeout=30.0, stop=stop)
    ends = {p: known[p] for p in partitions if known is not None and p in known and listed[p] <= known[p]}
    ends.update({p: 0 for p in partitions if listed[p] <= 0})
    todo = [p for p in partitions if p not in ends]
    watch = _EndWatch(fc, topic, component)
    while todo:
        consumer = fc.consumer
        consumer.assign([TopicPartition(topic, p, max(0, listed[p] - 1)) for p in todo])
        if _read_ends(fc, consumer, topic, todo, ends, watch, stop):
            break
    watch.done()
    fc.consumer.unassign()
    return ends


def _read_ends(fc: FetchingConsumer, consumer: Consumer, topic: str, todo: list[int], ends: dict[int, int],
               watch: _EndWatch, stop: threading.Event | None) -> bool:
    """Consume until every partition of ``todo`` has its end in ``ends`` (True), or the consumer was
    replaced by a slower one (False: assign the new one)."""
    while True:
        if stop is not None and stop.is_set():
            consumer.unassign()
            raise StoppedError(f"stopped while reading the end offsets of {topic}")
        seen: set[int] = set()
        for m in consumer.consume(10000, timeout=0.05):
            p: int = m.partition()  # type: ignore[assignment]
            err = m.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                ends.setdefault(p, m.offset())  # type: ignore[arg-type]  # the first EOF per partition counts
            elif err is None:
                seen.add(p)
        for p in seen - ends.keys():
            watch.stall(p).moved()
            tp = consumer.position([TopicPartition(topic, p)])[0]
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
            if tp.offset >= 0 and high >= 0 and tp.offset >= high:
                ends[p] = tp.offset  # read up to the high watermark the broker just reported: no EOF to wait for
        todo[:] = [p for p in todo if p not in ends]
        if not todo:
            return True
        for p in todo:
            watch.stall(p).polled_empty()
        if watch.check(todo):
            return False
