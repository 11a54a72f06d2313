"""Streaming through format("aligned") on real PySpark local[2, 2] against the embedded stack."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from aligner.connectors.reader import EpochReader
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from tests.conftest import run_cli
from tests.helpers import SPARK_TEST_JVM, json_value

pytest.importorskip("pyspark")

LIVE = 300
"""Liveness bound (seconds) on a query's run: generous, for a busy machine; never a speed check."""


@pytest.fixture(scope="module")
def spark():
    from aligner.connectors.spark.session import local_session

    session = local_session("local[2,2]", "test-spark-stream", **SPARK_TEST_JVM)
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


def _run_available_now(spark, spawn, stack, root, subject, checkpoint, seen: list, **options: str) -> str:
    def collect(df, batch_id):
        rows = df.select("epoch", "partition", "offset", "value").collect()
        seen.append((batch_id, [(r.epoch, r.partition, r.offset, bytes(r.value)) for r in rows]))

    query = spawn.query(spark.readStream.format("aligned").options(**_opts(stack, root, subject), **options).load()
                        .writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
                        .trigger(availableNow=True).start())
    assert query.awaitTermination(LIVE), "availableNow query did not finish"
    assert query.exception() is None, query.exception()
    return query.id


def test_by_default_a_batch_takes_every_committed_epoch(spark, stack, root, ledger, subject_name, tmp_path, spawn,
                                                        cli_env):
    """A query keeps up by default: however many epochs committed since the last batch, the next
    batch takes them all (a cap is opt-in); `aligner status` shows the query and how far behind it is."""
    create_subject(ledger, stack.kafka, subject_name, 3)
    producer = SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1, 2]).open()
    try:
        _write_epochs(producer, range(5), 10)
    finally:
        producer.close()
    seen: list = []
    query_id = _run_available_now(spark, spawn, stack, root, subject_name, tmp_path / "cp", seen)
    assert [(b, {r[0] for r in rows}, len(rows)) for b, rows in seen] == [(0, {0, 1, 2, 3, 4}, 50)]
    r = run_cli(cli_env, "status", "--json")
    assert r.returncode == 0, r.stderr
    (query,) = [q for q in json.loads(r.stdout)["spark_queries"] if q["query"] == query_id]
    assert query["batch"] == 0 and query["subjects"][subject_name] == {
        "first": 0, "last": 4, "behind_epochs": 0, "behind_seconds": 0.0}


def test_stream_reads_every_epoch_once_and_resumes_from_checkpoint(spark, stack, root, ledger, subject_name,
                                                                   tmp_path, spawn):
    create_subject(ledger, stack.kafka, subject_name, 3)
    producer = SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1, 2]).open()
    try:
        _write_epochs(producer, range(4), 30, abort_at=1)
        first: list = []
        _run_available_now(spark, spawn, stack, root, subject_name, tmp_path / "cp", first, maxEpochsPerBatch="1")
        # One micro-batch per committed epoch, in order, each holding exactly that epoch's records.
        assert [b for b, _ in first] == [0, 1, 2, 3]
        for batch_id, rows in first:
            assert {r[0] for r in rows} == {batch_id} and len(rows) == 30
        _write_epochs(producer, range(4, 6), 30)
        producer.begin()
        producer.commit()  # epoch 6: empty
        second: list = []
        query_id = _run_available_now(spark, spawn, stack, root, subject_name, tmp_path / "cp", second,
                                      maxEpochsPerBatch="1")
    finally:
        producer.close()
    assert [b for b, _ in second] == [4, 5, 6]
    assert [{r[0] for r in rows} for _, rows in second] == [{4}, {5}, set()]
    streamed = Counter(r for _, rows in first + second for r in rows)
    with EpochReader(ledger, stack.kafka) as reader:
        exact = Counter((r.epoch, r.partition, r.offset, r.value) for r in reader.read(subject_name, 0, 6))
    assert streamed == exact and len(exact) == 180 and max(streamed.values()) == 1
    # Lineage in ZooKeeper: batch b of the query (same id across the restart) read epoch b, empty ones too.
    from aligner.connectors.spark.lineage import source_batch

    for b in range(7):
        assert {s: (n.first, n.last) for s, n in source_batch(ledger, query_id, b).items()} == {subject_name: (b, b)}

    # epochsPerBatch = 2 under the default trigger: admission control caps each batch at two epochs.
    pairs: list = []
    query = spawn.query(spark.readStream.format("aligned").options(**_opts(stack, root, subject_name))
                        .option("epochsPerBatch", "2").load()
                        .writeStream.foreachBatch(lambda df, b: pairs.append(sorted({r.epoch for r in df.collect()})))
                        .option("checkpointLocation", str(tmp_path / "cp2")).start())
    query.processAllAvailable()
    query.stop()
    assert pairs == [[0, 1], [2, 3], [4, 5], []]


