"""Stamped sink + exact reader on the embedded stack: every record exactly once, crashes included."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter

import pytest
from confluent_kafka import Producer

from aligner.connectors.kafka import FetchingConsumer
from aligner.connectors.reader import EpochReader, read_partition, segments_by_partition
from aligner.connectors.sink import SinkProducer, partitions_for
from aligner.connectors.source import SourceRecord, SubjectSource
from aligner.connectors.subjects import create_subject
from aligner.epochs import Slice
from aligner.errors import EpochNotCommittedError, FencedError
from aligner.models import Range
from aligner.stamps import Stamp
from tests.helpers import Worker, json_value, raw_records

EPOCHS = 20
RECORDS = 40


def _expected(ledger, subject: str, epoch: int) -> Counter:
    return Counter(
        (w.split(":")[0], w.split(":")[1], epoch, j) for w in ledger.epochs.epoch_node(subject, epoch).writers
        for j in range(RECORDS)
    )


def _assert_exactly_once(reader: EpochReader, ledger, subject: str) -> None:
    """Every record of every epoch read once, in the epoch it was written for, from every expected writer."""
    for epoch in range(EPOCHS):
        seen: Counter = Counter()
        for record in reader.read(subject, epoch):
            v = json_value(record.value)
            assert v["epoch"] == epoch, f"record of epoch {v['epoch']} read in epoch {epoch}"
            seen[(v["sink"], v["producer"], v["epoch"], v["j"])] += 1
        assert seen == _expected(ledger, subject, epoch), f"epoch {epoch} not exactly once"


def test_two_sinks_two_producers_with_kills_read_exactly_once(stack, root, ledger, subject_name, spawn):
    create_subject(ledger, stack.kafka, subject_name, 8)
    common = ["--zk", stack.zk, "--kafka", stack.kafka, "--root", root, "--subject", subject_name,
              "--until", str(EPOCHS - 1), "--records", str(RECORDS), "--barrier", "4"]

    def start(sink: str, i: int, base: int, pause: str | None = None) -> Worker:
        parts = ",".join(str(base + p) for p in partitions_for(i, 2, 4))
        extra = ["--pause-at", pause] if pause else []
        return spawn.worker("tests.workers.sink_worker", *common, "--sink", sink, "--producer", str(i),
                            "--partitions", parts, *extra)

    # Pauses are relative to each producer's first epoch: producers join at different epochs.
    workers = {("A", 0): start("A", 0, 0, "+5:mid"), ("A", 1): start("A", 1, 0),
               ("B", 0): start("B", 0, 4), ("B", 1): start("B", 1, 4, "+9:after_kafka_commit")}
    paused = {}
    for key in (("A", 0), ("B", 1)):
        line = workers[key].wait_line(lambda line: line.startswith("paused"))
        paused[key[0]] = int(line.split()[1])
        workers[key].kill()
        workers[key] = start(key[0], key[1], 0 if key[0] == "A" else 4)
        reopened = workers[key].wait_line(lambda line: line.startswith("open"))
        assert "attempt=2" in reopened
    for w in workers.values():
        w.finish()

    with EpochReader(ledger, stack.kafka) as reader:
        _assert_exactly_once(reader, ledger, subject_name)
        first_a0 = min(e for e in range(EPOCHS) if "A:0" in ledger.epochs.epoch_node(subject_name, e).writers)

    # The broker does show the killed attempts' records beside the committed ones: the reader dropped them
    # (by range: unstamped epochs' ranges start past them).
    raw = raw_records(stack.kafka, subject_name, 8)
    copies: Counter[str] = Counter()
    for m in raw:
        v = json.loads(m.value())
        if (v["sink"], v["producer"], v["epoch"]) in (("A", "0", paused["A"]), ("B", "1", paused["B"])):
            copies[v["sink"]] += 1
    assert copies["A"] == 2 * RECORDS and copies["B"] == 2 * RECORDS, copies
    assert first_a0 <= paused["A"] < EPOCHS and paused["B"] < EPOCHS


def test_pipelined_commits_with_kills_read_exactly_once(stack, root, ledger, subject_name, spawn):
    """``commit(wait=False)``: one producer killed with its ZooKeeper commit on its way, another with an
    epoch open while the one before it was being committed; every epoch is read exactly once."""
    create_subject(ledger, stack.kafka, subject_name, 4)
    common = ["--zk", stack.zk, "--kafka", stack.kafka, "--root", root, "--subject", subject_name,
              "--until", str(EPOCHS - 1), "--records", str(RECORDS), "--barrier", "2", "--pipelined"]

    def start(i: int, pause: str | None = None) -> Worker:
        parts = ",".join(str(p) for p in partitions_for(i, 2, 4))
        extra = ["--pause-at", pause] if pause else []
        return spawn.worker("tests.workers.sink_worker", *common, "--sink", "P", "--producer", str(i),
                            "--partitions", parts, *extra)

    workers = {0: start(0, "+4:zk_commit_sent"), 1: start(1, "+7:mid")}
    for i in (0, 1):
        workers[i].wait_line(lambda line: line.startswith("paused"))
        workers[i].kill()
        workers[i] = start(i)
        assert "attempt=2" in workers[i].wait_line(lambda line: line.startswith("open"))
    for w in workers.values():
        w.finish()

    with EpochReader(ledger, stack.kafka) as reader:
        _assert_exactly_once(reader, ledger, subject_name)


def test_empty_epochs_and_aborts(stack, ledger, subject_name):
    create_subject(ledger, stack.kafka, subject_name, 2)
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1]) as p, \
            EpochReader(ledger, stack.kafka) as reader:
        e0 = p.begin()
        e0_commit = p.commit()
        assert all(r.empty for r in e0_commit.ranges.values())
        e1 = p.begin()
        p.send(b'"lost"', partition=0)
        p.abort()
        assert p.begin() == e1
        p.send(b'"kept"', partition=0)
        commit = p.commit()
        assert commit.attempt is None and p.attempt == 2  # the second attempt, written without stamps
        assert commit.ranges[0].end - commit.ranges[0].start == 1  # its range holds its one record alone
        assert list(reader.read(subject_name, e0)) == []
        assert [r.value for r in reader.read(subject_name, e1)] == [b'"kept"']
        with pytest.raises(EpochNotCommittedError):
            list(reader.read(subject_name, e1 + 1))


def test_crash_between_kafka_and_zookeeper_commit_rewrites_the_epoch(stack, ledger, subject_name):
    create_subject(ledger, stack.kafka, subject_name, 1)

    class Crash(Exception):
        pass

    def crash(point: str) -> None:
        if point == "after_kafka_commit":
            raise Crash

    first = SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0], fault=crash).open()
    epoch = first.begin()
    first.send(b'"attempt-1"')
    with pytest.raises(Crash):
        first.commit()
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0]) as second, \
            EpochReader(ledger, stack.kafka) as reader:
        assert second.next_epoch == epoch
        second.begin()
        second.send(b'"attempt-2"')
        second.commit()
        assert [r.value for r in reader.read(subject_name, epoch)] == [b'"attempt-2"']
    # The crashed incarnation is a zombie now: ZooKeeper refuses its commit.
    stale = first.lease
    start = stale.node.next_offsets[0]
    with pytest.raises(FencedError):
        ledger.commits.commit(stale, epoch, stale.node.incarnation, {0: Range(start=start, end=start + 1)})


def test_same_read_twice_is_identical(stack, ledger, subject_name):
    create_subject(ledger, stack.kafka, subject_name, 3)
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1, 2]) as p:
        for e in range(4):
            p.begin()
            for j in range(100):
                p.send(json.dumps({"e": e, "j": j}).encode(), key=str(j).encode())
            p.commit()
    with EpochReader(ledger, stack.kafka) as reader:
        first = [(r.epoch, r.partition, r.offset, r.value) for r in reader.read(subject_name, 0, 3)]
    with EpochReader(ledger, stack.kafka) as reader:
        second = [(r.epoch, r.partition, r.offset, r.value) for r in reader.read(subject_name, 0, 3)]
    assert first == second and len(first) == 400


def test_leaked_aborted_records_inside_a_committed_range_are_dropped_by_stamp(stack, ledger, subject_name):
    """The per-segment count shortcut must not keep an aborted attempt's records the broker shows.

    read_uncommitted shows the aborted records on any broker (Tansu also leaks them to
    read_committed consumers), so the reader sees more records in the range than the committed
    attempt wrote and falls back to checking every stamp.
    """
    create_subject(ledger, stack.kafka, subject_name, 2)
    uncommitted = {"isolation.level": "read_uncommitted"}
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1], always_stamp=True) as p:
        epoch = p.begin()
        for j in range(3):
            p.send(b'"lost-%d"' % j, partition=0)
        p.kp.flush(30)  # the aborted attempt's records reach the broker
        p.abort()
        assert p.begin() == epoch
        p.send(b'"kept-0"', partition=0)
        p.send(b'"kept-1"', partition=0)
        p.send(b'"other"', partition=1)
        commit = p.commit()
    assert commit.attempt == 2
    committed = ledger.epochs.committed(subject_name, epoch)
    assert (committed.slices[0].count, committed.slices[1].count) == (2, 1)
    with EpochReader(ledger, stack.kafka, consumer_extra=uncommitted) as reader:
        assert [r.value for r in reader.read(subject_name, epoch)] == [b'"kept-0"', b'"kept-1"', b'"other"']
    c = FetchingConsumer(stack.kafka, uncommitted)
    try:
        by_partition = segments_by_partition([committed])
        (p0_epoch, p0_kept, p0_dropped), = read_partition(c, subject_name, 0, by_partition[0])
        (_, p1_kept, p1_dropped), = read_partition(c, subject_name, 1, by_partition[1])
        # Older contributions carry no counts: the same records by stamp alone.
        no_counts = [dataclasses.replace(s, slice=dataclasses.replace(s.slice, count=None)) for s in by_partition[0]]
        (_, legacy_kept, legacy_dropped), = read_partition(c, subject_name, 0, no_counts)
    finally:
        c.close()
    assert p0_epoch == epoch and [m.value() for m in p0_kept] == [b'"kept-0"', b'"kept-1"']
    assert p0_dropped == 3  # the leaked records lay inside [start, end) and were dropped
    assert [m.value() for m in p1_kept] == [b'"other"'] and p1_dropped == 0
    assert [m.value() for m in legacy_kept] == [b'"kept-0"', b'"kept-1"'] and legacy_dropped == 3
    start, end = committed.offsets[0]
    assert end - start >= 5


def test_a_source_skips_stamps_only_where_a_range_holds_nothing_but_the_committed_attempt(
        stack, ledger, subject_name, monkeypatch):
    """The aligned source reads no header where the count fills the rest of a range (epoch 0, and epoch 1 after
    the marker at its start), and checks every stamp where an outsider's record (epoch 2) or a leaked aborted
    attempt (epoch 3, read_uncommitted: what Tansu shows read_committed consumers too) shares the range."""
    create_subject(ledger, stack.kafka, subject_name, 1)
    plain = Producer({"bootstrap.servers": stack.kafka})
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0], always_stamp=True) as p:
        for e in range(4):
            if e == 2:  # an outsider writes into the partition between two epochs
                plain.produce(ledger.subjects.subject(subject_name).topic, b"outsider", partition=0,
                              headers=[("aligner.stamp", Stamp("k", 2, 99).encode())])  # an attempt nobody committed
                plain.flush(30)
            p.begin()
            if e == 3:
                p.send(b"lost", partition=0)
                p.kp.flush(30)
                p.abort()
                p.begin()
            for j in range(3):
                p.send(b"%d-%d" % (e, j), partition=0)
            p.commit()
    decided: list[tuple[int, int, bool]] = []
    original = Slice.only_committed_from

    def spy(self: Slice, first: int) -> bool:
        answer = original(self, first)
        decided.append((self.start, first, answer))
        return answer

    monkeypatch.setattr(Slice, "only_committed_from", spy)
    source = SubjectSource(ledger, stack.kafka, {subject_name: [0]})
    source._consumer.close()  # read_uncommitted, so the aborted attempt shows on every broker
    source._fetch.fetching = FetchingConsumer(stack.kafka, {"isolation.level": "read_uncommitted"}, 100)
    source._consumer = source._fetch.fetching.consumer
    try:
        source.load()
        kept: list[SourceRecord] = []
        deadline = time.monotonic() + 60
        while source.consumed(subject_name) < 3:
            assert time.monotonic() < deadline, f"the source read {len(kept)} records of 4 epochs in 60 s"
            kept.extend(source.poll(0.1))
    finally:
        source.close()
    assert [(r.epoch, r.value) for r in kept] == [(e, b"%d-%d" % (e, j)) for e in range(4) for j in range(3)]
    starts = {e: ledger.epochs.committed(subject_name, e).slices[0].start for e in range(4)}
    by_start = {start: answer for start, _first, answer in decided}
    assert [by_start[starts[e]] for e in range(4)] == [True, True, False, False]


def test_a_source_fetches_past_its_bound_only_while_the_next_epoch_is_committed(stack, ledger, subject_name):
    """Catching up (the next epoch committed, its slices cached as the worker prefetches them), a partition at
    its bound stays assigned and fetches into the stash; caught up, it is unassigned: no fetch while idle.
    Either way the records handed over are exactly each loaded epoch's."""
    create_subject(ledger, stack.kafka, subject_name, 1)
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0]) as p:
        for e in range(4):
            p.begin()
            for j in range(50):
                p.send(b"%d-%d" % (e, j), partition=0)
            p.commit()
    source = SubjectSource(ledger, stack.kafka, {subject_name: [0]})
    part = source.parts[(subject_name, 0)]
    kept: list[SourceRecord] = []

    def read_to(last: int) -> None:
        source.set_limit(subject_name, last)
        source.load()
        deadline = time.monotonic() + 60
        while source.consumed(subject_name) < last:
            assert time.monotonic() < deadline, f"the source stopped at {part.pos} reading epoch {last}"
            kept.extend(source.poll(0.1))

    try:
        ledger.epochs.committed(subject_name, 1)  # in the cache, as the worker's prefetch leaves it
        read_to(0)
        assert part.paused and part.fetching and source._consumer.assignment(), "stopped fetching at the bound"
        deadline = time.monotonic() + 60
        while not part.stash:  # what it fetches on goes to the stash, not to the job
            assert time.monotonic() < deadline, "nothing fetched past the bound"
            assert source.poll(0.1) == []
        read_to(3)  # epoch 4 is not committed: caught up
        assert not part.fetching and source._consumer.assignment() == [], "a caught-up partition still fetches"
    finally:
        source.close()
    assert [(r.epoch, r.value) for r in kept] == [(e, b"%d-%d" % (e, j)) for e in range(4) for j in range(50)]


