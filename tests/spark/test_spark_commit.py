"""One ledger commit per engine step (issue 49): a Spark micro-batch's commit on the driver is one ZooKeeper
multi-op and reads nothing the batch's plan read (the sink's producers, its writers, its progress, the job
and its swap), and the writer Spark builds for it plans nothing (the batch is planned once, by the writer of
its tasks). Counted on real PySpark local[2, 2] and real ZooKeeper, request by request, by the tests' own
sink (``countRequests``, tests/spark_faults.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.helpers import SPARK_TEST_JVM, wait_for
from tests.relay import fill

pytest.importorskip("pyspark")

EPOCHS = 3
RECORDS = 20
LIVE = 300
"""Liveness bound (seconds) on a query's run: generous, for a busy machine; never a speed check."""


@pytest.fixture(scope="module")
def spark():
    from aligner.connectors.spark.session import local_session
    from tests import spark_faults

    session = local_session("local[2,2]", "test-spark-commit", **SPARK_TEST_JVM,
                            **{"spark.sql.streaming.noDataMicroBatches.enabled": "false"})
    spark_faults.register(session)
    yield session
    session.stop()


def _commits(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _planned_paths(ledger, target: str, sink: str, job: str | None = None) -> set[str]:
    """What the batch's plan read when its writer was built: the commit must not read any of it again."""
    lay = ledger.layout
    paths = {lay.writers(target), lay.spark_progress(target, sink)}
    paths |= {lay.producer(target, sink, str(i)) for i in range(2)}
    if job is not None:
        paths |= {lay.job(job), lay.swap(job)}
    return paths


def _check(commits: list[dict], planned: set[str], batches: int) -> None:
    assert len(commits) >= batches, commits
    for c in commits:
        assert c["built"] == [], f"batch {c['batch']}: the commit's writer planned when Spark built it: {c['built']}"
        kinds = [kind for kind, _ in c["requests"]]
        assert kinds.count("Transaction") == 1, f"batch {c['batch']}: not one ledger commit: {c['requests']}"
        again = [(kind, path) for kind, path in c["requests"] if path in planned]
        assert again == [], f"batch {c['batch']}: the commit read again what its plan read: {again}"


def test_a_sink_batch_commit_is_one_multi_op_and_reads_nothing(spark, stack, root, ledger, tmp_path, spawn):
    source, target = "cx-" + tmp_path.name[-8:], "cy-" + tmp_path.name[-8:]
    fill(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    counted = tmp_path / "requests.jsonl"
    conn = {"zk": stack.zk, "kafka": stack.kafka, "root": root}
    from tests import spark_faults

    rows = spark.readStream.format("aligned").options(**conn, subject=source, maxEpochsPerBatch="1").load()
    query = spawn.query(rows.select("key", "value").writeStream.format(spark_faults.FAULTY)
                        .options(**conn, subject=target, sinkId="counted", countRequests=str(counted))
                        .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    assert query.awaitTermination(LIVE), "availableNow query did not finish"
    assert query.exception() is None, query.exception()
    commits = _commits(counted)
    assert [c["batch"] for c in commits] == list(range(EPOCHS))
    _check(commits, _planned_paths(ledger, target, "counted"), EPOCHS)
    # Nothing at all besides the multi-op: the plan knew every version the commit checks.
    assert [c["requests"] for c in commits] == [[["Transaction", None]]] * EPOCHS
    assert ledger.epochs.frontier(target) == EPOCHS - 1


def test_a_job_batch_commit_is_one_multi_op_and_reads_nothing_planned(spark, stack, root, ledger, tmp_path, spawn):
    """A query running as an aligned job: its commit reads the batch's lineage (what its read tasks recorded:
    the only way the reader's batch reaches the sink's commit) and reports its consumer nodes after the
    commit; the producers, writers, progress, job and swap it takes from the plan."""
    from aligner.connectors.spark.job import register_query
    from tests import spark_faults

    source, target = "jx-" + tmp_path.name[-8:], "jy-" + tmp_path.name[-8:]
    job = "jc-" + tmp_path.name[-8:]
    fill(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    register_query(ledger, job, [source], target)
    counted = tmp_path / "requests.jsonl"
    conn = {"zk": stack.zk, "kafka": stack.kafka, "root": root}
    rows = spark.readStream.format("aligned").options(**conn, subject=source, job=job, maxEpochsPerBatch="1").load()
    query = spawn.query(rows.select("key", "value").writeStream.format(spark_faults.FAULTY)
                        .options(**conn, subject=target, job=job, countRequests=str(counted))
                        .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="200 milliseconds")
                        .start())
    try:
        wait_for(lambda: len(_commits(counted)) >= EPOCHS or query.exception() is not None, LIVE, "the job's batches")
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
        time.sleep(0.2)
    commits = _commits(counted)
    _check(commits, _planned_paths(ledger, target, job, job), EPOCHS)
    lineage, consumers = f"{root}/spark/queries/", f"{ledger.layout.job(job)}/sources/"
    for c in commits:  # besides the multi-op: a sync and the batch's lineage, then the job's consumer nodes' report
        other = [(kind, path) for kind, path in c["requests"]
                 if kind not in ("Transaction", "Sync") and not path.startswith(lineage)
                 and not (path.startswith(consumers) and "/consumers/" in path)]
        assert other == [], f"batch {c['batch']}: {other}"
    assert ledger.epochs.frontier(target) is not None and ledger.epochs.frontier(target) >= EPOCHS - 1
