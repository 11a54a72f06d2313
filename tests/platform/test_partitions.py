"""Network partitions (issue 52): a component cut off from ZooKeeper, Kafka or its peers while the chain runs.

Each test plays the chaos checker's run with a fixed nemesis of one network fault, every component in a
network namespace of its own (:mod:`aligner.embedded.netns`), and holds the drained chain to the checker's
every anomaly class, fencing and missing commits included. They need root (namespaces, nftables).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aligner.embedded.netns import NetLab, available
from aligner.epochs import CommittedEpoch, Slice
from experiments.chaos.history import History
from experiments.chaos.nemesis import NETWORK, QUORUM, Fault, schedule
from experiments.chaos.run import Run, execute

needs_netns = pytest.mark.skipif(available() is not None, reason=str(available()))


def test_network_faults_are_drawn_only_with_netns() -> None:
    """Without --netns a seed's plan is what it always was; with it, cuts and skews join the draw (the
    ensemble's own only on an ensemble), each with a target and a duration."""
    plain = schedule(5, 50, 120, cluster=True, rocksdb=True)
    assert all(f.kind not in NETWORK for f in plain[0])
    assert plain == schedule(5, 50, 120, cluster=True, rocksdb=True, netns=False, quorum=True)
    drawn, _ = schedule(5, 200, 120, cluster=True, rocksdb=True, netns=True, quorum=True)
    kinds = {f.kind for f in drawn}
    assert set(NETWORK) <= kinds
    assert all(f.target and f.duration > 0 for f in drawn if f.kind in NETWORK)
    assert any(f.duration > 10 for f in drawn if f.kind == "cut-zk")  # some outlast the session timeout
    assert [f.target for f in drawn if f.kind == "split-zk"][:2] == ["leader", "follower"]  # in turn
    alone, _ = schedule(5, 200, 120, netns=True, quorum=False)
    assert not {f.kind for f in alone} & {*QUORUM, "cut-driver"}


def _epoch(epoch: int, start: int, end: int, attempt: int) -> CommittedEpoch:
    return CommittedEpoch("a", epoch, {0: Slice(0, start, end, f"A-0/{epoch}/{attempt}".encode())}, 0)


def test_history_reports_a_changed_and_a_vanished_commit() -> None:
    """An epoch seen committed whose attempt differs at the end is a fencing anomaly; one that is gone at the
    end is a missing commit (not judged once retention collected epochs)."""
    history = History("unused:2181", "/unused", ["a"])
    for ce in (_epoch(1, 0, 5, 0), _epoch(2, 5, 9, 0), _epoch(3, 9, 12, 0)):
        sl = ce.slices[0]
        history.seen["a"][ce.epoch] = {0: (sl.start, sl.end, sl.stamp.decode() if sl.stamp else None)}
    final = {"a": [_epoch(1, 0, 5, 0), _epoch(2, 5, 9, 1)]}
    found = history.judge(final, retained=False)
    assert [(cls, subject) for cls, subject, _ in found] == [("fencing", "a"), ("missing_commit", "a")]
    assert [cls for cls, _, _ in history.judge(final, retained=True)] == ["fencing"]


@pytest.fixture
def lab() -> Iterator[NetLab]:
    with NetLab() as lab:
        yield lab