def test_what_a_source_keeps_per_epoch_is_let_go_once_read_in_either_mode(stack, ledger, subject_name):
    """A source running for days keeps what its loaded epochs need, not one entry per epoch it ever read: an
    exactly-once source drops each epoch's segment once read past it, an at-least-once one (which filters
    nothing) keeps none; both consume every epoch and hand over every record once."""
    create_subject(ledger, stack.kafka, subject_name, 2)
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1]) as p:
        for e in range(30):
            p.begin()
            for j in range(4):
                p.send(b"%d-%d" % (e, j), partition=j % 2)
            p.commit()
    for mode in ("exactly_once", "at_least_once"):
        source = SubjectSource(ledger, stack.kafka, {subject_name: [0, 1]}, mode=mode)
        kept: list[SourceRecord] = []
        try:
            deadline = time.monotonic() + 60
            while source.consumed(subject_name) < 29 or len(kept) < 120:
                assert time.monotonic() < deadline, f"{mode}: {len(kept)} records, to {source.consumed(subject_name)}"
                source.load()
                kept.extend(source.poll(0.1))
        finally:
            source.close()
        assert Counter(r.value for r in kept) == Counter(b"%d-%d" % (e, j) for e in range(30) for j in range(4)), mode
        held = {p: len(part.segments) for p, part in source.parts.items()}
        assert all(n <= (1 if mode == "exactly_once" else 0) for n in held.values()), (mode, held)
        assert not source.inputs[subject_name].loaded, mode


