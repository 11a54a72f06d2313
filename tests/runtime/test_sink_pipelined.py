"""Pipelined sink commits (``commit(wait=False)``): the ZooKeeper commit of an epoch rides beside the
next epoch's sends. Readers see what they see with waited-for commits; a ZooKeeper commit that did
not land aborts the epoch after it too, and the producer resumes from ``next_epoch``. A pipelined
commit makes the next epoch's node too, where the producer is its only writer: one round trip per epoch.
Real ZooKeeper and broker; process kills are in tests/runtime/test_exactly_once.py."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

import pytest
from kazoo.exceptions import ConnectionLoss

from aligner.connectors.reader import EpochReader
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.errors import EpochFailedError, EpochNotCommittedError
from aligner.ledger import Contribution, Lease, PendingCommit
from aligner.ops import Op
from tests.helpers import raw_records

RECORDS = 25


def _write(p: SinkProducer, tag: str) -> tuple[int, list[bytes]]:
    epoch = p.begin()
    values = [json.dumps({"epoch": epoch, "j": j, "tag": tag}).encode() for j in range(RECORDS)]
    for j, v in enumerate(values):
        p.send(v, key=b"k%d" % j)
    return epoch, values


def _read(ledger, kafka: str, subject: str, first: int, last: int) -> dict[int, Counter]:
    got: dict[int, Counter] = {e: Counter() for e in range(first, last + 1)}
    with EpochReader(ledger, kafka) as reader:
        for r in reader.read(subject, first, last):
            got[r.epoch][r.value] += 1
    return got


def test_pipelined_epochs_commit_in_order_and_read_exactly_once(stack, ledger, subject_name) -> None:
    create_subject(ledger, stack.kafka, subject_name, 2)
    written: dict[int, list[bytes]] = {}
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1]) as p:
        first = p.next_epoch
        for n in range(5):
            epoch, values = _write(p, "a")
            assert epoch == first + n  # numbered on from the epoch in flight, not from ZooKeeper's last
            p.commit(wait=False)
            written[epoch] = values
        assert p.sync() == first + 4
        assert p.lease.node.committed_epoch == first + 4
        epoch, values = _write(p, "waited")  # a waited-for commit after pipelined ones
        written[epoch] = values
        assert p.commit().epoch == first + 5
        epoch, values = _write(p, "last")
        p.commit(wait=False)
        written[epoch] = values
        epoch, _ = _write(p, "aborted")  # abort waits for the commit in flight, which stands
        p.abort()
        assert p.next_epoch == epoch and p.attempt == 2
        assert p.finish() == first + 6  # finish waits for nothing left in flight
    got = _read(ledger, stack.kafka, subject_name, first, first + 6)
    assert got == {e: Counter(vs) for e, vs in written.items()}


def test_a_zookeeper_commit_that_did_not_land_aborts_the_next_epoch_and_rewinds(stack, ledger, subject_name,
                                                                                monkeypatch) -> None:
    """The ledger retries connection loss for ever, so what reaches the sink is a commit that failed for
    good; here one that never left (its result raises): epoch N's Kafka transaction committed, ZooKeeper
    does not name it, and N+1 is open when that shows."""
    create_subject(ledger, stack.kafka, subject_name, 2)

    class Lost:
        def get(self) -> list[object]:
            raise ConnectionLoss("injected: the commit multi-op did not land")

    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1]) as p:
        base, _ = _write(p, "a")
        p.commit()
        real = ledger.commits.commit_epoch_async
        monkeypatch.setattr(ledger.commits, "commit_epoch_async",
                            lambda epoch, contributions, extra=(), writers=None: PendingCommit(
                                epoch, contributions, ledger.commits._commit_ops(epoch, contributions)[1], Lost()))
        lost, _ = _write(p, "lost")
        p.commit(wait=False)
        monkeypatch.setattr(ledger.commits, "commit_epoch_async", real)
        following, _ = _write(p, "aborted")
        with pytest.raises(EpochFailedError, match=f"epoch {lost} .* did not commit in ZooKeeper.*from epoch {lost}"):
            p.commit(wait=False)
        assert p.next_epoch == lost and p.attempt == 2
        rewritten = {}
        for _ in range(2):
            epoch, values = _write(p, "again")
            p.commit(wait=False)
            rewritten[epoch] = values
        p.sync()
        assert sorted(rewritten) == [lost, following]
    assert _read(ledger, stack.kafka, subject_name, lost, following) == {
        e: Counter(vs) for e, vs in rewritten.items()}
    # The broker holds the first attempt of both: the lost epoch committed in Kafka, the next one aborted there.
    attempts = Counter((v["epoch"], v["tag"]) for v in (json.loads(m.value())
                                                        for m in raw_records(stack.kafka, subject_name, 2)))
    assert attempts[(lost, "lost")] == RECORDS and attempts[(lost, "again")] == RECORDS
    assert attempts[(following, "aborted")] == RECORDS and attempts[(following, "again")] == RECORDS
    assert attempts[(base, "a")] == RECORDS


def test_zookeeper_commits_in_flight_at_close_are_found_by_the_next_incarnation(stack, ledger,
                                                                                 subject_name) -> None:
    """Closed (or killed) with a commit on its way: whether it landed is ZooKeeper's to say, and the
    next incarnation writes on from there."""
    create_subject(ledger, stack.kafka, subject_name, 1)
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0]) as p:
        epoch, values = _write(p, "a")
        p.commit(wait=False)
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0]) as again:
        landed = again.next_epoch == epoch + 1
        if not landed:
            assert again.next_epoch == epoch
            epoch, values = _write(again, "b")
            again.commit()
    assert _read(ledger, stack.kafka, subject_name, epoch, epoch) == {epoch: Counter(values)}


def test_a_pipelined_commit_makes_the_next_epoch_one_round_trip_per_epoch(stack, ledger, subject_name) -> None:
    create_subject(ledger, stack.kafka, subject_name, 2)
    written: dict[int, list[bytes]] = {}
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1]) as p:
        for _ in range(2):  # the writers document read and cached, the first epoch node made
            epoch, written[epoch] = _write(p, "warm")
            p.commit(wait=False)
        first, trips = p.next_epoch, ledger.round_trips
        for _ in range(5):
            epoch, written[epoch] = _write(p, "steady")
            p.commit(wait=False)
        assert p.sync() == first + 4
        assert ledger.round_trips - trips == 5  # each epoch's commit multi-op made the node of the epoch after it
        assert ledger.epochs.epoch_node(subject_name, first + 5).writers == (p.lease.writer,)
        assert p.finish() == first + 4  # the epoch made ahead gets an empty contribution: it commits, empty
    assert ledger.epochs.finished(subject_name) == first + 4 and ledger.epochs.is_committed(subject_name, first + 5)
    got = _read(ledger, stack.kafka, subject_name, min(written), first + 4)
    assert got == {e: Counter(vs) for e, vs in written.items()}


def test_a_writer_joining_under_a_pipelined_commit_gets_the_next_epoch_made_for_both(stack, ledger, subject_name,
                                                                                     monkeypatch) -> None:
    """The sink's cached writers document says it writes alone, but another producer joined meanwhile and
    made the next epoch: the commit with that epoch in it fails whole, lands again without it, and the next
    epoch is the joiner's, naming both. The sink then knows it no longer writes alone."""
    create_subject(ledger, stack.kafka, subject_name, 2)
    written: dict[int, list[bytes]] = {}
    waited: list[tuple[int, tuple[str, ...]]] = []  # the commits made with a waited-for multi-op
    real = ledger.commits.commit_epoch

    def commit_epoch(epoch: int, contributions: Sequence[Contribution], extra: Sequence[Op] = ()) -> list[Lease]:
        waited.append((epoch, tuple(c.lease.writer for c in contributions)))
        return real(epoch, contributions, extra)

    monkeypatch.setattr(ledger.commits, "commit_epoch", commit_epoch)
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0]) as p:
        epoch, written[epoch] = _write(p, "p")  # its begin cached the writers document: p alone
        with SinkProducer(ledger, stack.kafka, subject_name, "k", 1, [1]) as q:
            assert q.next_epoch == epoch + 1  # q joined at the epoch after the last one made
            p.commit(wait=False)
            nxt, values = _write(p, "p")
            q_epoch, q_values = _write(q, "q")
            assert nxt == q_epoch == epoch + 1
            q.commit()
            p.commit(wait=False)
            written[nxt] = values + q_values
            both = (p.lease.writer, q.lease.writer)
            assert ledger.epochs.epoch_node(subject_name, nxt).writers == tuple(sorted(both))
            p.sync()
            assert p.lease.node.committed_epoch == nxt
            assert sorted(waited) == [(epoch, (p.lease.writer,)), (nxt, (q.lease.writer,))]  # p's first, made again
            last, values = _write(p, "p")
            q_last, q_values = _write(q, "q")
            assert last == q_last == nxt + 1
            q.commit()
            p.commit(wait=False)
            p.sync()
            written[last] = values + q_values
            with pytest.raises(EpochNotCommittedError):  # p made no epoch ahead: it no longer writes alone
                ledger.epochs.epoch_node(subject_name, last + 1)
    got = _read(ledger, stack.kafka, subject_name, epoch, last)
    assert got == {e: Counter(vs) for e, vs in written.items()}


