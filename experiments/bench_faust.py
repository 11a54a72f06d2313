"""A Faust aligned job against a plain Faust agent doing the same transform, on the same committed input.

Both arms run the transform of ``experiments/faust_job.py``'s ``tag``: each output value is
``{"in": input value, "src": [topic or subject, partition, offset, epoch], "seen": n, "v": 1}`` where ``seen``
counts the inputs per key (the key, or the partition when a record has none); the output keeps the input's key.
Input records are 100-byte JSON values without keys, round-robin over 4 partitions.

- **aligned**: a Faust worker (``python -m experiments.bench_faust worker``, ``aligned.faust_app()``) running
  ``tag`` as an ``aligned.job`` (``aligner.connectors.faust``) from subject ``bf-in`` to subject ``bf-out``: it reads
  committed subject epochs exactly (stamps checked) through the aligned source, calls ``tag`` per record with the
  job's ``KeyedState``, writes through the stamped transactional sink, one Kafka transaction per job epoch, and
  commits input offsets, state and output in one ZooKeeper multi-op: exactly-once aligned output. It is aligned by
  the coordinator once, before the rounds (tiny epochs flowing), and restarts aligned each round from its last
  committed epoch. Each round's input is ``--records`` records written into ``bf-in`` by a ``SinkProducer`` in
  subject epochs of 10,000 before the worker starts. Settings: ``aligned.faust_app``'s (in-memory store, 1-partition
  internal topics, its group timeouts), job epochs of ``interval`` 0.3 s; the sink's librdkafka producer is
  ``producer_config`` (linger ``LINGER_MS`` 1 s, ``batch.num.messages`` 10,000, batch and message size at
  librdkafka's 1,000,000 bytes), the source's consumer ``consumer_config`` (16 MiB per partition, 64 MiB per fetch,
  0.5 s fetch wait, ``queued.min.messages`` 200,000, read_committed).
- **plain**: a Faust worker on a plain ``faust.App``, tuned as a performance-minded user would (``PLAIN_SETTINGS``):
  the aligned sink's producer batching (Faust's ``producer_linger`` 1 s = ``LINGER_MS``, ``producer_max_batch_size``
  and ``producer_max_request_size`` 1,000,000 bytes: librdkafka's defaults, which the sink keeps), the aligned
  source's per-partition fetch size (``consumer_max_fetch_size`` 16 MiB) and the aligned job's commit interval
  (``broker_commit_interval`` 0.3 s; a Faust commit flushes the producer first, as the aligned commit flushes the
  sink), other settings Faust's defaults. One ``@app.agent`` on a plain topic holding the round's own copy of the
  same values (written by a plain confluent-kafka producer with ``PRODUCER_SETTINGS``, same partitions), computing
  the same value per event with ``seen`` kept in a Python dict (not a Faust table: no changelog, so this arm does
  less work on state) and ``await out.send(key=..., value=..., partition=<the input's>)`` to a plain output topic.
  A new app id (consumer group) per round, reading from the earliest offset (Faust's default). The guarantee is
  Faust's default, **at-least-once**: offsets are committed to the group after the fact, output is not
  transactional, and Faust's ``exactly_once`` guarantee cannot run here at all: Faust's Kafka client (aiokafka)
  cannot start a transactional producer on the embedded broker (Tansu rejects its InitProducerId; see
  ``aligner.connectors.faust``).

Both workers run with ``-l warn`` and hold aiokafka's, Faust's, mode's, aligner's and kazoo's loggers at WARNING
(``QUIET_LOGGERS``): Faust's worker sets the root logger to DEBUG at ``-l warn`` (for its start-up spinner) and
never sets it back, so without this every per-message ``log.debug`` builds a record the console handler drops.

Both arms start a fresh worker process each round after the round's input is committed, arms in alternating
order. Timed, inside the worker process (monotonic clock): from the first record handed to the function or agent
to the last output: aligned, the return of the ZooKeeper commit of the job epoch holding the last record (the
worker's ``committed`` line); plain, the broker's acknowledgement of the last output record (the send callback;
with Faust's default ``stream_publish_on_commit`` off, a send goes to aiokafka's producer at once, which sends it
when its batch fills, its linger ends or a commit flushes it). Faust's start-up (process start, consumer group join,
the aligned job's open) is excluded and reported apart (start of the process to first record). CPU per record is
the worker process's own CPU (``time.process_time()``: every thread, Faust's loop, librdkafka's and aiokafka's
work; not the broker's nor ZooKeeper's) over the same span. The median over rounds is reported; the ratio is the
median of per-round ratios aligned/plain.

``work`` per arm, summed over the rounds: the records and value bytes read back from the arm's output after each
round, not timed (aligned: the committed records since the round began; plain: a new output topic per round, read
to its end). Records are compared; bytes and transactions differ by design (the ``src`` field
names a subject and an epoch on one side, a topic on the other; the plain arm has no transactions).

    python -m experiments.bench_faust [--records 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from aligner.connectors.kafka import LINGER_MS, QUIET, ensure_topic
from aligner.connectors.runtime import KeyedState
from aligner.connectors.sink import SinkProducer
from aligner.connectors.source import SourceRecord
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from experiments.common import (
    PRODUCER_SETTINGS,
    EventLines,
    Work,
    median_interval,
    read_back,
    read_back_eof,
    topic_ends,
    work_results,
    write_results,
)

ROOT = "/bench-faust"
ROOT_DIR = Path(__file__).resolve().parent.parent
PARTITIONS = 4
EPOCH = 10_000
JOB = "bench-faust"
IN, OUT = "bf-in", "bf-out"
BOUND = 300.0
"""Seconds a worker may take for one step (start, a round) before the run fails: a liveness bound, not a figure."""

ARM = os.environ.get("BENCH_FAUST_ARM", "")
"""Set in the worker processes: ``aligned`` or ``plain``."""


def json_record(i: int) -> bytes:
    """Record ``i``: a 100-byte JSON value."""
    head = f'{{"i": {i}, "pad": "'
    return (head + "x" * (98 - len(head)) + '"}').encode()


def say(line: str) -> None:
    """An event line to the real stdout (the faust CLI redirects sys.stdout into its log)."""
    out = sys.__stdout__
    assert out is not None
    out.write(f"\n{line}\n")
    out.flush()


def stamp() -> str:
    return f"t={time.monotonic():.6f} cpu={time.process_time():.6f}"


def tag(record: SourceRecord, state: KeyedState) -> Iterator[tuple[bytes | None, bytes]]:
    """``experiments.faust_job.tag`` (version 1)."""
    key = record.key.decode() if record.key else str(record.partition)
    seen = state.get(key, 0) + 1
    state.put(key, seen)
    out = {"in": json.loads(record.value or b"null"), "src": [record.subject, record.partition, record.offset,
                                                              record.epoch], "seen": seen, "v": 1}
    yield record.key, json.dumps(out).encode()


# ---- the worker processes (BENCH_FAUST_ARM set) --------------------------------------------------------------

PLAIN_SETTINGS: dict[str, Any] = {
    "producer_linger": LINGER_MS / 1000,
    "producer_max_batch_size": 1_000_000,
    "producer_max_request_size": 1_000_000,
    "consumer_max_fetch_size": 16 * 1024 * 1024,
    "broker_commit_interval": 0.3,
}
"""The plain app's Faust settings, matched to the aligned arm where they overlap: the aligned sink's producer
lingers ``LINGER_MS`` (1 s) with librdkafka's default batch and message size (1,000,000 bytes); its source fetches up
to 16 MiB per partition (``consumer_config``'s ``max.partition.fetch.bytes``); the aligned job commits every 0.3 s
(``interval``), and a Faust commit flushes the producer before committing offsets, as the aligned commit flushes
the sink's. Faust's defaults are a linger of 0 and 16 KiB batches (a produce request every few records), 4 MiB
fetches and a commit every 2.8 s. Not settable through Faust: aiokafka's fetch wait (Faust fixes 1.5 s; the aligned
source waits 0.5 s, which matters only when caught up) and its total fetch size (aiokafka's 50 MiB; 64 MiB)."""

QUIET_LOGGERS = ("aiokafka", "faust", "mode", "aligner", "kazoo")
"""Loggers held at WARNING in both workers. The worker runs with ``-l warn``, but Faust's worker then sets the root
logger to DEBUG for its start-up spinner (``faust.Worker._setup_spinner_handler``: only the console handler gets
the WARN level) and never sets it back, so every ``log.debug`` of aiokafka's and Faust's per-message paths builds
a log record that the handler then drops (11 % of a plain worker's samples before). A user setting the levels of
the libraries' own loggers keeps them at warning whatever the root logger's level."""


def quiet_debug() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


if ARM:
    quiet_debug()

if ARM == "aligned":
    import aligner.connectors.faust as aligned

    app = aligned.faust_app(f"bench-faust-aligned-{os.environ.get('BENCH_FAUST_ROUND', '0')}")
    _first = [True]

    def timed_tag(record: SourceRecord, state: KeyedState) -> Iterator[tuple[bytes | None, bytes]]:
        if _first[0]:
            _first[0] = False
            say(f"first {stamp()}")
        return tag(record, state)

    aligned.job(app, job_id=JOB, inputs=[IN], output=OUT, interval=0.3,
                report=lambda line: say(f"{line} {stamp()}"))(timed_tag)
elif ARM == "plain":
    import faust

    _round = os.environ.get("BENCH_FAUST_ROUND", "0")
    app = faust.App(f"bench-faust-plain-{_round}", broker=f"kafka://{os.environ['ALIGNER_KAFKA']}",
                    datadir=os.environ["FAUST_DATADIR"], **PLAIN_SETTINGS)
    _expected = int(os.environ["BENCH_FAUST_RECORDS"])
    _in_topic = app.topic(os.environ["BENCH_FAUST_INPUT"], key_type=bytes, value_type=bytes,
                          key_serializer="raw", value_serializer="raw")
    _out_topic = app.topic(os.environ["BENCH_FAUST_OUTPUT"], key_type=bytes, value_type=bytes, key_serializer="raw",
                           value_serializer="raw")

    def _done(_fut: Any) -> None:
        say(f"done {stamp()}")

    @app.agent(_in_topic)
    async def forward(stream: Any) -> None:
        seen: dict[str, int] = {}
        n = 0
        async for event in stream.events():
            if n == 0:
                say(f"first {stamp()}")
            n += 1
            msg = event.message
            k = event.key
            key = k.decode() if k else str(msg.partition)
            count = seen[key] = seen.get(key, 0) + 1
            out = {"in": json.loads(event.value or b"null"), "src": [msg.topic, msg.partition, msg.offset, None],
                   "seen": count, "v": 1}
            await _out_topic.send(key=k, value=json.dumps(out).encode(), partition=msg.partition,
                                  callback=_done if n == _expected else None)


# ---- the benchmark ---------------------------------------------------------------------------------------------


class Worker(EventLines):
    """A Faust worker process of one arm whose event lines can be awaited."""

    def __init__(self, env: dict[str, str]) -> None:
        self.started = time.monotonic()
        super().__init__("experiments.bench_faust", ROOT_DIR, env, BOUND)

    def wait(self, event: str) -> dict[str, str]:
        """The fields (``name=value``) of the worker's next ``event`` line."""
        words = self.next_line(event).split()
        fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        if len(words) > 1 and "=" not in words[1]:
            fields["epoch"] = words[1]
        return fields

    def stop(self) -> None:
        """SIGTERM, then wait (a kill if it outlasts the bound)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def write_epochs(sink: SinkProducer, start: int, records: int, per_epoch: int) -> None:
    """``records`` JSON records numbered from ``start`` in subject epochs of ``per_epoch``."""
    for s in range(start, start + records, per_epoch):
        sink.begin()
        for i in range(s, min(s + per_epoch, start + records)):
            sink.send(json_record(i), partition=i % PARTITIONS)
        sink.commit()


def align(led: Ledger, sink: SinkProducer, env: dict[str, str]) -> float:
    """Start the aligned worker, align it while tiny epochs flow, let it drain them, stop it."""
    t0 = time.monotonic()
    worker = Worker(env)
    stop = threading.Event()
    fed = [0]
    errors: list[BaseException] = []

    def feed() -> None:
        try:
            while not stop.is_set():
                write_epochs(sink, 0, 8, 8)
                fed[0] += 8
                stop.wait(0.1)
        except BaseException as exc:
            errors.append(exc)

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        worker.wait("open")
        feeder.start()
        Coordinator(led).align(JOB, timeout=120)
        while True:  # aligned from the decided epoch on
            if worker.wait("committed").get("aligned") == "True":
                break
        stop.set()
        feeder.join(30)
        if errors:
            raise errors[0]
        while int(worker.wait("committed")["in"]) < fed[0]:
            pass
    finally:
        stop.set()
        worker.stop()
    return time.monotonic() - t0


def aligned_round(env: dict[str, str], records: int) -> dict[str, float]:
    worker = Worker(env)
    try:
        worker.wait("open")
        first = worker.wait("first")
        while True:
            last = worker.wait("committed")
            if last.get("aligned") != "True":
                raise RuntimeError(f"the aligned worker committed an unaligned epoch: {last}")
            if int(last["out"]) >= records:
                break
    finally:
        worker.stop()
    if int(last["out"]) != records:
        raise RuntimeError(f"the aligned worker wrote {last['out']} records, expected {records}")
    return span(worker, first, last, records)


def plain_round(env: dict[str, str], records: int) -> dict[str, float]:
    worker = Worker(env)
    try:
        first = worker.wait("first")
        last = worker.wait("done")
    finally:
        worker.stop()
    return span(worker, first, last, records)


def span(worker: Worker, first: dict[str, str], last: dict[str, str], records: int) -> dict[str, float]:
    seconds = float(last["t"]) - float(first["t"])
    return {"records": records, "seconds": seconds, "records_per_s": records / seconds,
            "cpu_us_per_record": (float(last["cpu"]) - float(first["cpu"])) / records * 1e6,
            "start_s": float(first["t"]) - worker.started}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000, help="records per round and arm")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    arms = ("aligned", "plain")
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    work = {a: Work() for a in arms}
    load: list[float] = []
    with EmbeddedStack() as info, tempfile.TemporaryDirectory(prefix="bench-faust-") as home:
        led = Ledger.connect(info.zk, ROOT)
        create_subject(led, info.kafka, IN, PARTITIONS)
        out_topic = create_subject(led, info.kafka, OUT, PARTITIONS).topic
        base = {"ALIGNER_ZK": info.zk, "ALIGNER_KAFKA": info.kafka, "ALIGNER_ROOT": ROOT, "ALIGNER_HOME": home,
                "BENCH_FAUST_RECORDS": str(args.records)}
        plain_producer = Producer({"bootstrap.servers": info.kafka, **PRODUCER_SETTINGS, **QUIET})
        with SinkProducer(led, info.kafka, IN, "gen", 0, list(range(PARTITIONS))) as sink:
            align_s = align(led, sink, {**base, "BENCH_FAUST_ARM": "aligned"})
            print(f"aligned the Faust job in {align_s:.1f}s", flush=True)
            for r in range(args.rounds):
                write_epochs(sink, 0, args.records, EPOCH)
                plain_in, plain_out = f"bf-plain-in-{r}", f"bf-plain-out-{r}"
                ensure_topic(info.kafka, plain_in, PARTITIONS)
                ensure_topic(info.kafka, plain_out, PARTITIONS)
                for i in range(args.records):
                    while True:
                        try:
                            plain_producer.produce(plain_in, json_record(i), None, i % PARTITIONS)
                            break
                        except BufferError:
                            plain_producer.poll(0.05)
                plain_producer.flush(60)
                order = arms if r % 2 == 0 else arms[::-1]
                for arm in order:
                    since = topic_ends(info.kafka, out_topic, PARTITIONS) if arm == "aligned" else {}
                    load.append(os.getloadavg()[0])
                    env = {**base, "BENCH_FAUST_ARM": arm, "BENCH_FAUST_ROUND": str(r)}
                    if arm == "aligned":
                        runs[arm].append(aligned_round(env, args.records))
                        work[arm].add(read_back(info.kafka, out_topic, since))
                    else:
                        runs[arm].append(plain_round({**env, "BENCH_FAUST_INPUT": plain_in,
                                                      "BENCH_FAUST_OUTPUT": plain_out,
                                                      "FAUST_DATADIR": str(Path(home) / f"plain-{r}")}, args.records))
                        work[arm].add(read_back_eof(info.kafka, plain_out, PARTITIONS))
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{a} {v[-1]['records_per_s']:,.0f}/s ({v[-1]['cpu_us_per_record']:.0f} µs CPU/record, "
                    f"start {v[-1]['start_s']:.1f}s)" for a, v in runs.items()), flush=True)
        plain_producer.flush(10)
        led.close()

    rate = {a: statistics.median(r["records_per_s"] for r in v) for a, v in runs.items()}
    cpu = {a: statistics.median(r["cpu_us_per_record"] for r in v) for a, v in runs.items()}
    start = {a: statistics.median(r["start_s"] for r in v) for a, v in runs.items()}
    per_round = [a["records_per_s"] / p["records_per_s"] for a, p in zip(runs["aligned"], runs["plain"], strict=True)]
    ratio = statistics.median(per_round)
    interval = median_interval(per_round)
    for a in arms:
        print(f"{a:8s} {rate[a]:10,.0f} records/s  {cpu[a]:7.1f} µs CPU/record (worker process)  "
              f"start-up {start[a]:.1f}s (excluded)")
    print(f"aligned/plain = {ratio:.2f} (per-round {', '.join(f'{x:.2f}' for x in per_round)}); "
          f"load average {statistics.median(load):.1f} on {os.cpu_count()} cores")
    write_results("bench_faust", {
        "benchmark": "bench_faust", "records_per_round": args.records, "rounds": args.rounds,
        "partitions": PARTITIONS, "epoch_records": EPOCH, "value_bytes": len(json_record(0)),
        "plain_guarantee": "at-least-once (Faust's default)", "plain_settings": PLAIN_SETTINGS,
        "quiet_loggers": list(QUIET_LOGGERS), "runs": runs, "records_per_s_median": rate,
        "cpu_us_per_record": cpu, "start_s_median": start, "ratio": ratio, "ratio_per_round": per_round,
        "ratio_interval": interval, "align_seconds": align_s, "load_average": load,
        **work_results(work, ("records",)),
    })


if __name__ == "__main__":
    if ARM:
        app.main()
    else:
        main()
