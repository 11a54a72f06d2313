"""What the benchmarks and experiments share: where results go, producer settings, the numbered
records the read benchmarks write, the raw read baseline, a timer on a Ledger's calls, and the work each
arm of a benchmark did (``Work``), which the benchmarks' smoke test compares across the arms of a ratio."""

from __future__ import annotations

import json
import os
import queue
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, overload

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from aligner.connectors.kafka import LINGER_MS, consumer_config, end_offsets
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.ledger import Ledger
from aligner.lineage import sink_lineage, source_batch
from aligner.lineage_models import SparkSourceBatchNode
from experiments import cpu_seconds

RESULTS = Path(os.environ.get("ALIGNER_RESULTS") or Path(__file__).resolve().parent / "results")
"""Where results go; ALIGNER_RESULTS moves them (the benchmarks' smoke test writes to a temporary folder)."""

PRODUCER_SETTINGS = {
    "linger.ms": LINGER_MS,
    "batch.num.messages": 10000,
    "queue.buffering.max.messages": 1_000_000,
    "transaction.timeout.ms": 60000,
}
"""librdkafka settings of the raw baselines, so they batch as the sink does."""

Headers = list[tuple[str, str | bytes | None]]
"""A record's headers as confluent-kafka takes them (the raw baselines' stamp)."""

VALUE_BYTES = 100
SPARK_QUICK_DRIVER = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
"""Driver JVM options of the experiments' short-lived local Spark drivers (chaos, upgrades): the C1 JIT alone
and the serial GC start one seconds faster on two shared cores."""


def json_value(value: bytes | None) -> Any:
    """A record's JSON value. The experiments' jobs write no tombstones: a record without a value is a bug,
    said as such rather than as a TypeError from json."""
    if value is None:
        raise ValueError("a record without a value (a tombstone) where the job writes JSON")
    return json.loads(value)


def spark_reads(led: Ledger, subject: str, sink: str) -> dict[int, dict[str, SparkSourceBatchNode]]:
    """Per epoch of ``subject`` that the Spark sink ``sink`` wrote, what its micro-batch read (by input subject;
    none for a batch without a query)."""
    return {epoch: source_batch(led, node.query, node.batch) if node.query is not None else {}
            for epoch, node in sorted(sink_lineage(led, subject, sink).items())}


def median_interval(values: list[float], resamples: int = 10_000) -> tuple[float, float]:
    """A bootstrap 95 % interval of the median of ``values`` (seeded: a result file reads the same again).
    On two shared cores one run's rounds spread wider than the gaps the benchmarks judge; this says how
    far its median can be trusted."""
    rng = random.Random(2026)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path


def value(i: int) -> bytes:
    """100 distinct bytes per record, so readers can be checked to return the same records."""
    return b"%010d" % i + b"x" * (VALUE_BYTES - 10)


def write_numbered(led: Ledger, bootstrap: str, subject: str, records: int, partitions: int,
                   epoch_records: int) -> tuple[int, int, float]:
    """Records ``value(0..records-1)`` round-robin over the partitions, ``epoch_records`` per epoch;
    returns the first and last epoch and the seconds it took."""
    t0 = time.perf_counter()
    epochs = []
    with SinkProducer(led, bootstrap, subject, "sink", 0, list(range(partitions))) as p:
        for start in range(0, records, epoch_records):
            epochs.append(p.begin())
            for i in range(start, min(start + epoch_records, records)):
                p.send(value(i), partition=i % partitions)
            p.commit()
    return epochs[0], epochs[-1], time.perf_counter() - t0


@overload
def read_raw(bootstrap: str, topic: str, span: dict[int, tuple[int, int]],
             collect: Literal[True] = True) -> list[bytes]:
    ...


@overload
def read_raw(bootstrap: str, topic: str, span: dict[int, tuple[int, int]], collect: Literal[False]) -> int:
    ...


def read_raw(bootstrap: str, topic: str, span: dict[int, tuple[int, int]], collect: bool = True) -> list[bytes] | int:
    """The raw baseline: plain confluent-kafka reads of [start, end) per partition, ending on
    position. Returns the values, or (``collect`` False) only how many were read."""
    values: list[bytes] = []
    append = values.append
    n = 0
    consumer = Consumer(consumer_config(bootstrap))
    try:
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _end) in span.items()])
        end = {p: e for p, (_s, e) in span.items()}
        pending = {p for p, (s, e) in span.items() if e > s}
        while pending:
            for m in consumer.consume(10000, timeout=0.05):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(str(err))
                    continue
                if m.offset() < end[m.partition()]:  # type: ignore[operator,index]  # a record has both
                    if collect:
                        append(m.value())  # type: ignore[arg-type]
                    else:
                        m.value()
                        n += 1
            for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset >= end[tp.partition]:
                    pending.discard(tp.partition)
    finally:
        consumer.close()
    return values if collect else n


class LedgerTimer:
    """Adds up the wall time and count of a ledger recipe's calls (``ledger.commits``), wrapped on the instance
    only."""

    def __init__(self, recipe: object, names: tuple[str, ...]) -> None:
        self.names = names
        self.seconds = 0.0
        self.calls = 0
        for name in names:
            setattr(recipe, name, self._timed(getattr(recipe, name)))

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1
        return wrapper


