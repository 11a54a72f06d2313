"""Network partitions (issue 52): a component cut off from ZooKeeper, Kafka or its peers while the chain runs.

Each test plays the chaos checker's run with a fixed nemesis of one network fault, every component in a
network namespace of its own (:mod:`aligner.coordinator.netns`), and holds the drained chain to the checker's
every anomaly class, fencing and missing commits included. They need root (namespaces, nftables).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aligner.coordinator.netns import NetLab, available
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