@needs_netns
@pytest.mark.stack
def test_a_cut_drops_traffic_between_two_namespaces_only(lab: NetLab) -> None:
    """A cut between two namespaces drops their packets (a connect times out) while the owner still reaches
    both; a join restores it; a slow link still delivers."""
    a, b = lab.add("a"), lab.add("b")
    server = subprocess.Popen([*b.prefix(), sys.executable, "-c",
                               "import socket, sys\n"
                               f"s = socket.create_server(('{b.ip}', 7000)); print('up', flush=True)\n"
                               "while True:\n    c, _ = s.accept(); c.close()"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"

        def reach(prefix: list[str]) -> bool:
            probe = f"import socket; socket.create_connection(('{b.ip}', 7000), timeout=2)"
            return subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True).returncode == 0

        assert reach(a.prefix()) and reach([])
        lab.cut("a", ["b"])
        assert not reach(a.prefix()) and reach([])
        lab.join("a")
        assert reach(a.prefix())
        lab.slow_link("a", 256, 10)
        assert reach(a.prefix())
        lab.heal()
        with socket.create_connection((b.ip, 7000), timeout=2):
            pass
    finally:
        server.kill()
        server.wait(10)


def play(tmp_path: Path, faults: list[Fault], ops: list[Fault] | None = None) -> tuple[Run, dict[str, Any]]:
    run = Run(52, faults, ops or [], tmp_path / "run", rate=100.0, faust=False, netns=True)
    return run, execute(run, drain_timeout=400)


def assert_clean(run: Run, result: dict[str, Any]) -> None:
    totals = result["check"]["anomalies"]["totals"]
    assert sum(totals.values()) == 0, (totals, result["check"]["anomalies"]["examples"])
    assert not run.observations, run.observations
    assert result["check"]["records_checked"] > 0
    assert run.swap_committed


@needs_netns
@pytest.mark.stack
def test_worker_cut_from_zookeeper_past_its_session_writes_every_record_once(tmp_path: Path) -> None:
    """A job worker keeps reaching Kafka but not ZooKeeper for longer than its session timeout (10 s): its
    session expires, it stops committing and says why; when the cut heals it resumes, by itself, and every
    record reaches ``a`` exactly once."""
    pytest.importorskip("pyspark")
    run, result = play(tmp_path, [Fault(8.0, "cut-zk", "worker 0", 16.0)])
    assert_clean(run, result)
    cut = next(e for e in run.events if e["kind"] == "cut-zk")
    assert cut["target"] == "A-0 from ZooKeeper"
    worker = run.procs["A-0"]
    assert worker.starts == 1, "the worker was restarted: it must ride the partition out"
    said = worker.stderr_tail(1 << 20)
    assert "ZooKeeper connection lost" in said and "session expired" in said, said[-2000:]


def test_a_producer_waiting_on_the_broker_says_why_once_and_when_it_answers(
        caplog: pytest.LogCaptureFixture) -> None:
    """A partition from Kafka alone left a worker silent (librdkafka's log is silenced and a silent cut
    breaks no connection for a minute): its producer now says why it commits nothing, once, and when the
    broker answers again."""
    from aligner.connectors.stamped import BrokerWait

    wait = BrokerWait("A/0", "epoch 7's records", warn_after=0.0)
    with caplog.at_level(logging.WARNING, logger="aligner.connectors.stamped"):
        wait.still("3 not delivered yet")
        wait.still("3 not delivered yet")
        wait.answered()
        wait.answered()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "has not answered" in lines[0] and "epoch 7's records" in lines[0] and "still waiting" in lines[0]
    assert "answered again" in lines[1]


@pytest.mark.long  # a minute; make test keeps the cut from ZooKeeper
@needs_netns
@pytest.mark.stack
def test_worker_cut_from_kafka_says_why_and_resumes(tmp_path: Path) -> None:
    """A job worker that reaches ZooKeeper but not the broker for 16 s stops committing and says why on one
    line (it said nothing before); healed, it resumes by itself and every record reaches ``a`` once."""
    pytest.importorskip("pyspark")
    run, result = play(tmp_path, [Fault(8.0, "cut-kafka", "worker 0", 16.0)])
    assert_clean(run, result)
    worker = run.procs["A-0"]
    assert worker.starts == 1, "the worker was restarted: it must ride the partition out"
    said = worker.stderr_tail(1 << 20)
    assert "the broker has not answered" in said or "the broker does not answer" in said, said[-2000:]


@needs_netns
@pytest.mark.stack
def test_a_follower_cut_from_its_leader_serves_old_reads_until_a_sync(tmp_path: Path) -> None:
    """Found by a bridge of the ensemble under the Spark job: a follower cut from its leader serves its old
    state for seconds, so a session there read the sink's previous epoch although another session (the
    Python worker that committed the previous micro-batch) had committed the next: the batch was planned on
    the wrong epoch, its commit refused it, the query failed. ``Ledger.sync`` makes the reads that follow see
    every committed write: on the cut follower it waits until the follower reaches its leader again."""
    import threading

    from aligner.embedded.ensemble import ZkEnsemble
    from aligner.ledger import Ledger

    with NetLab() as net:
        ensemble = ZkEnsemble(tmp_path / "zk", 3, netns=net)
        ensemble.start()
        writer = reader = None
        try:
            follower = next(i for i in range(3) if i != ensemble.leader())
            rest = [i for i in range(3) if i != follower]
            writer = Ledger.connect(",".join(f"{ensemble.host(i)}:{ensemble.ports[i].client}" for i in rest), "/t")
            reader = Ledger.connect(f"{ensemble.host(follower)}:{ensemble.ports[follower].client}", "/t")
            writer.zk.create("/t/x", b"1", makepath=True)
            reader.sync()
            assert reader.zk.get("/t/x")[0] == b"1"
            net.cut(ensemble.name(follower), [ensemble.name(i) for i in rest])
            writer.zk.set("/t/x", b"2")
            assert reader.zk.get("/t/x")[0] == b"1", "the cut follower should still serve its old state"
            seen: list[bytes] = []

            def fresh() -> None:
                assert reader is not None
                reader.sync()
                seen.append(reader.zk.get("/t/x")[0])

            thread = threading.Thread(target=fresh, name="test-sync")
            thread.start()
            try:
                thread.join(3.0)
                assert not seen, f"a sync on a follower cut from its leader answered: {seen}"
            finally:
                net.join(ensemble.name(follower))
                thread.join(120)
            assert seen == [b"2"]
        finally:
            for led in (reader, writer):
                if led is not None:
                    led.close()
            ensemble.stop()
