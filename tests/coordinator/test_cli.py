"""The `aligner` command line against the embedded stack: output, errors and exit codes."""

from __future__ import annotations

import json
import os
import signal

import pytest
from confluent_kafka import Producer

from aligner.connectors.sink import SinkProducer
from aligner.embedded.stack import _alive
from tests.conftest import run_cli
from tests.helpers import SPARK_TEST_JVM


def _outside_writes(bootstrap: str, topic: str, start: int, count: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    for n in range(start, start + count):
        p.produce(topic, json.dumps({"n": n}).encode(), partition=n % 2)
    p.flush()


def test_markers_epochs_and_read_twice_identical(stack, cli_env, subject_name):
    assert run_cli(cli_env, "subjects", "create", subject_name, "--partitions", "2").returncode == 0
    for i in range(3):
        _outside_writes(stack.kafka, subject_name, i * 10, 10)
        r = run_cli(cli_env, "markers", subject_name, "--count", "1", "--json")
        assert r.returncode == 0, r.stderr
    epochs = json.loads(run_cli(cli_env, "epochs", subject_name, "--json").stdout)
    assert [e["epoch"] for e in epochs["epochs"]] == [0, 1, 2] and all(e["committed"] for e in epochs["epochs"])
    first = run_cli(cli_env, "read", subject_name, "--epochs", "0:2", "--json")
    second = run_cli(cli_env, "read", subject_name, "--epochs", "0:2", "--json")
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    records = json.loads(first.stdout)["records"]
    assert sorted(r["value"]["n"] for r in records) == list(range(30))
    assert {r["epoch"] for r in records if r["value"]["n"] >= 20} == {2}
    status = json.loads(run_cli(cli_env, "status", "--json").stdout)
    assert status["subjects"][0]["last_committed"] == 2


def test_read_errors_are_clear(stack, cli_env, subject_name):
    assert run_cli(cli_env, "subjects", "create", subject_name, "--partitions", "1").returncode == 0
    r = run_cli(cli_env, "read", subject_name, "--epoch", "4")
    assert r.returncode == 1 and "epoch 4" in r.stderr and "not committed" in r.stderr
    r = run_cli(cli_env, "read", "no-such-subject", "--epoch", "0")
    assert r.returncode == 1 and "unknown subject 'no-such-subject'" in r.stderr
    r = run_cli(cli_env, "epochs", "no-such-subject")
    assert r.returncode == 1 and "unknown subject" in r.stderr


def test_wrong_arguments_exit_2_with_usage(cli_env):
    for args in (["read", "s", "--epoch", "1", "--epochs", "1:2"], ["read", "s"], ["read", "s", "--epochs", "5:2"],
                 ["read", "s", "--epoch", "-1"], ["markers", "s", "--interval", "0"], ["nonsense"],
                 ["lineage", "--epoch", "1"]):
        r = run_cli(cli_env, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "usage error" in lines[0] and "--help" in lines[0], (args, r.stderr)


def test_unreachable_zookeeper_is_a_clear_error(cli_env):
    env = {**cli_env, "ALIGNER_ZK": "127.0.0.1:1"}
    r = run_cli(env, "status", timeout=60)
    assert r.returncode == 1 and "cannot reach ZooKeeper at 127.0.0.1:1" in r.stderr


def test_stack_up_env_down_leaves_no_process(cli_env):
    env = {k: v for k, v in cli_env.items() if k not in ("ALIGNER_ZK", "ALIGNER_KAFKA")}
    up = run_cli(env, "stack", "up", "--json")
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    try:
        exports = run_cli(env, "stack", "env").stdout
        assert f"export ALIGNER_ZK={info['zk']}" in exports and f"export ALIGNER_KAFKA={info['kafka']}" in exports
        # Commands find the running stack without flags or environment.
        assert run_cli(env, "subjects", "list").returncode == 0
    finally:
        down = run_cli(env, "stack", "down")
    assert down.returncode == 0 and "stack stopped" in down.stdout
    assert f"removed data dir {info['workdir']}" in down.stdout
    assert not _alive(info["zk_pid"]) and not _alive(info["kafka_pid"])
    assert run_cli(env, "stack", "env").returncode == 1


def test_embedded_stack_processes_die_with_their_owner(stack):
    # The session stack's processes are alive now and are killed when the session ends
    # (PR_SET_PDEATHSIG + process groups); this checks they are real, separate processes.
    for pid in (stack.zk_pid, stack.kafka_pid):
        assert _alive(pid) and os.getpgid(pid) == pid
    assert signal.SIGKILL  # the teardown path is exercised by test_stack_up_env_down_leaves_no_process


def test_gc_keeps_the_last_epochs_and_collected_reads_are_clear_errors(stack, cli_env, subject_name):
    assert run_cli(cli_env, "subjects", "create", subject_name, "--partitions", "2").returncode == 0
    for i in range(6):
        _outside_writes(stack.kafka, subject_name, i * 4, 4)
        assert run_cli(cli_env, "markers", subject_name, "--count", "1").returncode == 0
    dry = json.loads(run_cli(cli_env, "gc", "--keep-epochs", "2", "--dry-run", "--json").stdout)
    assert dry["subjects"][subject_name] == {"first_retained": 4, "deleted_epochs": 4}
    assert run_cli(cli_env, "read", subject_name, "--epoch", "1").returncode == 0  # nothing deleted yet
    r = run_cli(cli_env, "gc", "--keep-epochs", "2", "--json")
    assert r.returncode == 0, r.stderr
    r = run_cli(cli_env, "read", subject_name, "--epoch", "1")
    assert r.returncode == 1 and "out of retention" in r.stderr and "earliest retained epoch is 4" in r.stderr
    kept = json.loads(run_cli(cli_env, "read", subject_name, "--epochs", "4:5", "--json").stdout)
    assert sorted(x["value"]["n"] for x in kept["records"]) == list(range(16, 24))
    epochs = json.loads(run_cli(cli_env, "epochs", subject_name, "--json").stdout)
    assert [e["epoch"] for e in epochs["epochs"]] == [4, 5]


@pytest.fixture(scope="module")
def spark():
    """A local SparkSession (its JVM lives until the session's end, like every Spark test module's)."""
    pytest.importorskip("pyspark")
    from aligner.connectors.spark.session import local_session

    session = local_session("local[2]", "test-cli-lineage", **SPARK_TEST_JVM)
    yield session
    session.stop()


def test_lineage_and_status_see_spark_sinks(stack, cli_env, ledger, subject_name, spawn, spark, tmp_path):
    """`aligner lineage` follows an epoch a Spark query wrote back to the epochs its micro-batch read, and
    `aligner status` lists the query: read from the ledger, the coordinator imports no engine."""
    from aligner.connectors.subjects import create_subject

    raw, target = subject_name, f"{subject_name}-out"
    create_subject(ledger, stack.kafka, raw, 2)
    create_subject(ledger, stack.kafka, target, 2)
    with SinkProducer(ledger, stack.kafka, raw, "gen", 0, [0, 1]) as p:
        for e in range(3):
            p.begin()
            for n in range(4):
                p.send(json.dumps({"e": e, "n": n}).encode(), key=str(n).encode())
            p.commit()
    conn = {"zk": stack.zk, "kafka": stack.kafka, "root": cli_env["ALIGNER_ROOT"]}
    query = spawn.query(spark.readStream.format("aligned").options(**conn, subject=raw, maxEpochsPerBatch="1")
                        .load().select("key", "value").writeStream.format("aligned")
                        .options(**conn, subject=target, sinkId="sq")
                        .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    assert query.awaitTermination(300), "availableNow query did not finish"
    assert query.exception() is None, query.exception()

    out = json.loads(run_cli(cli_env, "epochs", target, "--json").stdout)["epochs"]
    assert len(out) == 3 and all(e["committed"] for e in out)
    for e in out:
        r = run_cli(cli_env, "lineage", "--subject", target, "--epoch", str(e["epoch"]), "--json")
        assert r.returncode == 0, r.stderr
        found = json.loads(r.stdout)
        (producer,) = found["lineage"]["producers"]
        assert producer["spark"] and producer["sink"] == "sq" and producer["aligned"]
        (read_epoch,) = found["cut"][raw]
        by_job = json.loads(run_cli(cli_env, "lineage", "--job", "sq", "--epoch", str(e["epoch"]), "--json").stdout)
        assert by_job["cut"] == {raw: [read_epoch]} and by_job["lineage"]["query"] == producer["query"]
    assert sorted(json.loads(run_cli(cli_env, "lineage", "--subject", target, "--epoch", str(e["epoch"]), "--json")
                             .stdout)["cut"][raw] for e in out) == [[0], [1], [2]]
    status = json.loads(run_cli(cli_env, "status", "--json").stdout)
    (q,) = status["spark_queries"]
    assert q["subjects"][raw]["last"] == 2 and q["subjects"][raw]["behind_epochs"] == 0



def test_markers_print_an_epoch_on_one_line_however_many_partitions(stack, cli_env, subject_name):
    """rich wraps at 80 columns off a terminal; a marker's epoch line is read by scripts (the soak's drain waited
    13 minutes for a line starting with "epoch " that had wrapped), so it stays one line."""
    assert run_cli(cli_env, "subjects", "create", subject_name, "--partitions", "12").returncode == 0
    p = Producer({"bootstrap.servers": stack.kafka, "log_level": 3})
    for n in range(12):
        p.produce(subject_name, json.dumps({"n": n}).encode(), partition=n)
    p.flush()
    r = run_cli(cli_env, "markers", subject_name, "--count", "1")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("epoch 0: ") and len(lines[0]) > 80, r.stdout
    assert all(f"{n}:[" in lines[0] for n in range(12)), lines[0]
