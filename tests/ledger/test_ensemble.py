"""A ZooKeeper ensemble of three servers: the shape users deploy.

The chain of ``test_faults`` (an outside producer, the epoch marker, a job of two workers, every one a real
process) runs against three ZooKeeper servers on loopback with the coordinator's retention loop beside it and
an alignment in flight; the leader is SIGKILLed and restarted, then a follower SIGSTOPped past the
session timeout (one at a time: three servers keep a quorum through one loss, not two). Every input has
exactly one result, no component exits, and each stops on SIGTERM. ``aligner stack up --zk-servers 3`` is
tested with the detached stack (``test_stack.py``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aligner.connectors.subjects import create_subject
from aligner.embedded.ensemble import ZkEnsemble
from aligner.embedded.stack import EmbeddedStack, StackInfo
from aligner.errors import StackError
from aligner.ledger import Ledger
from tests.helpers import Worker, wait_for
from tests.runtime.test_faults import LIVE, Chain, OutsideProducer

PAUSED = 15.0
"""A follower stopped longer than the 10 s session timeout: its clients must move to another server."""


@pytest.fixture
def ensemble_stack() -> Iterator[tuple[EmbeddedStack, StackInfo]]:
    stack = EmbeddedStack(zk_servers=3)
    info = stack.start()
    try:
        yield stack, info
    finally:
        stack.stop()


@pytest.fixture
def ensemble_chain(ensemble_stack: tuple[EmbeddedStack, StackInfo]) -> Iterator[tuple[Chain, ZkEnsemble]]:
    stack, info = ensemble_stack
    assert stack.ensemble is not None
    root = f"/aligner-ensemble-{uuid.uuid4().hex[:8]}"
    name = f"e-{uuid.uuid4().hex[:8]}"
    ledger = Ledger.connect(info.zk, root)
    c = Chain(info, root, name, f"{name}-out", f"{name}-job", ledger)
    try:
        create_subject(ledger, info.kafka, c.inp, 2)
        create_subject(ledger, info.kafka, c.out, 2)
        yield c, stack.ensemble
    finally:
        if c.producer is not None:
            c.producer.stop.set()
            c.producer.thread.join(30)
        for i in range(stack.ensemble.servers):
            stack.ensemble.resume(i)
        for w in c.procs:
            w.stop()
            print(f"--- {' '.join(w.args[:12])}: exit {w.proc.returncode}\n{w.stderr}")
        ledger.close()


def _moves(chain: Chain, what: str) -> None:
    """The job commits output epochs again: three past the frontier seen now."""
    start = chain.ledger.epochs.frontier(chain.out) or 0
    wait_for(lambda: (chain.ledger.epochs.frontier(chain.out) or 0) >= start + 3, LIVE,
             f"the job to commit again {what}",
             interval=0.2, on_wait=chain.alive)


def test_leader_killed_and_follower_paused_under_a_running_chain_exactly_once(
        ensemble_chain: tuple[Chain, ZkEnsemble]) -> None:
    chain, ensemble = ensemble_chain
    assert [ensemble.mode(i) for i in range(3)].count("leader") == 1
    chain.producer = OutsideProducer(chain.info.kafka, chain.inp)
    chain.start_marker()
    for i in range(2):
        chain.start_worker(i)
    keeper = Worker("aligner.coordinator", *chain.cli_args(), "retention", "run", "--every", "1")
    chain.procs.append(keeper)
    _moves(chain, "on the ensemble")
    align = Worker("aligner.coordinator", *chain.cli_args(), "align", chain.job, "--timeout", str(LIVE))

    leader = ensemble.leader()
    ensemble.kill(leader)  # while the alignment runs: a new leader is elected, sessions survive
    assert align.proc.wait(LIVE + 30) == 0, align.stderr
    _moves(chain, "after the leader was killed")

    ensemble.restart(leader, LIVE)  # the old leader rejoins from its data (a quorum of 3 survives one loss)
    assert sorted(ensemble.mode(i) or "" for i in range(3)) == ["follower", "follower", "leader"]
    follower = next(i for i in range(3) if ensemble.mode(i) == "follower")
    ensemble.pause(follower)
    try:
        time.sleep(PAUSED)  # the pause is the test's input, not a wait for progress
        chain.alive()
        _moves(chain, "with a follower paused")
    finally:
        ensemble.resume(follower)
    _moves(chain, "with every server back")

    sent = chain.producer.close()
    chain.alive()
    chain.drain_and_check(sent)
    chain.terminate_all()


def test_a_command_started_while_the_ensemble_has_no_quorum_waits_for_its_session(tmp_path) -> None:
    """Two of three servers stopped: the third answers TCP but refuses sessions (no quorum), as an ensemble does
    while it elects a leader. A command that rides out an outage of its ``--timeout`` waits that long for its
    first session too: started then, it ends with its own answer once the quorum is back (here: the job is
    unknown), not with "cannot reach ZooKeeper" after the 8 s a first session used to get."""
    ensemble = ZkEnsemble(tmp_path / "zk", 3)
    hosts = ensemble.start()
    env = {"ALIGNER_ZK": hosts, "ALIGNER_KAFKA": "127.0.0.1:1", "ALIGNER_ROOT": "/quorum",
           "ALIGNER_HOME": str(tmp_path / "home")}
    stopped = [0, 1]
    try:
        for i in stopped:
            ensemble.pause(i)
        command = Worker("aligner.coordinator", "align", "no-such-job", "--timeout", "90", env=env)
        try:
            time.sleep(12)  # the outage is the test's input, longer than a first session's old 8 s
            assert command.proc.poll() is None, f"the command gave up during the outage: {command.stderr}"
            for i in stopped:
                ensemble.resume(i)
            assert command.proc.wait(90) == 1
            assert "unknown job 'no-such-job'" in command.stderr, command.stderr
        finally:
            command.stop()
    finally:
        for i in stopped:
            ensemble.resume(i)
        ensemble.stop()


def test_an_ensemble_needs_an_odd_number_of_servers(tmp_path) -> None:
    with pytest.raises(StackError, match="odd number of servers, at least 3"):
        ZkEnsemble(tmp_path, 2)
    with pytest.raises(StackError, match="TLS is not supported"):
        EmbeddedStack(zk_tls=True, zk_servers=3)



@pytest.mark.long  # make test keeps the leader killed and a follower paused under a running chain
@pytest.mark.parametrize("damage", ["snapshots", "log-byte"])
def test_a_member_whose_data_was_damaged_while_down_rejoins_with_the_whole_tree(damage, tmp_path) -> None:
    """A follower stopped, its data damaged while the quorum writes on, then restarted. ``snapshots``: every
    snapshot overwritten with garbage and its transaction log cut short (ZooKeeper either drops what fails
    and syncs the rest from the leader, or refuses, depending on where the cut falls). ``log-byte``: a
    byte flipped inside the log's transactions, which ZooKeeper refuses ("Unable to load database on
    disk": CRC check failed). A refused member gets the operator's procedure from the harness: its data
    moved aside, started empty, a snapshot from the leader. Either way it serves the whole tree."""
    from kazoo.client import KazooClient

    ensemble = ZkEnsemble(tmp_path / "zk", 3)
    clients: list[KazooClient] = []
    try:
        client = KazooClient(ensemble.start())
        clients.append(client)
        client.start(30)
        for i in range(1500):
            client.create(f"/n{i}", b"x" * 100)
        follower = next(i for i in range(3) if i != ensemble.leader())
        ensemble.kill(follower)
        for i in range(1500, 1700):
            client.create(f"/n{i}", b"y" * 100)
        data = ensemble.data_dir(follower)
        log = max(data.glob("log.*"), key=lambda p: p.stat().st_mtime)
        raw = bytearray(log.read_bytes())
        if damage == "snapshots":
            for snapshot in data.glob("snapshot.*"):
                snapshot.write_bytes(b"garbage")
            raw = raw[:150_000]
        else:
            raw[len(raw.rstrip(b"\0")) // 2] ^= 0xFF
        log.write_bytes(bytes(raw))
        ensemble.restart(follower, 120)
        aside = list(data.parent.glob("version-2.damaged-*"))
        if damage == "log-byte":
            assert len(aside) == 1, f"a log that fails its checksum was not moved aside: {aside}"
        alone = KazooClient(f"127.0.0.1:{ensemble.ports[follower].client}")
        clients.append(alone)
        alone.start(30)
        alone.sync("/")
        assert ensemble.mode(follower) == "follower"
        assert sorted(c for c in alone.get_children("/") if c.startswith("n")) == sorted(f"n{i}" for i in range(1700))
    finally:
        for c in clients:
            c.stop()
            c.close()
        ensemble.stop()


def test_an_ensemble_in_a_relative_directory_starts(tmp_path, monkeypatch) -> None:
    """A relative work directory (e.g. the chaos checker's ``--out results/x``): each server runs in its own
    directory, so the harness hands it absolute paths."""
    monkeypatch.chdir(tmp_path)
    ensemble = ZkEnsemble(Path("relative") / "zk", 3)
    try:
        ensemble.start(120)
        assert ensemble.mode(ensemble.leader()) == "leader"
    finally:
        ensemble.stop()
