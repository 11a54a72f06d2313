"""Batch reads through format("aligned") on real PySpark local[2] against the embedded stack."""

from __future__ import annotations

import json

import pytest

from aligner.connectors.reader import EpochReader
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.models import FieldSpec
from tests.helpers import SPARK_TEST_JVM

pytest.importorskip("pyspark")



@pytest.fixture(scope="module")
def spark():
    from aligner.connectors.spark.session import local_session

    session = local_session("local[2]", "test-spark-batch", **SPARK_TEST_JVM)
    yield session
    session.stop()


def _opts(stack, root, subject):
    return {"zk": stack.zk, "kafka": stack.kafka, "root": root, "subject": subject}


def test_batch_read_of_a_span_equals_the_exact_reader(spark, stack, root, ledger, subject_name):
    fields = [FieldSpec(name="n", type="long"), FieldSpec(name="word", type="string")]
    create_subject(ledger, stack.kafka, subject_name, 3, fields=fields)
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1, 2]) as p:
        for e in range(5):
            p.begin()
            for j in range(50):
                p.send(json.dumps({"n": e * 1000 + j, "word": f"w{j}"}).encode(), key=str(j).encode())
            if e == 2:  # an aborted attempt: its records stay visible on Tansu, stamps drop them
                p.abort()
                p.begin()
                for j in range(50):
                    p.send(json.dumps({"n": e * 1000 + j, "word": f"w{j}"}).encode(), key=str(j).encode())
            p.commit()
        p.begin()
        p.commit()  # epoch 5: empty
    with EpochReader(ledger, stack.kafka) as reader:
        expected = sorted((r.epoch, r.partition, r.offset, r.key, r.value) for r in reader.read(subject_name, 1, 5))
    df = spark.read.format("aligned").options(**_opts(stack, root, subject_name)).option("epochs", "1:5").load()
    assert df.columns == ["n", "word", "key", "value", "partition", "offset", "epoch", "timestamp"]
    assert df.rdd.getNumPartitions() == 3
    rows = df.collect()
    got = sorted((r.epoch, r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in rows)
    assert got == expected and len(got) == 200
    packed = (spark.read.format("aligned").options(**_opts(stack, root, subject_name)).option("epochs", "1:5")
              .option("minRecordsPerTask", "10000").load())
    assert packed.rdd.getNumPartitions() == 1  # three small partitions read by one task
    assert sorted((r.epoch, r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in packed.collect()) == got
    for r in rows:
        assert r.n == json.loads(r.value)["n"] and r.word == json.loads(r.value)["word"]
        assert r.timestamp is not None
    # Same options, same rows; asOf covers 0..N.
    again = spark.read.format("aligned").options(**_opts(stack, root, subject_name)).option("epochs", "1:5").load()
    assert sorted((r.epoch, r.partition, r.offset) for r in again.collect()) == [g[:3] for g in got]
    as_of = spark.read.format("aligned").options(**_opts(stack, root, subject_name)).option("asOf", "2").load()
    assert as_of.count() == 150
    assert spark.read.format("aligned").options(**_opts(stack, root, subject_name)).option("epoch", "5").load() \
        .count() == 0


def test_batch_read_errors_at_planning(spark, stack, root, ledger, subject_name):
    create_subject(ledger, stack.kafka, subject_name, 1, value_format="bytes")
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0]) as p:
        p.begin()
        p.send(b"x")
        p.commit()
    ok = spark.read.format("aligned").options(**_opts(stack, root, subject_name)).option("epoch", "0").load()
    assert ok.columns == ["key", "value", "partition", "offset", "epoch", "timestamp"]
    assert [bytes(r.value) for r in ok.collect()] == [b"x"]
    with pytest.raises(Exception, match=r"epoch 1 of subject .* is not committed"):
        spark.read.format("aligned").options(**_opts(stack, root, subject_name)).option("epochs", "0:1").load() \
            .collect()
    with pytest.raises(Exception, match="unknown subject 'nope'"):
        spark.read.format("aligned").options(**_opts(stack, root, "nope")).option("epoch", "0").load().collect()
    with pytest.raises(Exception, match="exactly one of the options epoch"):
        spark.read.format("aligned").options(**_opts(stack, root, subject_name)).load().collect()


def test_batch_read_by_lineage_of_a_job_epoch(spark, stack, root, ledger, subject_name):
    from aligner.models import JobNode, Span

    source, target, other = subject_name, "y" + subject_name, "z" + subject_name
    for name in (source, target, other):
        create_subject(ledger, stack.kafka, name, 2, value_format="bytes")
    with SinkProducer(ledger, stack.kafka, source, "up", 0, [0, 1]) as p:
        for e in range(4):
            p.begin()
            for j in range(10):
                p.send(f"{e}:{j}".encode(), key=str(j).encode())
            p.commit()
    jobs = ledger.jobs
    jobs.register(JobNode(job="j1", inputs=(source,), output=target, parallelism=1))
    jobs.fix_job_epoch("j1", 0, {source: Span(first=1, last=2)}, {source: 3})
    with SinkProducer(ledger, stack.kafka, target, "j1", 0, [0, 1]) as p:
        p.begin()
        for j in range(5):
            p.send(f"out{j}".encode())
        p.commit()

    def read(subject, **kw):
        return spark.read.format("aligned").options(**_opts(stack, root, subject), **kw).load()

    by_cut = sorted((r.epoch, r.partition, r.offset) for r in read(source, lineage="j1:0").collect())
    by_span = sorted((r.epoch, r.partition, r.offset) for r in read(source, epochs="1:2").collect())
    assert by_cut == by_span and len(by_cut) == 20
    assert sorted(bytes(r.value) for r in read(target, lineage="j1:0").collect()) == [f"out{j}".encode()
                                                                                     for j in range(5)]
    with pytest.raises(Exception, match=r"consistent cut of j1:0 holds subjects .*, not 'z"):
        read(other, lineage="j1:0").collect()
    with pytest.raises(Exception, match=r"must be 'JOB:EPOCH'"):
        read(source, lineage="j1").collect()
    with pytest.raises(Exception, match="neither a registered job nor a Spark sink id"):
        read(source, lineage="nope:0").collect()


def test_lineage_nodes_are_validated(ledger):
    from aligner.connectors.spark.lineage import LineageError, record_source_batch, source_batch, source_batch_path
    from aligner.errors import MalformedNodeError

    ledger.zk.ensure_path(ledger.layout.subjects)
    record_source_batch(ledger, "q1", 3, "s", 4, 5)
    record_source_batch(ledger, "q1", 3, "s", 4, 5)  # a re-run of the batch: same span, fine
    assert {k: (v.first, v.last) for k, v in source_batch(ledger, "q1", 3).items()} == {"s": (4, 5)}
    with pytest.raises(LineageError, match=r"recorded reading epochs 4\.\.5 of 's', now it plans 4\.\.6"):
        record_source_batch(ledger, "q1", 3, "s", 4, 6)
    ledger.zk.set(source_batch_path(ledger, "q1", 3, "s"), b'{"schema_version": 1, "first": "x"}')
    with pytest.raises(MalformedNodeError, match="SparkSourceBatchNode"):
        source_batch(ledger, "q1", 3)