@dataclass
class Work:
    """What one arm of a benchmark did, summed over its measured rounds (warm-ups not counted): records
    consumed or produced, Kafka transactions committed (that carried records), bytes of the values written or
    read. Counted from what the arm did (a counter in its loop, or read back from what it wrote), never from the
    configured size."""

    records: int = 0
    transactions: int = 0
    bytes: int = 0

    def add(self, other: Work) -> None:
        self.records += other.records
        self.transactions += other.transactions
        self.bytes += other.bytes


WORK_FIELDS = ("records", "transactions", "bytes")


def work_results(work: Mapping[str, Work], comparable: Sequence[str] = WORK_FIELDS) -> dict[str, Any]:
    """The results' ``work`` (per arm, summed over the measured rounds) and ``comparable``: the fields every arm
    must agree on (tests/platform/test_benchmarks.py checks them); a field left out differs by design."""
    assert set(comparable) <= set(WORK_FIELDS), comparable
    return {"work": {arm: asdict(w) for arm, w in work.items()}, "comparable": list(comparable)}


def topic_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's last stable offset: where an arm's output starts, before it runs."""
    return end_offsets(bootstrap, topic, list(range(partitions)))


def read_back(bootstrap: str, topic: str, since: Mapping[int, int], transactions: int = 0) -> Work:
    """The committed records written to ``topic`` since the offsets ``since`` (from :func:`topic_ends` before
    the arm ran), read back outside the timed part: their count and the bytes of their values."""
    ends = end_offsets(bootstrap, topic, sorted(since))
    values = read_raw(bootstrap, topic, {p: (o, ends[p]) for p, o in since.items()})
    return Work(records=len(values), transactions=transactions, bytes=sum(len(v or b"") for v in values))


def read_back_eof(bootstrap: str, topic: str, partitions: int) -> Work:
    """Every record of a topic written outside transactions (a plain producer's output, finished before this is
    called), read from the start to each partition's end (``_PARTITION_EOF``), outside the timed part: their count
    and the bytes of their values. Not :func:`read_back`: the embedded broker's ListOffsets answers the last
    batch's base offset + 1, which is the end only when a commit marker ends the partition (PLATFORM.md)."""
    n = size = 0
    consumer = Consumer(consumer_config(bootstrap))
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        pending = set(range(partitions))
        while pending:
            for m in consumer.consume(10000, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(str(err))
                    pending.discard(m.partition())
                    continue
                n += 1
                size += len(m.value() or b"")
    finally:
        consumer.close()
    return Work(records=n, bytes=size)


class EventLines:
    """A worker process (``python -m MODULE worker -l warn --without-web``, a Faust job's command line) whose
    stdout event lines (``open ...``, ``committed E ...``) can be awaited; stderr is kept for failure messages."""

    def __init__(self, module: str, root: Path, env: Mapping[str, str], bound: float) -> None:
        self.bound = bound
        """Seconds after which waiting for a line counts as failed (a liveness bound, not a figure)."""
        self.proc = subprocess.Popen([sys.executable, "-m", module, "worker", "-l", "warn", "--without-web"],
                                     cwd=root, env={**os.environ, "PYTHONPATH": str(root), **env},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr or ()), daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout or ():
            if line.strip():
                self.lines.put(line.strip())
        self.lines.put(None)

    def next_line(self, event: str) -> str:
        """The worker's next line whose first word is ``event``."""
        deadline = time.monotonic() + self.bound
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"no {event} line in {self.bound:.0f}s: {''.join(self.stderr)[-2000:]}") from None
            if line is None:
                raise RuntimeError(f"worker exited {self.proc.wait()}: {''.join(self.stderr)[-2000:]}")
            if line.split()[0] == event:
                return line


def batch_started(progress: Mapping[str, Any]) -> float:
    """When a Spark micro-batch started (epoch seconds), from its progress report."""
    return datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


def batch_ended(progress: Mapping[str, Any]) -> float:
    """When a Spark micro-batch ended (epoch seconds): its start plus its ``triggerExecution``."""
    return batch_started(progress) + progress["durationMs"]["triggerExecution"] / 1000


def warm_zookeeper(led: Ledger, bootstrap: str, zk_pid: int, epochs: int, partitions: int) -> tuple[float, float]:
    """``epochs`` one-record pipelined epochs of a subject of their own, so that ZooKeeper's JIT has compiled
    the commit path before a benchmark's rounds, as it has in an ensemble that has run for a while (in a JVM
    started seconds before, a commit costs the server several times the CPU, taken on two shared cores from
    the broker and the writers); returns the seconds taken and the server's CPU per epoch (ms)."""
    create_subject(led, bootstrap, "warm-up", partitions)
    with SinkProducer(led, bootstrap, "warm-up", "sink", 0, list(range(partitions))) as p:
        t0, cpu0 = time.perf_counter(), cpu_seconds(zk_pid)
        for i in range(epochs):
            p.begin()
            p.send(b"w", partition=i % partitions)
            p.commit(wait=False)
        p.sync()
        return time.perf_counter() - t0, 1000 * (cpu_seconds(zk_pid) - cpu0) / max(1, epochs)
