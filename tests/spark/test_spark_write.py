"""Aligned streaming writes on real PySpark local[2, 2]: task retries never duplicate."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from aligner.connectors.reader import EpochReader, EpochRecord
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from tests.helpers import SPARK_TEST_JVM, json_value, raw_count

pytest.importorskip("pyspark")


RECORDS = 200
LIVE = 300
"""Liveness bound (seconds) on a query's run: generous, for a busy machine; never a speed check."""


@pytest.fixture(scope="module")
def spark():
    from aligner.connectors.spark.session import local_session
    from tests import spark_faults

    # local[2,2]: a failed task is retried once. Small Arrow batches let the injected fault hit mid-task.
    session = local_session("local[2,2]", "test-spark-write", **SPARK_TEST_JVM, **{
                                                                 "spark.sql.execution.arrow.maxRecordsPerBatch": "4"})
    spark_faults.register(session)
    yield session
    session.stop()


def _run(spark, spawn, stack, root, source, target, checkpoint) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    from tests import spark_faults

    j_of = F.udf(lambda value: json.loads(value)["j"], LongType())
    conn = {"zk": stack.zk, "kafka": stack.kafka, "root": root}
    out = (spark.readStream.format("aligned").options(**conn, subject=source, maxEpochsPerBatch="1").load()
           .select("key", F.to_json(F.struct(F.col("epoch").alias("src_epoch"),
                                             F.col("partition").alias("src_partition"),
                                             F.col("offset").alias("src_offset"),
                                             j_of("value").alias("j"))).alias("value")))
    query = spawn.query(out.writeStream.format(spark_faults.FAULTY).options(**conn, subject=target, sinkId="spark")
                        .option("failFirstAttemptAfter", RECORDS // 8)
                        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert query.awaitTermination(LIVE), "availableNow query did not finish"
    assert query.exception() is None, query.exception()


def _key(record: EpochRecord) -> bytes:
    """The key of a record a keyed query wrote (present: every row has one)."""
    assert record.key is not None, f"a record without a key at p{record.partition}@{record.offset}"
    return record.key


def _check_target(ledger, stack, source, target, source_epochs: int) -> None:
    """Every source record's result exactly once, in the target epoch mapped to its source epoch."""
    from aligner.connectors.spark.lineage import sink_lineage, source_batch

    written = sink_lineage(ledger, target, "spark")
    batch_to_epoch = {n.batch: e for e, n in written.items()}
    assert len(written) == source_epochs, "a batch was committed twice"
    for n in written.values():  # the reader's lineage: batch b read source epoch b
        assert n.query is not None, f"batch {n.batch} was written without a query"
        assert {s: (r.first, r.last) for s, r in source_batch(ledger, n.query, n.batch).items()} == \
            {source: (n.batch, n.batch)}
    assert sorted(batch_to_epoch) == list(range(source_epochs))
    target_epochs = [batch_to_epoch[b] for b in range(source_epochs)]
    assert target_epochs == list(range(target_epochs[0], target_epochs[0] + source_epochs))  # one-to-one
    with EpochReader(ledger, stack.kafka) as reader:
        src = {(r.epoch, r.partition, r.offset): json_value(r.value)["j"]
               for r in reader.read(source, 0, source_epochs - 1)}
        got: Counter = Counter()
        per_epoch = defaultdict(set)
        for r in reader.read(target, target_epochs[0], target_epochs[-1]):
            v = json_value(r.value)
            got[(v["src_epoch"], v["src_partition"], v["src_offset"], v["j"])] += 1
            per_epoch[r.epoch].add(v["src_epoch"])
    assert got == Counter({(*k, j): 1 for k, j in src.items()}), "target does not hold every result exactly once"
    assert {e: s for e, s in per_epoch.items()} == {batch_to_epoch[b]: {b} for b in range(source_epochs)}


def test_task_retries_write_each_result_once(spark, stack, root, ledger, tmp_path, spawn):
    source, target = "x-" + tmp_path.name[-8:], "y-" + tmp_path.name[-8:]
    create_subject(ledger, stack.kafka, source, 2)
    create_subject(ledger, stack.kafka, target, 2)
    producer = SinkProducer(ledger, stack.kafka, source, "up", 0, [0, 1]).open()
    try:
        for e in range(3):
            producer.begin()
            for j in range(RECORDS):
                producer.send(json.dumps({"e": e, "j": j}).encode(), key=str(j).encode())
            producer.commit()
        _run(spark, spawn, stack, root, source, target, tmp_path / "cp")
        _check_target(ledger, stack, source, target, 3)
        leaked = raw_count(stack.kafka, target, 2) - 3 * RECORDS
        assert leaked > 0, "the failed first attempts should have left records that readers must drop"
    finally:
        producer.close()
    # A batch re-run after a crash between the ZooKeeper commit and Spark's commit log, with a real
    # driver kill: tests/spark/test_spark_kill.py.


def test_rows_become_json_records_and_too_many_tasks_is_a_clear_error(spark, stack, root, ledger, tmp_path,
                                                                      spawn):
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F

    from aligner.connectors.spark.writer import read_progress
    from aligner.models import FieldSpec

    source, target = "xj-" + tmp_path.name[-8:], "yj-" + tmp_path.name[-8:]
    fields = [FieldSpec(name="e", type="long"), FieldSpec(name="j", type="long")]
    create_subject(ledger, stack.kafka, source, 2, fields=fields)
    create_subject(ledger, stack.kafka, target, 1, fields=[*fields, FieldSpec(name="at", type="timestamp")])
    with SinkProducer(ledger, stack.kafka, source, "up", 0, [0, 1]) as producer:
        producer.begin()
        for j in range(20):
            producer.send(json.dumps({"e": 0, "j": j}).encode(), key=str(j).encode())
        producer.commit()
    conn = {"zk": stack.zk, "kafka": stack.kafka, "root": root}
    rows = (spark.readStream.format("aligned").options(**conn, subject=source, maxEpochsPerBatch="1").load()
            .select("e", "j", F.col("timestamp").alias("at")))

    def run(df, checkpoint):
        query = spawn.query(df.writeStream.format("aligned").options(**conn, subject=target, sinkId="json")
                            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(LIVE), "availableNow query did not finish"
        except StreamingQueryException as exc:
            return exc
        return None

    # Two read tasks feed a one-producer sink: refused before anything is committed.
    error = run(rows, tmp_path / "cp-bad")
    assert error is not None and "repartition the stream to at most 1 partitions" in str(error)
    assert run(rows.repartition(1), tmp_path / "cp") is None
    progress, _ = read_progress(ledger, target, "json")
    assert progress is not None
    back = spark.read.format("aligned").options(**conn, subject=target).option("epoch", str(progress.epoch)).load()
    got = sorted((r.e, r.j) for r in back.collect())
    assert got == [(0, j) for j in range(20)]
    assert back.where("at is null").count() == 0


def test_route_by_key_puts_each_key_in_its_partition_by_the_key_rule(spark, stack, root, ledger, tmp_path, spawn):
    """Issue 19: a query's rows reach the write task of ``crc32(key) % P`` (what runtime, Faust and Kafka
    producers pick), so a key keeps its target partition across versions of every engine; Spark's own hash
    partitioning puts most of these keys elsewhere."""
    import zlib

    from pyspark.sql import functions as F

    from aligner.connectors.spark.keys import route_by_key

    source, target = "xk-" + tmp_path.name[-8:], "yk-" + tmp_path.name[-8:]
    create_subject(ledger, stack.kafka, source, 2)
    create_subject(ledger, stack.kafka, target, 4)
    keys = [f"key-{i}" for i in range(40)]
    with SinkProducer(ledger, stack.kafka, source, "up", 0, [0, 1]) as producer:
        producer.begin()
        for n in range(RECORDS):
            producer.send(json.dumps({"n": n}).encode(), key=keys[n % len(keys)].encode())
        producer.commit()
    conn = {"zk": stack.zk, "kafka": stack.kafka, "root": root}
    rows = spark.readStream.format("aligned").options(**conn, subject=source).load().select("key", "value")
    query = spawn.query(route_by_key(rows, 4).writeStream.format("aligned").options(**conn, subject=target, sinkId="k")
                        .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    assert query.awaitTermination(LIVE), "availableNow query did not finish"
    with EpochReader(ledger, stack.kafka) as reader:
        got = [(_key(r), r.partition) for r in reader.read(target, 0, ledger.epochs.frontier(target) or 0)]
    assert sorted(k for k, _ in got) == sorted(keys[n % len(keys)].encode() for n in range(RECORDS))
    assert [(k, p) for k, p in got if p != zlib.crc32(k) % 4] == []
    spark_hash = spark.createDataFrame([(k,) for k in keys], "k string").select(
        F.expr("pmod(hash(k), 4)").alias("p"), F.crc32(F.col("k").cast("binary")).alias("c")).collect()
    assert sum(r.p != r.c % 4 for r in spark_hash) > len(keys) // 2


def test_key_and_value_columns_become_kafka_bytes() -> None:
    """A binary column is written as Arrow gives it, a string column UTF-8 encoded; nulls stay null."""
    import pyarrow as pa

    from aligner.connectors.spark.writer import _column_bytes

    batch = pa.RecordBatch.from_arrays(
        [pa.array(["k", None, "é"], pa.string()), pa.array([b"v", None, b""], pa.binary()),
         pa.array(["x", "y", None], pa.large_string()), pa.array([b"a", None, b"b"], pa.large_binary())],
        names=["key", "value", "text", "blob"])
    assert _column_bytes(batch, "key") == [b"k", None, "é".encode()]
    assert _column_bytes(batch, "value") == [b"v", None, b""]
    assert _column_bytes(batch, "text") == [b"x", b"y", None]
    assert _column_bytes(batch, "blob") == [b"a", None, b"b"]