def test_counts_are_what_each_partition_received(stack, ledger, subject_name, monkeypatch):
    create_subject(ledger, stack.kafka, subject_name, 3)
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0, 1, 2]) as p:
        epoch = p.begin()
        sent: Counter[int] = Counter()
        for j in range(50):
            p.send(b"%d" % j, key=b"key-%d" % (j % 7))
        for _ in range(5):
            p.send(b"x", partition=1)
            sent[1] += 1
        p.kp.flush(30)  # a flush in the middle of an epoch must not lose or double count
        p.send(b"y", partition=1)
        sent[1] += 1
        commit = p.commit()
    import aligner.connectors.reader

    def no_stamp_checks(*_args: object) -> None:
        raise AssertionError("a segment holding only the committed attempt's records was stamp-checked")

    monkeypatch.setattr(aligner.connectors.reader, "_stamped", no_stamp_checks)
    with EpochReader(ledger, stack.kafka) as reader:
        per_partition = Counter(r.partition for r in reader.read(subject_name, epoch))
    slices = ledger.epochs.committed(subject_name, epoch).slices
    assert sum(per_partition.values()) == commit.records == 56
    assert {q: slices[q].count for q in range(3)} == {q: per_partition[q] for q in range(3)}
    assert per_partition[1] >= sent[1]


def test_a_held_back_record_keeps_the_time_it_was_sent(stack, ledger, subject_name):
    """The sink produces each partition's latest record late (at the next send or at commit);
    its Kafka timestamp is still the time of send()."""
    import time

    create_subject(ledger, stack.kafka, subject_name, 1)
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0]) as p, \
            EpochReader(ledger, stack.kafka) as reader:
        epoch = p.begin()
        before_send = time.time_ns() // 1_000_000
        p.send(b'"early"')
        after_send = time.time_ns() // 1_000_000
        time.sleep(0.6)  # the commit (which produces the held-back record) comes visibly later than send()
        before_commit = time.time_ns() // 1_000_000
        commit = p.commit()
        (record,) = list(reader.read(subject_name, epoch))
    assert record.value == b'"early"' and commit.ranges[0].end == record.offset + 1
    # Bracketed by clock readings, not compared to a tolerance: holds however slow the machine is.
    assert before_send <= record.timestamp <= after_send < before_commit, (before_send, record.timestamp,
                                                                           after_send, before_commit)