def test_a_writers_change_under_a_pipelined_commit_makes_it_commit_again_and_the_next_epoch_be_made(
        stack, ledger, subject_name, monkeypatch) -> None:
    """The writers document changed after the sink cached it, without making the sink's next epoch (a producer
    joins from a later epoch): the commit with that epoch's node in it fails whole on the document's version,
    lands again without it, and the epoch the sink has begun meanwhile gets its node the usual way."""
    create_subject(ledger, stack.kafka, subject_name, 2)
    written: dict[int, list[bytes]] = {}
    waited: list[int] = []
    real = ledger.commits.commit_epoch

    def commit_epoch(epoch: int, contributions: Sequence[Contribution], extra: Sequence[Op] = ()) -> list[Lease]:
        waited.append(epoch)
        return real(epoch, contributions, extra)

    monkeypatch.setattr(ledger.commits, "commit_epoch", commit_epoch)
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0]) as p:
        epoch, written[epoch] = _write(p, "p")  # its begin cached the writers document
        later = epoch + 4
        ledger.claims.claim_producers(subject_name, "later", {"0": [1]}, lambda parts: dict.fromkeys(parts, 0),
                               not_before=later)
        p.commit(wait=False)
        for _ in range(3):
            e, written[e] = _write(p, "p")
            p.commit(wait=False)
        assert p.sync() == later - 1
        assert waited == [epoch]  # the first commit, made again without the next epoch's node
        assert [ledger.epochs.epoch_node(subject_name, e).writers for e in range(epoch + 1,
                                                                                 later)] == [(p.lease.writer,)] * 3
        assert ledger.epochs.epoch_node(subject_name, later).writers == tuple(sorted((p.lease.writer, "later:0")))
    assert _read(ledger, stack.kafka, subject_name, epoch, later - 1) == {e: Counter(vs) for e, vs in written.items()}
