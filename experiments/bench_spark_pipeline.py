"""A Spark aligned streaming query against a plain Spark streaming pipeline doing the same read -> transform -> write.

Spark's own ``format("kafka")`` is not available here (pyspark ships no Kafka connector jars and the machines
fetch none), so the baseline is the plain Kafka pipeline a user would write with the same Python Data Source API
the product uses, defined in this file (``plainkafka``), with the clients the product uses (confluent-kafka):

- **aligned**: ``spark.readStream.format("aligned")`` on subject ``sp-in`` (bytes values, no options beyond the
  connection and ``settleHeap``: every committed epoch since the last batch; epochs read exactly, stamps checked,
  one task per Kafka partition) -> ``select("key", "value")`` -> ``writeStream.format("aligned")`` to subject
  ``sp-out`` (stamped transactional sink: per micro-batch one output epoch, one Kafka transaction per write task,
  committed in ZooKeeper with the batch's lineage): exactly-once output.
- **plain**: ``spark.readStream.format("plainkafka")`` on a plain topic holding the same values (written in
  transactions of 10,000, as the aligned input's epochs): offsets are ``{partition: offset}``, ``latestOffset``
  the partitions' end offsets (everything written since the last batch),
  one input partition per Kafka partition read by an assign-only confluent-kafka ``Consumer`` with
  ``consumer_config`` (the settings the aligned source's consumer starts from), ``consume(10000)`` until its
  position reaches the batch's end, rows handed to Spark as Arrow batches (as the aligned source does) ->
  the same ``select("key", "value")`` -> ``writeStream.format("plainkafka")``: each write task a plain
  (non-transactional) confluent-kafka ``Producer`` with ``PRODUCER_SETTINGS`` (the sink's batching settings),
  every value produced to the output partition numbered as the task, then ``flush``; the commit does nothing.
  At-least-once: no transactions, no stamps, no ZooKeeper.

Both at ``local[2]`` in one session, each query with a checkpoint of its own that it keeps across rounds. Each
round writes ``--records`` 100-byte values into each arm's input (aligned: a ``SinkProducer`` in subject epochs of
10,000; plain: a plain producer, the same partitions), then, arms in alternating order, starts the arm's query
(default trigger), waits for its output to hold every record and stops it between micro-batches. One unmeasured
warm-up round of 10,000 records per arm comes first (the JVM, the Python workers).

Timed from Spark's own progress reports: from the start of the first micro-batch that read rows to the end of the
last (its ``timestamp`` plus ``triggerExecution``): query start-up is excluded (reported apart). CPU per record is
the CPU of this process tree except the broker and ZooKeeper: the driver's Python, the Spark JVM (driver and the
local executor) and the executors' Python workers (live ones, and exited ones through their parent's children
time), from ``/proc``, over the query's life from ``start()`` to its last output (start-up and idle polling
included, so it is an upper bound of the per-record cost for both arms). The median over rounds is reported; the
ratio is the median of per-round ratios aligned/plain.

``work`` per arm, summed over the measured rounds: the records and value bytes read back from the arm's output after
each round, not timed (aligned: the committed records since the round began; plain: a new output topic per round,
read to its end: the embedded broker's ListOffsets cannot say where a topic without commit markers ends). Records
and bytes are compared; the plain arm has no transactions.

    python -m experiments.bench_spark_pipeline [--records 300000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from aligner.connectors.kafka import QUIET, consumer_config, end_offsets, ensure_topic
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from experiments import cpu_seconds, stat_fields
from experiments.common import (
    PRODUCER_SETTINGS,
    Work,
    batch_ended,
    batch_started,
    median_interval,
    read_back,
    read_back_eof,
    topic_ends,
    value,
    work_results,
    write_results,
)

ROOT = "/bench-spark-pipeline"
ROOT_DIR = Path(__file__).resolve().parent.parent
PARTITIONS = 4
EPOCH = 10_000
IN, OUT = "sp-in", "sp-out"
PLAIN_IN, PLAIN_OUT = "sp-plain-in", "sp-plain-out"
WARMUP = 10_000
BOUND = 600.0
"""Seconds a query may take for a round before the run fails: a liveness bound, not a figure."""

PLAIN_SCHEMA = StructType([StructField("key", BinaryType(), True), StructField("value", BinaryType(), True),
                           StructField("partition", IntegerType(), True), StructField("offset", LongType(), True)])


# ---- the plain Kafka data source ---------------------------------------------------------------------------------


@dataclass
class PlainPartition(InputPartition):
    partition: int
    start: int
    end: int


class PlainKafkaSource(DataSource):
    """``format("plainkafka")``: options ``kafka`` (bootstrap), ``topic``, ``partitions``."""

    @classmethod
    def name(cls) -> str:
        return "plainkafka"

    def schema(self) -> StructType:
        return PLAIN_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PlainKafkaReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return PlainKafkaWriter(self.options)


class PlainKafkaReader(DataSourceStreamReader):
    def __init__(self, options: Any) -> None:
        self.kafka = str(options["kafka"])
        self.topic = str(options["topic"])
        self.partitions_n = int(options["partitions"])

    def initialOffset(self) -> dict:
        return {str(p): 0 for p in range(self.partitions_n)}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Everything written since ``start`` (the default read limit, ``ReadAllAvailable``)."""
        ends = end_offsets(self.kafka, self.topic, list(range(self.partitions_n)))
        return {str(p): int(o) for p, o in ends.items()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [PlainPartition(int(p), int(start[p]), int(end[p])) for p in sorted(end, key=int)
                if int(end[p]) > int(start[p])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        assert isinstance(partition, PlainPartition)
        p, end = partition.partition, partition.end
        consumer = Consumer(consumer_config(self.kafka))
        try:
            consumer.assign([TopicPartition(self.topic, p, partition.start)])
            position = partition.start
            while position < end:
                keys: list[bytes | None] = []
                values: list[bytes | None] = []
                offsets: list[int] = []
                for m in consumer.consume(10000, timeout=0.05):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise RuntimeError(str(err))
                    o: int = m.offset()  # type: ignore[assignment]  # a record has one
                    if o < end:
                        keys.append(m.key())
                        values.append(m.value())
                        offsets.append(o)
                if offsets:
                    n = len(offsets)
                    yield pa.RecordBatch.from_arrays(
                        [pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
                         pa.array([p] * n, pa.int32()), pa.array(offsets, pa.int64())],
                        names=["key", "value", "partition", "offset"])
                position = consumer.position([TopicPartition(self.topic, p)])[0].offset
        finally:
            consumer.close()

    def commit(self, end: dict) -> None:
        pass


@dataclass
class Written(WriterCommitMessage):
    records: int


class PlainKafkaWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Any) -> None:
        self.kafka = str(options["kafka"])
        self.topic = str(options["topic"])
        self.partitions_n = int(options["partitions"])

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from confluent_kafka import Producer
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = (context.partitionId() if context is not None else 0) % self.partitions_n
        producer = Producer({"bootstrap.servers": self.kafka, **PRODUCER_SETTINGS, **QUIET})
        produce, topic, n = producer.produce, self.topic, 0
        for batch in iterator:
            keys = batch.column("key").to_pylist()
            values = batch.column("value").to_pylist()
            for k, v in zip(keys, values, strict=True):
                try:
                    produce(topic, v, k, partition)
                except BufferError:
                    producer.poll(0.05)
                    produce(topic, v, k, partition)
            n += len(values)
        if producer.flush(60) != 0:
            raise RuntimeError("the plain sink's producer did not deliver every record in 60 s")
        return Written(n)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


# ---- measuring ---------------------------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if not fields:
            continue
        ppid = int(fields[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _reaped_seconds(pid: int) -> float:
    """CPU seconds of ``pid``'s children that ended and were waited for (cutime + cstime)."""
    fields = stat_fields(pid)
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def tree_cpu(exclude: set[int]) -> float:
    """CPU seconds of this process and its descendants, except the subtrees of ``exclude`` (broker, ZooKeeper)."""
    kids = _children()
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in exclude:
            continue
        total += cpu_seconds(pid) + (0.0 if pid == os.getpid() else _reaped_seconds(pid))
        todo += kids.get(pid, [])
    return total


def run_query(spark: Any, arm: str, conn: dict[str, str], checkpoint: str, records: int, exclude: set[int],
              plain_out: str = "") -> dict[str, float]:
    """Start the arm's query, wait until it read ``records`` rows in batches that completed, stop it."""
    from aligner.connectors.spark.job import stop_query

    if arm == "aligned":
        reader = spark.readStream.format("aligned").options(**conn, subject=IN, settleHeap="true")
        writer_opts = {**conn, "subject": OUT, "sinkId": "bench-pipeline", "settleHeap": "true"}
        fmt = "aligned"
    else:
        reader = spark.readStream.format("plainkafka").options(kafka=conn["kafka"], topic=PLAIN_IN,
                                                               partitions=str(PARTITIONS))
        writer_opts = {"kafka": conn["kafka"], "topic": plain_out, "partitions": str(PARTITIONS)}
        fmt = "plainkafka"
    cpu0, t0 = tree_cpu(exclude), time.time()
    query = (reader.load().select("key", "value").writeStream.format(fmt).options(**writer_opts)
             .option("checkpointLocation", checkpoint).start())
    try:
        deadline = time.monotonic() + BOUND
        while True:
            batches = [p for p in query.recentProgress if p.get("numInputRows")]
            done = sum(int(p["numInputRows"]) for p in batches)
            if done >= records:
                break
            if query.exception() is not None:
                raise RuntimeError(f"the {arm} query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {arm} query read {done} of {records} rows in {BOUND:.0f}s")
            time.sleep(0.05)
        cpu1 = tree_cpu(exclude)
    finally:
        stop_query(query)
    if done != records:
        raise RuntimeError(f"the {arm} query read {done} rows, expected {records}")
    first, last = batch_started(batches[0]), batch_ended(batches[-1])
    return {"records": done, "seconds": last - first, "records_per_s": done / (last - first),
            "cpu_us_per_record": (cpu1 - cpu0) / done * 1e6, "start_s": first - t0, "batches": len(batches)}


def write_plain(producer: Any, start: int, records: int) -> None:
    """The plain arm's input: transactions of 10,000 records (as the aligned input's epochs), so a commit marker
    ends each partition and ListOffsets answers its end (the embedded broker's ListOffsets answers the last batch's
    base offset + 1)."""
    for s in range(start, start + records, EPOCH):
        producer.begin_transaction()
        for i in range(s, min(s + EPOCH, start + records)):
            while True:
                try:
                    producer.produce(PLAIN_IN, value(i), None, i % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.commit_transaction(60)


def write_aligned(sink: SinkProducer, start: int, records: int) -> None:
    for s in range(start, start + records, EPOCH):
        sink.begin()
        for i in range(s, min(s + EPOCH, start + records)):
            sink.send(value(i), partition=i % PARTITIONS)
        sink.commit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=300_000, help="records per round and arm")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    # The Python workers import this module to run the plain data source.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT_DIR), os.environ.get("PYTHONPATH")) if p)
    from confluent_kafka import Producer

    from aligner.connectors.spark.session import local_session

    arms = ("aligned", "plain")
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    work = {a: Work() for a in arms}
    load: list[float] = []
    with EmbeddedStack() as info, tempfile.TemporaryDirectory(prefix="bench-spark-pipeline-") as tmp:
        led = Ledger.connect(info.zk, ROOT)
        create_subject(led, info.kafka, IN, PARTITIONS, value_format="bytes")
        out_topic = create_subject(led, info.kafka, OUT, PARTITIONS, value_format="bytes").topic
        ensure_topic(info.kafka, PLAIN_IN, PARTITIONS)
        spark = local_session("local[2]", "bench-spark-pipeline", **{"spark.ui.showConsoleProgress": "false"})
        # By reference (this module by name, not __main__): the Python workers import it.
        from experiments.bench_spark_pipeline import PlainKafkaSource as Registered

        spark.dataSource.register(Registered)
        conn = {"zk": info.zk, "kafka": info.kafka, "root": ROOT}
        exclude = {info.zk_pid, info.kafka_pid}
        producer = Producer({"bootstrap.servers": info.kafka, "transactional.id": "bench-spark-pipeline.input",
                             **PRODUCER_SETTINGS, **QUIET})
        producer.init_transactions(30)
        checkpoints = {a: str(Path(tmp) / a) for a in arms}
        with SinkProducer(led, info.kafka, IN, "gen", 0, list(range(PARTITIONS))) as sink:
            write_aligned(sink, 0, WARMUP)
            write_plain(producer, 0, WARMUP)
            ensure_topic(info.kafka, f"{PLAIN_OUT}-warm", PARTITIONS)
            for arm in arms:  # warm-up: the JVM, the Python workers, the first query plans
                warm = run_query(spark, arm, conn, checkpoints[arm], WARMUP, exclude, f"{PLAIN_OUT}-warm")
                print(f"warm-up {arm}: start-up {warm['start_s']:.1f}s", flush=True)
            for r in range(args.rounds):
                write_aligned(sink, 0, args.records)
                write_plain(producer, 0, args.records)
                plain_out = f"{PLAIN_OUT}-{r}"
                ensure_topic(info.kafka, plain_out, PARTITIONS)
                for arm in (arms if r % 2 == 0 else arms[::-1]):
                    since = topic_ends(info.kafka, out_topic, PARTITIONS) if arm == "aligned" else {}
                    load.append(os.getloadavg()[0])
                    runs[arm].append(run_query(spark, arm, conn, checkpoints[arm], args.records, exclude, plain_out))
                    work[arm].add(read_back(info.kafka, out_topic, since) if arm == "aligned"
                                  else read_back_eof(info.kafka, plain_out, PARTITIONS))
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{a} {v[-1]['records_per_s']:,.0f}/s ({v[-1]['cpu_us_per_record']:.0f} µs CPU/record, "
                    f"{v[-1]['batches']:.0f} batches, start-up {v[-1]['start_s']:.1f}s)" for a, v in runs.items()),
                    flush=True)
        spark.stop()
        producer.flush(10)
        led.close()

    rate = {a: statistics.median(r["records_per_s"] for r in v) for a, v in runs.items()}
    cpu = {a: statistics.median(r["cpu_us_per_record"] for r in v) for a, v in runs.items()}
    per_round = [a["records_per_s"] / p["records_per_s"] for a, p in zip(runs["aligned"], runs["plain"], strict=True)]
    ratio = statistics.median(per_round)
    for a in arms:
        print(f"{a:8s} {rate[a]:10,.0f} records/s  {cpu[a]:7.1f} µs CPU/record (driver, JVM, Python workers)")
    print(f"aligned/plain = {ratio:.2f} (per-round {', '.join(f'{x:.2f}' for x in per_round)}); "
          f"load average {statistics.median(load):.1f} on {os.cpu_count()} cores")
    write_results("bench_spark_pipeline", {
        "benchmark": "bench_spark_pipeline", "records_per_round": args.records, "rounds": args.rounds,
        "partitions": PARTITIONS, "epoch_records": EPOCH, "value_bytes": len(value(0)),
        "plain_guarantee": "at-least-once", "runs": runs, "records_per_s_median": rate, "cpu_us_per_record": cpu,
        "ratio": ratio, "ratio_per_round": per_round, "ratio_interval": median_interval(per_round),
        "load_average": load, **work_results(work, ("records", "bytes")),
    })


if __name__ == "__main__":
    main()