def test_multi_subject_stream_follows_epoch_vectors_and_resumes(spark, stack, root, ledger, subject_name, tmp_path,
                                                                spawn):
    from aligner.connectors.spark.lineage import source_batch

    fast, slow = f"{subject_name}-f", f"{subject_name}-s"
    create_subject(ledger, stack.kafka, fast, 2)
    create_subject(ledger, stack.kafka, slow, 3)
    pf = SinkProducer(ledger, stack.kafka, fast, "k", 0, [0, 1]).open()
    ps = SinkProducer(ledger, stack.kafka, slow, "k", 0, [0, 1, 2]).open()
    seen: list = []

    def run() -> str:
        def collect(df, batch_id):
            rows = df.select("subject", "epoch", "partition", "offset", "value").collect()
            seen.append((batch_id, [(r.subject, r.epoch, r.partition, r.offset, bytes(r.value)) for r in rows]))

        opts = {"zk": stack.zk, "kafka": stack.kafka, "root": root, "subjects": f"{fast},{slow}",
                "maxEpochsPerBatch": "1"}
        query = spawn.query(spark.readStream.format("aligned").options(**opts).load()
                            .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "cp"))
                            .trigger(availableNow=True).start())
        assert query.awaitTermination(LIVE), "availableNow query did not finish"
        assert query.exception() is None, query.exception()
        return query.id

    try:
        _write_epochs(pf, range(4), 20, abort_at=2)
        _write_epochs(ps, range(2), 7)
        query_id = run()
        assert len(seen) == 4
        _write_epochs(pf, range(4, 5), 20)
        _write_epochs(ps, range(2, 4), 7)
        assert run() == query_id
    finally:
        pf.close()
        ps.close()
    # Per batch, per subject: its next committed epoch (epochsPerBatch = 1), none for a subject without one.
    per_batch = [{(r[0], r[1]) for r in rows} for _, rows in seen]
    assert [b for b, _ in seen] == list(range(6))
    assert per_batch == [{(fast, 0), (slow, 0)}, {(fast, 1), (slow, 1)}, {(fast, 2)}, {(fast, 3)},
                         {(fast, 4), (slow, 2)}, {(slow, 3)}]
    streamed = Counter(r for _, rows in seen for r in rows)
    assert max(streamed.values()) == 1
    with EpochReader(ledger, stack.kafka) as reader:
        exact = Counter((s, r.epoch, r.partition, r.offset, r.value)
                        for s, last in ((fast, 4), (slow, 3)) for r in reader.read(s, 0, last))
    assert streamed == exact and len(exact) == 5 * 20 + 4 * 7
    lineage = [{s: (n.first, n.last) for s, n in source_batch(ledger, query_id, b).items()} for b in range(6)]
    assert lineage == [{fast: (0, 0), slow: (0, 0)}, {fast: (1, 1), slow: (1, 1)}, {fast: (2, 2)}, {fast: (3, 3)},
                       {fast: (4, 4), slow: (2, 2)}, {slow: (3, 3)}]


