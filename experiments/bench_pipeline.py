"""Aligned consume -> transform -> produce throughput: one JobWorker vs a raw confluent-kafka loop.

Set-up: subject ``in`` (4 partitions) and the job ``pipe`` (one worker, identity transform, output
subject ``out``, 4 partitions). The worker is aligned on ``in`` by the coordinator while a writer
keeps committing tiny epochs; then the writer stops and the worker drains them, so the measured
phase starts with an aligned worker and nothing left to read.

Each round pre-writes ``--records`` 100-byte records into ``in`` in subject epochs of 10,000 (not
timed), then runs, in alternating order:

- **tuned** (and **tuned + stamp header**): the best plain confluent-kafka loop we can write for the same work,
  shaped as confluent-kafka's own exactly-once example: one long-lived assign-only ``Consumer`` with exactly the
  aligned source's settings (``consumer_config`` plus ``source_settings``, read_committed), reading its own copy of
  the round's values from a topic holding only them (so it needs no per-record range check and gets no other
  arm's prefetch); ``consume(num_messages=10000)``; every value produced positionally to the same partition of a
  plain topic by a long-lived transactional ``Producer`` (the sink's settings); every 10,000 records (the aligned
  job's cadence) the consumed positions go into the transaction (``send_offsets_to_transaction``) and it commits.
  The ratios that matter are against this loop;
- **raw**: the earlier baseline, kept for comparison: a new ``Consumer`` per run with ``consumer_config`` only
  (not the source's fetch settings), assigned to the round's offset range of the aligned job's input topic and
  checking each record against the range, producing every value to a plain topic (same partition) with the
  transactional ``Producer``, one transaction per 10,000 records (no offsets sent);
- **aligned job** (and **aligned job, batch**: the same with the identity as a ``@batch`` function,
  called once per fetch and returning the fetch's ``records.pairs()``, its keys and values as columns, on its
  own copy of the round's input, written just before its run so that the source has prefetched none of it):
  ``JobWorker.step`` once per subject epoch: each job epoch covers exactly one subject epoch, reads it through
  the aligned source (its input epochs are dense, so no stamp is read), runs the identity function, writes it
  through the sink in one Kafka transaction (unstamped: dense epochs need none) and commits input offsets, state and
  output in one ZooKeeper multi-op.

ZooKeeper is warmed first (``--warm-epochs`` one-record pipelined epochs of a subject of their own), as in
bench_sink: in a JVM started seconds before, a commit costs the server several times the CPU it costs once the JIT
has compiled its request path, and on two cores that CPU is taken from the broker and the job.

CPU per record is printed for this process (its librdkafka threads included), the broker and ZooKeeper, each
over the arm's run.

Wall time runs from the first record returned by ``consume`` (raw) or handed to the job function
(aligned) to the last output committed (raw: ``commit_transaction`` returned; aligned: the last
``step`` returned, i.e. after its ZooKeeper commit). Times from the start of the run (before the
first consume or step) are reported too. The median over rounds is reported.

- **the peer**, when its environment exists (``make peer-venv``; ``--peer yes|no`` to insist or skip): a
  Quix Streams 3.28 application (``experiments/peer_quix.py``) doing the same consume -> identity ->
  produce on the same broker, once exactly-once and once at-least-once, each on its own copy of the round's
  values (no stamps) from the earliest offset under a new consumer group; timed from its first record
  processed to its stop with the last checkpoint committed (its start-up, mostly the group join, is in
  "from run start").

``work`` in the results, per pipeline summed over the rounds: the records and value bytes read back from its output
after each run (not timed) and the Kafka transactions that carried records (the loops count their commits; the
aligned job's are its sink's epochs). The peer's transactions are not counted (its checkpoints keep a cadence of
their own): with the peer, records and bytes are compared, without it all three.

    .venv/bin/python -m experiments.bench_pipeline [--records 300000] [--rounds 3] [--warm-epochs 10000]
        [--peer auto|yes|no]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

from aligner.connectors.kafka import QUIET, consumer_config, ensure_topic
from aligner.connectors.runtime import JobSpec, JobWorker, KeyedState, batch, settle_heap
from aligner.connectors.runtime.job_spec import takes_batch
from aligner.connectors.sink import SinkProducer
from aligner.connectors.source import Records, SourceRecord, source_settings
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from aligner.stamps import HEADER, Stamp
from experiments import ForeignCpu, cpu_seconds
from experiments.common import (
    PRODUCER_SETTINGS,
    WORK_FIELDS,
    Headers,
    Work,
    median_interval,
    read_back,
    topic_ends,
    warm_zookeeper,
    work_results,
    write_results,
)

ROOT = "/bench-pipeline"
PARTITIONS = 4
EPOCH = 10_000
VALUE = b"v" * 100
TARGET = 0.8
TARGET_BATCH = 0.9
"""The goals: the record path at 0.8 of the tuned loop, the batch path at 0.9."""
STAMP_HEADERS: Headers = [(HEADER, Stamp("pipe", 0, 0).encode())]
"""What a stamped epoch's records carry (sink, epoch, attempt); the aligned sink writes dense epochs without it."""




