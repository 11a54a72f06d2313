"""Batch reads through format("aligned") on real PySpark local[2] against the embedded stack."""

from __future__ import annotations

import json

import pytest

from aligner.models import FieldSpec
from connectors.reader import EpochReader
from connectors.sink import SinkProducer
from connectors.subjects import create_subject

pytest.importorskip("pyspark")


@pytest.fixture(scope="module")
def spark():
    from connectors.spark.session import local_session

    session = local_session("local[2]", "test-spark-batch")
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
