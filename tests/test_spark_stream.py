"""Streaming through format("aligned") on real PySpark local[2, 2] against the embedded stack."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from connectors.reader import EpochReader
from connectors.sink import SinkProducer
from connectors.subjects import create_subject

pytest.importorskip("pyspark")

TEST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"  # the first session of the run starts the JVM


@pytest.fixture(scope="module")
def spark():
    from connectors.spark.session import local_session

    session = local_session("local[2,2]", "test-spark-stream", **{"spark.driver.extraJavaOptions": TEST_JVM})
    yield session
    session.stop()


def _opts(stack, root, subject):
    return {"zk": stack.zk, "kafka": stack.kafka, "root": root, "subject": subject}


def _write_epochs(producer: SinkProducer, epochs: range, records: int, abort_at: int | None = None) -> None:
    for e in epochs:
        producer.begin()
        for j in range(records):
            producer.send(json.dumps({"e": e, "j": j}).encode(), key=str(j).encode())
        if e == abort_at:
            producer.abort()
            producer.begin()
            for j in range(records):
                producer.send(json.dumps({"e": e, "j": j}).encode(), key=str(j).encode())
        producer.commit()


def _run_available_now(spark, stack, root, subject, checkpoint, seen: list) -> str:
    def collect(df, batch_id):
        rows = df.select("epoch", "partition", "offset", "value").collect()
        seen.append((batch_id, [(r.epoch, r.partition, r.offset, bytes(r.value)) for r in rows]))

    query = (spark.readStream.format("aligned").options(**_opts(stack, root, subject)).load()
             .writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180), "availableNow query did not finish"
    assert query.exception() is None, query.exception()
    return query.id


def test_stream_reads_every_epoch_once_and_resumes_from_checkpoint(spark, stack, root, ledger, subject_name,
                                                                   tmp_path):
    create_subject(ledger, stack.kafka, subject_name, 3)
    producer = SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1, 2]).open()
    try:
        _write_epochs(producer, range(4), 30, abort_at=1)
        first: list = []
        _run_available_now(spark, stack, root, subject_name, tmp_path / "cp", first)
        # One micro-batch per committed epoch, in order, each holding exactly that epoch's records.
        assert [b for b, _ in first] == [0, 1, 2, 3]
        for batch_id, rows in first:
            assert {r[0] for r in rows} == {batch_id} and len(rows) == 30
        _write_epochs(producer, range(4, 6), 30)
        producer.begin()
        producer.commit()  # epoch 6: empty
        second: list = []
        query_id = _run_available_now(spark, stack, root, subject_name, tmp_path / "cp", second)
    finally:
        producer.close()
    assert [b for b, _ in second] == [4, 5, 6]
    assert [{r[0] for r in rows} for _, rows in second] == [{4}, {5}, set()]
    streamed = Counter(r for _, rows in first + second for r in rows)
    with EpochReader(ledger, stack.kafka) as reader:
        exact = Counter((r.epoch, r.partition, r.offset, r.value) for r in reader.read(subject_name, 0, 6))
    assert streamed == exact and len(exact) == 180 and max(streamed.values()) == 1
    # Lineage in ZooKeeper: batch b of the query (same id across the restart) read epoch b, empty ones too.
    from connectors.spark.lineage import source_batch

    for b in range(7):
        assert {s: (n.first, n.last) for s, n in source_batch(ledger, query_id, b).items()} == {subject_name: (b, b)}

    # epochsPerBatch = 2 under the default trigger: admission control caps each batch at two epochs.
    pairs: list = []
    query = (spark.readStream.format("aligned").options(**_opts(stack, root, subject_name))
             .option("epochsPerBatch", "2").load()
             .writeStream.foreachBatch(lambda df, b: pairs.append(sorted({r.epoch for r in df.collect()})))
             .option("checkpointLocation", str(tmp_path / "cp2")).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert pairs == [[0, 1], [2, 3], [4, 5], []]
