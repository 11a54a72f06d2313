"""The Spark relay X -> Y on a standalone cluster (a master and two workers of pyspark's own ``spark-class``,
one core each, so tasks run in executor JVMs apart from the driver), under the faults of that shape:
an executor SIGKILLed inside a write task and at its pre-commit, two attempts of one write task at once
(speculation), a worker SIGKILLed and restarted, the driver SIGKILLed and restarted, and a query hot-swap
with an executor SIGKILLed at pre-commit. Every X record's result reaches Y exactly once (every record
counted, tests/relay.py); executors reuse their ZooKeeper sessions across micro-batches. ``make test`` runs
one test per fault kind; ``make test-long`` adds the executor killed inside the write.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from aligner.coordinator.hotswap import HotSwap
from aligner.embedded.spark_cluster import SparkCluster, executor_of
from tests.helpers import Worker, as_args, raw_count, wait_for
from tests.relay import LIVE, SINK, check, fill, kill, start, wait_batch
from tests.spark_queries import SwapPair
from tests.swaps import precommit_acked

pytest.importorskip("pyspark")

EPOCHS = 4
RECORDS = 40


@pytest.fixture
def cluster(tmp_path: Path):
    spark = SparkCluster(tmp_path / "spark", workers=2, cores=1, memory="1g")
    try:
        spark.start(LIVE)
        yield spark
    finally:
        spark.stop()


def _names(tmp_path: Path) -> tuple[str, str]:
    return "cx-" + tmp_path.name[-8:], "cy-" + tmp_path.name[-8:]


def _running(worker: Worker) -> Callable[[], None]:
    """An ``on_wait`` check: the driver must not end while a test waits for its held task."""
    def check() -> None:
        assert worker.proc.poll() is None, f"the Spark driver exited {worker.proc.returncode}: {worker.stderr}"
    return check


def _hung_task(path: Path, healthy: Callable[[], None]) -> int:
    """The process id of the held task attempt, once it is held; ``healthy`` fails the wait if a driver that
    should hold it ended."""
    wait_for(path.exists, LIVE, "a write task to reach its hold point", on_wait=healthy)
    return int(path.read_text())


def _hold(batch: int, point: str, path: Path, seconds: int = 3600) -> list[str]:
    """Sink options of the tests' faulty sink (tests/spark_faults.py): hold slot 0's first attempt in ``batch``."""
    opts = {"hangTask": f"{batch}/0", "hangAt": point, "hangFile": str(path), "hangSeconds": str(seconds)}
    return as_args("--sink-option", opts)


@pytest.mark.parametrize("point", [pytest.param("write", marks=pytest.mark.long), "precommit"])
def test_executor_killed_inside_a_write_task(point, cluster, stack, root, ledger, tmp_path, spawn):
    """SIGKILL the executor JVM running slot 0's write in batch 1: with its records flushed to Kafka and the
    transaction open, or with the transaction committed and the commit message not yet returned."""
    source, target = _names(tmp_path)
    fill(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    hang = tmp_path / "hang"
    worker, _ = start(spawn, stack, root, source, target, tmp_path / "cp", "--master", cluster.url,
                      *_hold(1, point, hang))
    executor = executor_of(_hung_task(hang, _running(worker)))
    assert executor is not None and executor in cluster.executors(), \
        "the held task does not run in one of the cluster's executors"
    os.kill(executor, signal.SIGKILL)
    worker.finish(LIVE)
    check(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    if point == "precommit":  # the killed attempt's transaction is in Kafka, stamped with an attempt nobody names
        assert raw_count(stack.kafka, target, 2) > EPOCHS * RECORDS


@pytest.mark.long  # make test keeps the executor killed at pre-commit, the hot-swap and the footprint
def test_speculative_attempts_of_one_write_task(cluster, stack, root, ledger, tmp_path, spawn):
    """Slot 0's first attempt in batch 1 holds after committing its Kafka transaction; with speculation on,
    Spark runs a second attempt of the same task on the other executor. The batch can only finish through
    that second attempt, and readers keep only the attempt the driver committed."""
    source, target = _names(tmp_path)
    fill(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    hang = tmp_path / "hang"
    speculation = {"spark.speculation": "true", "spark.speculation.interval": "200ms",
                   "spark.speculation.quantile": "0.5", "spark.speculation.multiplier": "1.5",
                   "spark.speculation.minTaskRuntime": "1s"}
    conf = [arg for k, v in speculation.items() for arg in ("--conf", f"{k}={v}")]
    worker, _ = start(spawn, stack, root, source, target, tmp_path / "cp", "--master", cluster.url, *conf,
                      *_hold(1, "precommit", hang))
    _hung_task(hang, _running(worker))
    wait_batch(ledger, worker, target, 1)  # only a second attempt of slot 0's task can have finished batch 1
    worker.finish(LIVE)
    check(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    assert raw_count(stack.kafka, target, 2) > EPOCHS * RECORDS, "the held attempt's records are in Kafka"


@pytest.mark.long  # make test keeps the executor killed at pre-commit, the hot-swap and the footprint
def test_worker_killed_and_restarted(cluster, stack, root, ledger, tmp_path, spawn):
    """SIGKILL the worker whose executor runs slot 0's write in batch 1 (the executor goes with it), then
    start the worker again: the task runs on the other worker, the restarted one rejoins."""
    source, target = _names(tmp_path)
    fill(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    hang = tmp_path / "hang"
    worker, _ = start(spawn, stack, root, source, target, tmp_path / "cp", "--master", cluster.url,
                      *_hold(1, "write", hang))
    executor = executor_of(_hung_task(hang, _running(worker)))
    victim = cluster.worker_of(executor)
    assert victim is not None, "the held task's executor belongs to no worker of the cluster"
    cluster.kill_worker(victim)
    cluster.start_worker(victim)
    worker.finish(LIVE)
    cluster.wait_workers(cluster.workers, LIVE)
    check(ledger, stack.kafka, source, target, EPOCHS, RECORDS)


@pytest.mark.long  # make test keeps the executor killed at pre-commit, the hot-swap and the footprint
def test_driver_killed_and_restarted_against_the_cluster(cluster, stack, root, ledger, tmp_path, spawn):
    """The driver SIGKILLed right after batch 1's ZooKeeper commit (before Spark's commit log): the restarted
    driver, on the same cluster and checkpoint, runs batch 1 again and readers see it once."""
    source, target = _names(tmp_path)
    fill(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    checkpoint = tmp_path / "cp"
    worker, jvm = start(spawn, stack, root, source, target, checkpoint, "--master", cluster.url,
                        "--pause-after-commit", "1")
    wait_batch(ledger, worker, target, 1)
    kill(worker, jvm)
    worker, _ = start(spawn, stack, root, source, target, checkpoint, "--master", cluster.url)
    worker.finish(LIVE)
    check(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    assert raw_count(stack.kafka, target, 2) > EPOCHS * RECORDS, "batch 1 ran twice"


def test_executors_reuse_their_zookeeper_sessions(cluster, stack, root, ledger, tmp_path, spawn):
    """Issue 20's bound on executors' footprint, measured from outside as ``experiments.bench_executors``
    does (ZooKeeper's ``cons``, every 0.2 s: a lower bound): every process of the query (the driver's and
    the executors' Python workers) holds at most one ZooKeeper session, opened when it first needs one and
    reused across micro-batches: none per task.
    And no task makes a request of its own: a write task gets its slot's lease from the driver's writer,
    and one read task per subject records the batch's lineage, so the executors' requests per batch do
    not grow with its tasks (2 here, each a read and a write)."""
    from aligner.connectors.spark.writer import read_progress
    from experiments.bench_executors import PING_EVERY, Sampler

    source, target = _names(tmp_path)
    fill(ledger, stack.kafka, source, target, 2 * EPOCHS, RECORDS)
    sampler = Sampler(int(stack.zk.rsplit(":", 1)[1]), int(stack.kafka.rsplit(":", 1)[1]))
    sampler.start()
    try:
        worker, _ = start(spawn, stack, root, source, target, tmp_path / "cp", "--master", cluster.url)
        wait_batch(ledger, worker, target, 2)
        sampler.sample()
        warm_at, warm_conns = time.monotonic(), dict(sampler.zk_conns)
        in_executors = {pid for pid, _, _ in sampler.zk_conns.values() if executor_of(pid) is not None}
        wait_batch(ledger, worker, target, 2 * EPOCHS - 1)
        sampler.sample()
        elapsed = time.monotonic() - warm_at
        where = {sid: (pid, executor_of(pid)) for pid, sid, _ in sampler.zk_conns.values()}
        worker.finish(LIVE)
    finally:
        sampler.stop.set()
        sampler.join(10)
    check(ledger, stack.kafka, source, target, 2 * EPOCHS, RECORDS)
    progress, _ = read_progress(ledger, target, SINK)
    assert progress is not None
    in_executors |= {pid for pid, executor in where.values() if executor is not None}
    # Requests per batch on the executors' sessions open at batch 2 (a session opened later spends its first
    # requests on setting itself up: per process, not per batch).
    steady = {port: c for port, c in sampler.zk_conns.items() if c[0] in in_executors and port in warm_conns}
    requests = sum(n - warm_conns[port][2] for port, (_, _, n) in steady.items())
    pings = len(steady) * elapsed / PING_EVERY
    per_batch = (requests - pings) / (progress.batch - 2)
    late = {port: n for port, (pid, _, n) in sampler.zk_conns.items() if port not in warm_conns and pid in in_executors}
    print(f"executors: {requests} ZooKeeper requests on {len(steady)} sessions in {elapsed:.1f} s, {pings:.1f} of them "
          f"pings, {progress.batch - 2} micro-batches: {per_batch:.2f} per batch; sessions opened later: {late}")
    assert per_batch <= 3.0, f"executors made {per_batch:.1f} ZooKeeper requests per micro-batch of 2 tasks"
    sessions: dict[int, set[str]] = {}
    for pid, sid, _ in sampler.zk_conns.values():
        sessions.setdefault(pid, set()).add(sid)
    assert in_executors, f"no executor process held a ZooKeeper session: {sessions}"
    assert all(len(s) == 1 for s in sessions.values()), f"a process held several sessions: {sessions}"
    # A session opened after warm-up is a process's first (a Python worker whose first read task to record
    # lineage came late): the sampler keeps every connection it saw, so a second one would show above.


def test_query_hotswap_with_an_executor_killed_at_precommit(cluster, stack, root, ledger, subject_name, tmp_path,
                                                           spawn):
    """Q1 (running count) hot-swapped for Q2 (running sum), each its own application on the cluster (one core
    each) under continuous input. Once S is pre-committed and acknowledged, the next write task of slot 0
    (Q1's last batches up to S, or Q2's first after) holds after committing its Kafka transaction and its
    executor is SIGKILLed: the task reruns, the swap completes, every result once from the version that
    owned its epoch."""
    arm, hang = tmp_path / "arm", tmp_path / "hang"
    hold = {"hangTask": "*/0", "hangAt": "precommit", "hangFile": str(hang), "hangArm": str(arm)}
    extra = ("--master", cluster.url, "--conf", "spark.cores.max=1", *as_args("--sink-option", hold))
    pair = SwapPair(spawn, stack, ledger, root, subject_name, tmp_path, extra=extra)
    old, new, target = pair.old, pair.new, pair.target
    swapper = HotSwap(ledger)
    o, n = swapper.check(old.job, new.job, target)
    swap, _ = precommit_acked(swapper, o, n, LIVE, pair.healthy)
    arm.touch()
    done: list = []
    runner = threading.Thread(target=lambda: done.append(swapper.run(o.job, n.job, target, timeout=LIVE)),
                              name="hotswap-run")
    runner.start()
    try:
        # Q1 may end at S before the arm is seen (then Q2's first write holds): only a crash fails the wait.
        executor = executor_of(_hung_task(hang, pair.healthy))
        assert executor is not None and executor in cluster.executors(), \
            "the held task does not run in one of the cluster's executors"
        os.kill(executor, signal.SIGKILL)
    finally:
        runner.join(LIVE)
    assert done and done[0].phase == "done" and done[0].epoch == swap.epoch
    pair.finish(swap.epoch)