def identity(record: SourceRecord, _state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
    yield record.key, record.value  # type: ignore[misc]


@batch
def identity_batch(records: Records, _state: KeyedState) -> Iterable[tuple[bytes | None, bytes | None]]:
    """The identity as a batch function: one call per fetch, the records' keys and values as columns."""
    return records.pairs()


FUNCTIONS = {"aligned job": identity, "aligned job, batch": identity_batch}
"""The job functions the aligned worker runs, in turn, on the same input (each its own epochs)."""

PEERS = {"Quix Streams, exactly-once": "exactly-once", "Quix Streams, at-least-once": "at-least-once"}
"""The peer (experiments/peer_quix.py in its own virtual environment, ``make peer-venv``) and its guarantees."""
PEER_PYTHON = Path(__file__).resolve().parent / ".peer-venv" / "bin" / "python"


def peer_input(kp: Producer, topic: str, records: int) -> None:
    """The round's input for the peer in a topic of its own: the same values, no stamps (not timed)."""
    for j in range(records):
        while True:
            try:
                kp.produce(topic, VALUE, None, j % PARTITIONS)
                break
            except BufferError:
                kp.poll(0.05)
    kp.flush(60)


def peer_run(python: Path, bootstrap: str, topic: str, out_topic: str, records: int,
             guarantee: str) -> dict[str, float]:
    """One run of the peer application; its own timing (first record processed -> stopped, committed)."""
    script = Path(__file__).resolve().parent / "peer_quix.py"
    done = subprocess.run([str(python), str(script), "--broker", bootstrap, "--input", topic, "--output", out_topic,
                           "--records", str(records), "--guarantee", guarantee],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the peer ({guarantee}) exited {done.returncode}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# ---- input ---------------------------------------------------------------------------------------


def write_epochs(sink: SinkProducer, epochs: int, per_epoch: int) -> tuple[int, int]:
    """Commit ``epochs`` subject epochs of ``per_epoch`` records; returns (first, last) epoch."""
    first = last = -1
    for i in range(epochs):
        e = sink.begin()
        for j in range(per_epoch):
            sink.send(VALUE, partition=sink.partitions[j % len(sink.partitions)])
        sink.commit()
        first = e if i == 0 else first
        last = e
    return first, last


def align_worker(led: Ledger, sink: SinkProducer, worker: JobWorker, console: Console) -> float:
    """Align the worker while tiny epochs keep coming; afterwards it has consumed everything written."""
    quiet = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            while not quiet.is_set():
                write_epochs(sink, 1, 8)
                time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)

    coordinated = threading.Event()

    def stepper() -> None:
        try:
            aligned_steps = 0
            while not (coordinated.is_set() and aligned_steps >= 2) and not stop.is_set():
                worker.step(stop)
                aligned_steps += worker.sources.aligned
        except BaseException as exc:
            errors.append(exc)

    t0 = time.monotonic()
    threads = [threading.Thread(target=writer, daemon=True), threading.Thread(target=stepper, daemon=True)]
    for t in threads:
        t.start()
    try:
        Coordinator(led).align(worker.spec.job, timeout=60)
        coordinated.set()
        threads[1].join(60)
    finally:
        quiet.set()
        threads[0].join(30)
        if threads[1].is_alive():
            stop.set()
            threads[1].join(30)
    if errors:
        raise errors[0]
    last = sink.lease.node.committed_epoch or 0
    source = worker.io.source
    assert source is not None, "the worker is started"
    while source.consumed("in") < last:  # the writer stopped: every step below has its epoch
        worker.step(stop)
    console.print(f"aligned the job in {time.monotonic() - t0:.1f}s; it consumed subject epochs up to {last}")
    return time.monotonic() - t0


# ---- the two pipelines ---------------------------------------------------------------------------


class TunedLoop:
    """The tuned baseline (module docstring): one consumer for every round, as a long-running job keeps one."""

    def __init__(self, bootstrap: str, kp: Producer) -> None:
        self.consumer = Consumer(consumer_config(bootstrap, source_settings("exactly_once")))
        self.kp = kp

    def run(self, topic: str, out_topic: str, records: int, headers: Headers | None = None) -> dict[str, float]:
        consumer, kp = self.consumer, self.kp
        produce = kp.produce
        cpu0, t_start = time.process_time(), time.perf_counter()
        t_first = None
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        consumer.assign(parts)
        metadata = consumer.consumer_group_metadata()
        n = in_tx = transactions = 0
        kp.begin_transaction()
        while n < records:
            msgs = consumer.consume(10000, 0.05)
            if not msgs:
                continue
            if t_first is None:
                t_first = time.perf_counter()
            kept = len(msgs)
            for m in msgs:
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:  # type: ignore[union-attr]
                        kept -= 1
                        continue
                    raise RuntimeError(str(m.error()))
                try:
                    produce(out_topic, m.value(), None, m.partition(), None, None, 0, headers)  # type: ignore[arg-type]
                except BufferError:
                    kp.poll(0.05)
                    produce(out_topic, m.value(), None, m.partition(), None, None, 0, headers)  # type: ignore[arg-type]
            n += kept
            in_tx += kept
            if in_tx >= EPOCH or n >= records:
                kp.send_offsets_to_transaction(consumer.position(parts), metadata, 60)
                kp.commit_transaction(60)
                transactions += 1
                in_tx = 0
                if n < records:
                    kp.begin_transaction()
        t_end = time.perf_counter()
        consumer.unassign()
        assert t_first is not None
        return {"records": n, "seconds": t_end - t_first, "seconds_from_start": t_end - t_start,
                "cpu_us_per_record": (time.process_time() - cpu0) / n * 1e6, "transactions": transactions}

    def close(self) -> None:
        self.consumer.close()


def raw_run(bootstrap: str, topic: str, out_topic: str, kp: Producer, starts: dict[int, int],
            ends: dict[int, int], headers: Headers | None = None) -> dict[str, float]:
    """Consume [starts, ends) of every partition, produce each value, one transaction per EPOCH records
    (with ``headers`` on every record: the stamp, for the loop that pays what the aligned sink must)."""
    consumer = Consumer(consumer_config(bootstrap))
    produce = kp.produce
    cpu0, t_start = time.process_time(), time.perf_counter()
    t_first = None
    consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
    remaining = {p for p in starts if ends[p] > starts[p]}
    n = in_tx = transactions = 0
    kp.begin_transaction()
    while remaining:
        batch = consumer.consume(10000, timeout=0.05)
        if t_first is None and batch:
            t_first = time.perf_counter()
        for m in batch:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(str(err))
            p: int = m.partition()  # type: ignore[assignment]  # a record has both
            o: int = m.offset()  # type: ignore[assignment]
            if o >= ends[p] or p not in remaining:
                remaining.discard(p)
                continue
            while True:
                try:
                    if headers is None:
                        produce(out_topic, m.value(), None, p)
                    else:  # positional, as the sink's Lane.send: keywords cost ~0.25 us per record
                        produce(out_topic, m.value(), None, p, None, None, 0, headers)
                    break
                except BufferError:
                    kp.poll(0.05)
            n += 1
            in_tx += 1
            if in_tx == EPOCH:
                kp.commit_transaction(60)
                transactions += 1
                kp.begin_transaction()
                in_tx = 0
            elif n % 2000 == 0:
                kp.poll(0)
            if o + 1 >= ends[p]:
                remaining.discard(p)
        if remaining:  # commit markers after the last record of the range: stop on position
            for tp in consumer.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
    kp.commit_transaction(60)
    transactions += in_tx > 0  # the last, empty when the range ends on a full transaction, carried nothing
    t_end = time.perf_counter()
    consumer.close()
    assert t_first is not None
    return {"records": n, "seconds": t_end - t_first, "seconds_from_start": t_end - t_start,
            "cpu_us_per_record": (time.process_time() - cpu0) / n * 1e6, "transactions": transactions}


class CountingConsumer:
    """Wraps the source's Kafka consumer to count the messages ``consume`` hands to Python. The count is
    the class's: a source whose watchdog replaces its consumer (a longer fetch wait) is wrapped again by
    :func:`counted` and counts on."""

    messages = 0

    def __init__(self, consumer: Any) -> None:
        self._c = consumer

    def consume(self, num: int = 1, timeout: float = -1) -> Any:
        batch = self._c.consume(num, timeout)
        CountingConsumer.messages += len(batch)
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


def counted(worker: JobWorker) -> None:
    """The worker's source consumer, wrapped for counting (again after a replacement)."""
    assert worker.io.source is not None
    if not isinstance(worker.io.source._consumer, CountingConsumer):
        worker.io.source._consumer = CountingConsumer(worker.io.source._consumer)  # type: ignore[assignment]


class FirstRecord:
    """Installs a job function in the worker, wrapped to note when the first record reaches it."""

    def __init__(self) -> None:
        self.at: float | None = None

    def install(self, worker: JobWorker, fn: Any) -> None:
        """``fn`` (a record or a batch function) as the worker's job function from its next fetch on."""
        def note() -> None:
            if self.at is None:
                self.at = time.perf_counter()

        # Each wrapper puts ``fn`` itself in place once it has noted the time, so the job's calls cost what
        # a user's do (the runtime takes the function once per fetch: the first fetch runs wrapped).
        if takes_batch(fn):
            def wrapped_batch(records: Records, state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
                note()
                worker.fn = fn
                return fn(records, state)

            worker.fn = batch(wrapped_batch)
        else:
            def wrapped(record: SourceRecord, state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
                note()
                worker.fn = fn
                return fn(record, state)

            worker.fn = wrapped

    def reset(self) -> None:
        self.at = None


def aligned_run(worker: JobWorker, first: FirstRecord, fn: Any, epochs: int) -> dict[str, float]:
    stop = threading.Event()
    first.install(worker, fn)
    out0 = worker.records_out
    m0 = CountingConsumer.messages
    assert worker.io.sink is not None, "the worker is started"
    e0 = worker.io.sink.next_epoch
    first.reset()
    cpu0, t_start = time.process_time(), time.perf_counter()
    for _ in range(epochs):
        counted(worker)
        if not worker.step(stop):
            raise RuntimeError("the job stopped early")
    t_end = time.perf_counter()
    assert first.at is not None
    n = worker.records_out - out0
    return {"records": n, "seconds": t_end - first.at, "seconds_from_start": t_end - t_start,
            "consumed_messages": CountingConsumer.messages - m0,
            "transactions": worker.io.sink.next_epoch - e0,  # one Kafka transaction per sink epoch
            "cpu_us_per_record": (time.process_time() - cpu0) / max(n, 1) * 1e6}


# ---- main ----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=300_000, help="records per round (a multiple of 10,000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-epochs", type=int, default=10_000,
                    help="one-record epochs that warm ZooKeeper's JIT before the rounds (0: none)")
    ap.add_argument("--peer", choices=["auto", "yes", "no"], default="auto",
                    help="also run the Quix Streams peer (auto: when `make peer-venv` made its environment)")
    args = ap.parse_args()
    if args.peer == "yes" and not PEER_PYTHON.exists():
        raise SystemExit(f"no peer environment at {PEER_PYTHON}: run `make peer-venv` first")
    peers = PEERS if args.peer == "yes" or (args.peer == "auto" and PEER_PYTHON.exists()) else {}
    epochs = args.records // EPOCH
    console = Console(width=120)
    logging.getLogger("kazoo").setLevel(logging.ERROR)

    results: dict[str, list[dict[str, float]]] = {"tuned": [], "tuned + stamp header": [], "raw": [],
                                                  "raw + stamp header": [],
                                                  **{name: [] for name in (*FUNCTIONS, *peers)}}
    with EmbeddedStack() as info:
        led = Ledger.connect(info.zk, ROOT)
        create_subject(led, info.kafka, "in", PARTITIONS)
        create_subject(led, info.kafka, "out", PARTITIONS)
        ensure_topic(info.kafka, "raw-out", PARTITIONS)
        topic = led.subjects.subject("in").topic
        out_topic = led.subjects.subject("out").topic
        work = {name: Work() for name in results}
        kp = Producer({"bootstrap.servers": info.kafka, "transactional.id": "bench.pipeline.raw",
                       **PRODUCER_SETTINGS, **QUIET})
        kp.init_transactions(30)
        tuned = TunedLoop(info.kafka, kp)
        plain = Producer({"bootstrap.servers": info.kafka, "linger.ms": 20, **QUIET})
        job_led = Ledger.connect(info.zk, ROOT)
        spec = JobSpec(job="pipe", inputs=("in",), output="out", interval=0.05)
        worker = JobWorker(job_led, info.kafka, spec, 0, identity).open()
        settle_heap()  # as `aligner-worker` and the Faust adapter do once their worker is open
        first = FirstRecord()
        counted(worker)
        with SinkProducer(led, info.kafka, "in", "gen", 0, list(range(PARTITIONS))) as sink:
            write_epochs(sink, 3, 8)
            align_s = align_worker(led, sink, worker, console)
            if not worker.sources.aligned:
                raise RuntimeError("the worker is not aligned")
            warm_seconds, warm_zk_ms = warm_zookeeper(led, info.kafka, info.zk_pid, args.warm_epochs, PARTITIONS)
            console.print(f"ZooKeeper warmed by {args.warm_epochs:,} one-record epochs in {warm_seconds:.1f} s "
                          f"({warm_zk_ms:.2f} ms of its CPU per epoch)")
            cpu = ForeignCpu(info.zk_pid, info.kafka_pid)
            for r in range(args.rounds):
                e0, e1 = write_epochs(sink, epochs, EPOCH)  # the first aligned run's input (and the raw loops')
                aligned_runs = 0  # the first aligned run reads the copy written above; each later one writes its own
                starts = {p: sl.start for p, sl in led.epochs.committed("in", e0).slices.items()}
                ends = {p: sl.end for p, sl in led.epochs.committed("in", e1).slices.items()}
                if peers:
                    ensure_topic(info.kafka, f"peer-in-{r}", PARTITIONS)
                    peer_input(plain, f"peer-in-{r}", args.records)
                for k in range(2):  # each tuned arm reads a copy of its own
                    ensure_topic(info.kafka, f"tuned-in-{r}-{k}", PARTITIONS)
                    peer_input(plain, f"tuned-in-{r}-{k}", args.records)
                gc.collect()
                order = ["tuned", "tuned + stamp header", "raw", "raw + stamp header", *FUNCTIONS, *peers]
                order = order[r % len(order):] + order[:r % len(order)]  # each goes first in turn
                for name in order:
                    output = (f"peer-out-{r}-{peers[name]}" if name in peers
                              else out_topic if name in FUNCTIONS else "raw-out")
                    ensure_topic(info.kafka, output, PARTITIONS)
                    since = topic_ends(info.kafka, output, PARTITIONS)
                    if name in FUNCTIONS:
                        if aligned_runs:
                            write_epochs(sink, epochs, EPOCH)  # its own copy, written now: no prefetch of another's
                        aligned_runs += 1
                    others0 = cpu_seconds(info.kafka_pid), cpu_seconds(info.zk_pid)
                    if name == "tuned":
                        res = tuned.run(f"tuned-in-{r}-0", "raw-out", args.records)
                    elif name == "tuned + stamp header":
                        res = tuned.run(f"tuned-in-{r}-1", "raw-out", args.records, STAMP_HEADERS)
                    elif name == "raw":
                        res = raw_run(info.kafka, topic, "raw-out", kp, starts, ends)
                    elif name == "raw + stamp header":
                        res = raw_run(info.kafka, topic, "raw-out", kp, starts, ends, STAMP_HEADERS)
                    elif name in peers:
                        res = peer_run(PEER_PYTHON, info.kafka, f"peer-in-{r}", output, args.records, peers[name])
                    else:
                        res = aligned_run(worker, first, FUNCTIONS[name], epochs)
                    # the broker's and ZooKeeper's CPU during the run (the peer's and the raw loop's start-up included)
                    res["broker_cpu_us_per_record"] = (cpu_seconds(info.kafka_pid) - others0[0]) / args.records * 1e6
                    res["zk_cpu_us_per_record"] = (cpu_seconds(info.zk_pid) - others0[1]) / args.records * 1e6
                    if res["records"] != args.records:
                        raise RuntimeError(f"{name} moved {res['records']} records, expected {args.records}")
                    results[name].append(res)
                    work[name].add(read_back(info.kafka, output, since, int(res.get("transactions", 0))))
                console.print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{n} {v[-1]['records'] / v[-1]['seconds']:,.0f}/s" for n, v in results.items()))
            foreign = cpu.cores()
            assert worker.io.sink is not None, "the worker is started"
            aligned_epochs = [e for e in range(worker.io.sink.next_epoch) if worker.jobs.job_epoch("pipe", e)]
        worker.close()
        tuned.close()
        job_led.close()
        kp.flush(10)
        del kp
        gc.collect()
        led.close()

    rate = {n: statistics.median(r["records"] / r["seconds"] for r in v) for n, v in results.items()}
    rate_start = {n: statistics.median(r["records"] / r["seconds_from_start"] for r in v) for n, v in results.items()}
    cpu_us = {n: statistics.median(r["cpu_us_per_record"] for r in v) for n, v in results.items()
              if all("cpu_us_per_record" in r for r in v)}
    broker_us = {n: statistics.median(r["broker_cpu_us_per_record"] for r in v) for n, v in results.items()}
    zk_us = {n: statistics.median(r["zk_cpu_us_per_record"] for r in v) for n, v in results.items()}
    # Each round's baseline and aligned runs share its conditions: the median of their ratios, and how far it
    # can be trusted, on a shared machine whose speed drifts over a run.
    paired = {name: [t["seconds"] / a["seconds"] for t, a in zip(results["tuned"], results[name], strict=True)]
              for name in FUNCTIONS}
    paired_raw = {name: [t["seconds"] / a["seconds"] for t, a in zip(results["raw"], results[name], strict=True)]
                  for name in FUNCTIONS}
    per_round = paired["aligned job"]
    paired_median = {name: statistics.median(v) for name, v in paired.items()}
    intervals = {name: median_interval(v) for name, v in paired.items()}
    ratio = paired_median["aligned job"]
    ratio_batch = paired_median["aligned job, batch"]
    table = Table(title=f"Consume -> transform -> produce, {args.records:,} records x {args.rounds} rounds "
                        f"(100 B values, {PARTITIONS} partitions, epochs of {EPOCH:,})")
    table.add_column("pipeline")
    table.add_column("records/s (median)", justify="right")
    table.add_column("min .. max", justify="right")
    table.add_column("records/s from run start", justify="right")
    table.add_column("µs CPU/record (this process)", justify="right")
    table.add_column("broker", justify="right")
    table.add_column("ZooKeeper", justify="right")
    table.add_column("ratio vs tuned", justify="right")
    table.add_column("ratio vs raw", justify="right")
    for name, runs in results.items():
        rates = [r["records"] / r["seconds"] for r in runs]
        rt = rate[name] / rate["tuned"]
        goal = TARGET_BATCH if name == "aligned job, batch" else TARGET
        style = "" if name.startswith(("raw", "tuned")) or name in peers else ("green" if rt >= goal else "red")
        table.add_row(name, f"{rate[name]:,.0f}", f"{min(rates):,.0f} .. {max(rates):,.0f}",
                      f"{rate_start[name]:,.0f}", f"{cpu_us[name]:.2f}" if name in cpu_us else "-",
                      f"{broker_us[name]:.2f}", f"{zk_us[name]:.3f}",
                      f"[{style}]{rt:.2f}[/{style}]" if style else f"{rt:.2f}", f"{rate[name] / rate['raw']:.2f}")
    console.print(table)
    console.print("median of per-round ratios to the tuned loop (95 % interval): " + ", ".join(
        f"{name} {m:.2f} ({intervals[name][0]:.2f}..{intervals[name][1]:.2f})" for name, m in paired_median.items())
        + f"; targets {TARGET} and {TARGET_BATCH}: "
        + ("PASS" if ratio >= TARGET and ratio_batch >= TARGET_BATCH else "FAIL"))
    console.print("per-round ratios of the aligned job to the tuned loop: " + ", ".join(f"{x:.2f}" for x in per_round)
                  + f"; {len(aligned_epochs)} aligned job epochs in ZooKeeper")
    console.print("median of per-round ratios to the earlier raw loop: " + ", ".join(
        f"{name} {statistics.median(v):.2f}" for name, v in paired_raw.items()))
    stamped = rate["tuned + stamp header"]
    console.print(f"the tuned loop with a stamp header on every record (what a stamped epoch pays; dense epochs "
                  f"carry none) ran at {stamped / rate['tuned']:.2f} of tuned")
    delivered = statistics.median(r["consumed_messages"] / r["records"] for r in results["aligned job"])
    console.print(f"the aligned source's Consumer.consume returned {delivered:.1f} messages per record processed "
                  f"(the tuned loop: 1.0); the rest lay past the epoch boundary and were dropped, then fetched again")
    console.print(f"other processes kept {foreign:.2f} of {os.cpu_count()} cores busy during the rounds"
                  + (" [red](numbers are noisy: rerun on a quiet machine)[/red]" if foreign > 0.3 else ""))

    doc: dict[str, Any] = {
        "benchmark": "bench_pipeline", "records_per_round": args.records, "rounds": args.rounds,
        "epoch_records": EPOCH, "partitions": PARTITIONS, "value_bytes": len(VALUE),
        "producer_settings": PRODUCER_SETTINGS, "runs": results,
        "records_per_s_median": rate, "records_per_s_from_start_median": rate_start,
        "baseline": "tuned", "cpu_us_per_record": cpu_us, "broker_cpu_us_per_record": broker_us,
        "zk_cpu_us_per_record": zk_us,
        "ratio": ratio, "ratio_per_round": per_round, "target": TARGET, "pass": ratio >= TARGET,
        "ratio_batch": ratio_batch, "target_batch": TARGET_BATCH,
        "ratio_per_round_median": paired_median,
        "ratio_per_round_interval": intervals,
        "ratio_vs_raw_per_round_median": {name: statistics.median(v) for name, v in paired_raw.items()},
        "ratio_stamped_tuned": stamped / rate["tuned"], "ratio_vs_stamped_tuned": rate["aligned job"] / stamped,
        "ratio_batch_vs_stamped_tuned": rate["aligned job, batch"] / stamped,
        "align_seconds": align_s, "foreign_cpu_cores": foreign, "zk_warm_epochs": args.warm_epochs,
        "aligned_messages_consumed_per_record": delivered,
        "peer": {name: {"guarantee": g, "ratio": rate[name] / rate["tuned"],
                        "ratio_from_start": rate_start[name] / rate_start["tuned"]} for name, g in peers.items()},
        **work_results(work, ("records", "bytes") if peers else WORK_FIELDS),
    }
    written = write_results("bench_pipeline", doc)
    console.print(f"wrote {written.relative_to(Path.cwd()) if written.is_relative_to(Path.cwd()) else written}")


if __name__ == "__main__":
    main()