def test_pr_hotness_job_on_spark_reduces_both_subjects_exactly_once(spark, stack, root, ledger, subject_name,
                                                                    tmp_path, spawn):
    """Job 2 of the hotness chain: the multi-subject aligned source, a stateful reduce, the aligned sink."""
    from experiments.hotness import pr_hotness_query

    hot, comments, out = f"{subject_name}-hot", f"{subject_name}-prc", f"{subject_name}-out"
    for s, parts in ((hot, 2), (comments, 2), (out, 2)):
        create_subject(ledger, stack.kafka, s, parts)
    expected: Counter = Counter()
    with SinkProducer(ledger, stack.kafka, hot, "job1", 0, [0, 1]) as ph, \
            SinkProducer(ledger, stack.kafka, comments, "gen", 0, [0, 1]) as pc:
        for e in range(4):
            ph.begin()
            pc.begin()
            for n in range(10):
                pr = (e + n) % 3
                ph.send(json.dumps({"comment": 10 * e + n, "pr": pr, "ts": 1.0}).encode(), str(pr).encode())
                expected[(pr, "hot")] += 1
                if n % 2:
                    pc.send(json.dumps({"id": 10 * e + n, "pr": pr, "ts": 2.0}).encode(), str(pr).encode())
                    expected[(pr, "comments")] += 1
            if e == 2:
                ph.abort()  # an aborted attempt of job 1's epoch: its records must not count
                ph.begin()
                for n in range(10):
                    pr = (e + n) % 3
                    ph.send(json.dumps({"comment": 10 * e + n, "pr": pr, "ts": 1.0}).encode(), str(pr).encode())
            ph.commit()
            pc.commit()
    conn = {"zk": stack.zk, "kafka": stack.kafka, "root": root}
    query = spawn.query(pr_hotness_query(spark, conn, hot, comments, epochs_per_batch=2)
                        .writeStream.format("aligned").options(**conn, subject=out, sinkId="hotness")
                        .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    assert query.awaitTermination(LIVE), "availableNow query did not finish"
    assert query.exception() is None, query.exception()
    with EpochReader(ledger, stack.kafka) as reader:
        rows = [json_value(r.value) for r in reader.read(out, 0, ledger.epochs.frontier(out))]
    final: dict = {}
    for r in rows:
        final[r["pr"]] = max(final.get(r["pr"], (0, 0, 0)), (r["hotness"], r["comments"], r["hot"]))
    assert {pr: (c, h) for pr, (_t, c, h) in final.items()} == {
        pr: (expected[(pr, "comments")], expected[(pr, "hot")]) for pr in range(3)}
    assert all(t == c + h for t, c, h in final.values())


def test_a_checkpoint_left_mid_write_by_a_killed_driver_starts_again_once_cleared(spark, stack, root, ledger,
                                                                                    subject_name, tmp_path, spawn):
    """A driver killed while writing its first batch's offsets leaves ``offsets/.0.<uuid>.tmp`` (as the chaos
    run met): Spark then refuses the checkpoint at every start (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY).
    ``clear_unfinished_writes`` removes only the leftovers, through Spark's own file system, and the query
    then reads every epoch once."""
    from pathlib import Path

    from aligner.connectors.spark.checkpoint import clear_unfinished_writes

    create_subject(ledger, stack.kafka, subject_name, 2)
    producer = SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1]).open()
    try:
        _write_epochs(producer, range(3), 10)
    finally:
        producer.close()
    checkpoint = tmp_path / "cp"
    (checkpoint / "offsets").mkdir(parents=True)
    left = checkpoint / "offsets" / ".0.a05774ca-1c05-45f2-ae0a-3d315da0e243.tmp"
    left.write_bytes(b"")
    seen: list = []
    with pytest.raises(Exception, match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"):
        _run_available_now(spark, spawn, stack, root, subject_name, checkpoint, seen)
    assert [Path(p).name for p in clear_unfinished_writes(str(checkpoint), spark)] == [left.name]
    assert not left.exists() and (checkpoint / "metadata").exists()  # the query's own files stay
    _run_available_now(spark, spawn, stack, root, subject_name, checkpoint, seen)
    values = Counter(r[3] for _b, rows in seen for r in rows)
    assert len(values) == 30 and set(values.values()) == {1}


def test_clearing_a_local_checkpoint_removes_only_temporary_files(tmp_path) -> None:
    from aligner.connectors.spark.checkpoint import clear_unfinished_writes

    for log in ("offsets", "commits"):
        (tmp_path / log).mkdir()
        for name in ("0", ".0.crc", ".1.3f2a.tmp", "..1.3f2a.tmp.crc"):
            (tmp_path / log / name).write_text("x")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / ".1.delta.9.tmp").write_text("x")  # the state store's files are Spark's own business
    removed = clear_unfinished_writes(f"file://{tmp_path}")
    assert sorted(removed) == sorted(str(tmp_path / log / n) for log in ("offsets", "commits")
                                     for n in (".1.3f2a.tmp", "..1.3f2a.tmp.crc"))
    assert sorted(p.name for p in (tmp_path / "offsets").iterdir()) == [".0.crc", "0"]
    assert (tmp_path / "state" / ".1.delta.9.tmp").exists()
    assert clear_unfinished_writes(str(tmp_path)) == []
    assert clear_unfinished_writes("hdfs://nn/cp") == []  # no session to reach it: left alone, with a warning
