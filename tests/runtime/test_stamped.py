"""One sink writing two subjects in one Kafka transaction and one ZooKeeper multi-op per epoch.

A job's output and its changelog subject (state as a subject) are written this way: both
subjects' records of an epoch are committed together or not at all, under the same epoch number.
Real ZooKeeper and broker; records are read back exactly, by epoch, with the aligned reader. The last
two tests need neither: they check how the stamped producer is composed and where its open epoch lives.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Producer

from aligner.connectors.kafka import QUIET
from aligner.connectors.lane import Lane
from aligner.connectors.reader import EpochReader
from aligner.connectors.sink import SinkProducer
from aligner.connectors.stamped import StampedProducer
from aligner.connectors.subjects import create_subject
from aligner.errors import AlignerError, EpochFailedError, SubjectConflictError
from aligner.ops import Create, Op
from aligner.stamps import Stamp
from tests.helpers import raw_records, record_stamp

RECORDS = 30
"""Output records per epoch; the second subject gets one record per third of them."""


def _write_epoch(p: SinkProducer, second: str | None, tag: str) -> tuple[int, list[dict], list[dict]]:
    """One epoch: RECORDS output records (keyed, so both partitions get some) and, when ``second`` is
    given, a third as many records of that subject; returns the epoch and what was written."""
    epoch = p.begin()
    out, side = [], []
    for j in range(RECORDS):
        v = {"epoch": epoch, "j": j, "tag": tag}
        p.send(json.dumps(v).encode(), key=b"k%d" % j)
        out.append(v)
        if second is not None and j % 3 == 0:
            s: dict[str, Any] = {"epoch": epoch, "key": f"k{j}", "tag": tag}
            p.send_to(second, json.dumps(s).encode(), key=s["key"].encode())
            side.append(s)
    return epoch, out, side


def _by_epoch(reader: EpochReader, subject: str, first: int, last: int) -> dict[int, Counter]:
    got: dict[int, Counter] = {e: Counter() for e in range(first, last + 1)}
    for r in reader.read(subject, first, last):
        got[r.epoch][r.value] += 1
    return got


def _expected(written: dict[int, list[dict]]) -> dict[int, Counter]:
    return {e: Counter(json.dumps(v).encode() for v in vs) for e, vs in written.items()}


@pytest.fixture
def two_subjects(stack, ledger, subject_name) -> tuple[str, str]:
    output, second = subject_name, subject_name + "-cl"
    create_subject(ledger, stack.kafka, output, 2)
    create_subject(ledger, stack.kafka, second, 2)
    return output, second


def test_two_subjects_commit_the_same_epochs_in_one_multi_op(stack, ledger, two_subjects, monkeypatch) -> None:
    output, second = two_subjects
    outs: dict[int, list[dict]] = {}
    sides: dict[int, list[dict]] = {}
    # The output already has epochs 0..1, written without the second subject.
    with SinkProducer(ledger, stack.kafka, output, "job", 0, [0, 1]) as p:
        for _ in range(2):
            epoch, outs[epoch], _ = _write_epoch(p, None, "alone")
            p.commit()

    with SinkProducer(ledger, stack.kafka, output, "job", 0, [0, 1], also={second: [0, 1]}) as p:
        assert p.next_epoch == 2 and p.leases[second].next_epoch == 2  # the second subject starts at 2, not 0
        multis: list[list[Op]] = []
        transaction = ledger.zk.transaction

        def counted(ops: Iterable[Op] = ()) -> Any:  # records the ZooKeeper multi-ops a commit sends (and sends them)
            multis.append(list(ops))
            return transaction(multis[-1])

        for _ in range(3):
            epoch, outs[epoch], sides[epoch] = _write_epoch(p, second, "together")
            with monkeypatch.context() as patch:
                patch.setattr(ledger.zk, "transaction", counted)
                commit = p.commit()
            assert commit.epoch == epoch and set(commit.also) == {second}
            created = {op.path for op in multis[-1] if isinstance(op, Create)}
            assert {ledger.layout.contribution(output, epoch, "job:0"),
                    ledger.layout.contribution(second, epoch, "job:0")} <= created
        assert len(multis) == 3, "one multi-op per epoch for both subjects"
        assert ledger.subjects.producers(second, "job")[0].committed_epoch == 4

    # A run without the second subject, then with it again: the epoch it missed is closed empty.
    with SinkProducer(ledger, stack.kafka, output, "job", 0, [0, 1]) as p:
        epoch, outs[epoch], _ = _write_epoch(p, None, "alone-again")
        p.commit()
    with SinkProducer(ledger, stack.kafka, output, "job", 0, [0, 1], also={second: [0, 1]}) as p:
        assert p.leases[second].next_epoch == p.next_epoch == 6
        epoch, outs[epoch], sides[epoch] = _write_epoch(p, second, "last")
        p.commit()
        p.finish()

    assert ledger.subjects.epoch_numbers(second) == [2, 3, 4, 5, 6]
    with EpochReader(ledger, stack.kafka) as reader:
        assert _by_epoch(reader, output, 0, 6) == _expected(outs)
        assert _by_epoch(reader, second, 2, 6) == _expected({**sides, 5: []})
    assert ledger.epochs.finished(second) == 6 and ledger.epochs.finished(output) == 6


@pytest.mark.parametrize("always_stamp", [False, True], ids=["dense", "stamped"])
def test_an_aborted_epoch_shows_in_neither_subject_and_is_written_again(stack, ledger, two_subjects,
                                                                         always_stamp) -> None:
    """Tansu shows an aborted attempt's records to read_committed readers: stamped, readers drop them by stamp;
    unstamped, the committed ranges start past them (they hold only the kept attempt's records)."""
    output, second = two_subjects
    with SinkProducer(ledger, stack.kafka, output, "job", 0, [0, 1], also={second: [0, 1]},
                      always_stamp=always_stamp) as p:
        first = p.leases
        epoch, _, _ = _write_epoch(p, second, "aborted")
        p.kp.flush(30)  # the aborted records reach the broker (Tansu shows them to read_committed readers)
        p.abort()
        retry = p.leases
        assert {s: lease.node.incarnation for s, lease in retry.items()} == \
            {s: lease.node.incarnation + 1 for s, lease in first.items()}
        assert p.begin() == epoch
        p.abort()  # an epoch aborted before anything was sent: a third attempt
        again, out, side = _write_epoch(p, second, "kept")
        assert again == epoch
        assert p.commit().attempt == (p.attempt if always_stamp else None)
        attempts = {s: lease.node.incarnation for s, lease in p.leases.items()}
    assert attempts == {s: lease.node.incarnation + 2 for s, lease in first.items()}
    with EpochReader(ledger, stack.kafka) as reader:
        assert _by_epoch(reader, output, epoch, epoch) == _expected({epoch: out})
        assert _by_epoch(reader, second, epoch, epoch) == _expected({epoch: side})
    for subject in (output, second):  # the broker holds the aborted attempt; readers dropped it
        raw = raw_records(stack.kafka, subject, 2)
        tags = Counter(json.loads(m.value())["tag"] for m in raw)
        written = RECORDS if subject == output else RECORDS // 3
        assert tags == {"aborted": written, "kept": written}, (subject, tags)
        if always_stamp:
            stamps = Counter(record_stamp(m).attempt for m in raw)
            assert stamps == {first[subject].node.incarnation: written, attempts[subject]: written}, (subject, stamps)
        else:
            assert all(m.headers() is None for m in raw), "unstamped records carry no header"


def test_a_crash_between_kafka_and_zookeeper_commits_rewrites_both_subjects(stack, ledger, two_subjects) -> None:
    output, second = two_subjects

    class Crash(Exception):
        pass

    def crash(point: str) -> None:
        if point == "after_kafka_commit":
            raise Crash

    zombie = SinkProducer(ledger, stack.kafka, output, "job", 0, [0, 1], also={second: [0, 1]}, fault=crash).open()
    try:
        epoch, _, _ = _write_epoch(zombie, second, "crashed")
        with pytest.raises(Crash):
            zombie.commit()  # committed in Kafka, not in ZooKeeper
    finally:
        zombie.close()
    with SinkProducer(ledger, stack.kafka, output, "job", 0, [0, 1], also={second: [0, 1]}) as p, \
            EpochReader(ledger, stack.kafka) as reader:
        assert p.next_epoch == epoch
        _, out, side = _write_epoch(p, second, "rewritten")
        p.commit()
        assert _by_epoch(reader, output, epoch, epoch) == _expected({epoch: out})
        assert _by_epoch(reader, second, epoch, epoch) == _expected({epoch: side})


def test_misuse_is_refused(stack, ledger, subject_name) -> None:
    output, second = subject_name, subject_name + "-cl"
    create_subject(ledger, stack.kafka, output, 2)
    create_subject(ledger, stack.kafka, second, 3)
    with pytest.raises(AlignerError, match="cannot be among the also subjects"):
        SinkProducer(ledger, stack.kafka, output, "job", 0, [0], also={output: [1]})
    with SinkProducer(ledger, stack.kafka, output, "job", 0, [0], also={second: [0]}) as p:
        with pytest.raises(AlignerError, match="outside an epoch"):
            p.send_to(second, b"{}")
        p.begin()
        with pytest.raises(AlignerError, match="does not own partition 1"):
            p.send_to(second, b"{}", partition=1)
        with pytest.raises(AlignerError, match="does not write subject"):
            p.send_to("elsewhere", b"{}")
        p.commit()
    # A producer of the output alone gains a second subject that another sink wrote ahead of its
    # output: they cannot commit together.
    SinkProducer(ledger, stack.kafka, output, "job", 1, [1]).open().close()
    with SinkProducer(ledger, stack.kafka, second, "other", 0, [1]) as other:
        for _ in range(3):
            other.begin()
            other.commit()
    with pytest.raises(SubjectConflictError, match="another sink writes"):
        SinkProducer(ledger, stack.kafka, output, "job", 1, [1], also={second: [2]}).open()


@pytest.mark.parametrize("queue", [None, 1000], ids=["queue-default", "queue-1000"])
def test_send_many_keeps_each_partitions_order_across_calls_and_single_sends(stack, ledger, subject_name,
                                                                             queue) -> None:
    """``send_many`` picks a batch's partitions first and holds back only its last record per partition: keyed,
    unkeyed and mixed batches, across calls of every size (one record, more than the queue's 2,000-record poll
    stride) and single ``send``s between them, come back once each, in send order per partition, keyed ones
    on their key's partition, an unkeyed batch on every partition, and the epochs' ranges hold exactly what
    was sent; also when the producer's queue is smaller than a batch (it waits for room, record by record)."""
    from aligner.keys import routes

    create_subject(ledger, stack.kafka, subject_name, 3)
    sent: list[tuple[bytes | None, bytes]] = []
    unkeyed: list[bytes] = []
    epochs = []
    config = None if queue is None else {"queue.buffering.max.messages": queue}
    with SinkProducer(ledger, stack.kafka, subject_name, "job", 0, [0, 1, 2], kafka_config=config) as p:
        for _ in range(2):
            epoch = p.begin()
            epochs.append(epoch)
            for size, keys in ((1, "mixed"), (5, "mixed"), (2500, "mixed"), (0, "mixed"), (7, "mixed"),
                               (2500, "none"), (2, "none")):
                batch = [(None if keys == "none" or j % 3 == 0 else b"k%d" % (j % 11),
                          b"%d-%d-%s-%d" % (epoch, size, keys.encode(), j)) for j in range(size)]
                assert p.send_many(batch) == size
                sent += batch
                unkeyed += [v for _, v in batch] if size == 2500 and keys == "none" else []
                single = b"%d-single-%d-%s" % (epoch, size, keys.encode())
                p.send(single, key=b"s")
                sent.append((b"s", single))
            assert p.send_many(iter([(None, b"%d-gen" % epoch)])) == 1  # any iterable, not only a list
            sent.append((None, b"%d-gen" % epoch))
            assert p.commit().attempt is None  # every partition's first and last record reported: unstamped
    table = routes([0, 1, 2], 3)
    with EpochReader(ledger, stack.kafka) as reader:
        got = list(reader.read(subject_name, epochs[0], epochs[-1]))
    assert Counter(r.value for r in got) == Counter(v for _, v in sent)  # each once, nothing else
    by_value = {r.value: r for r in got}
    for key, value in sent:
        if key is not None:
            assert by_value[value].partition == table[zlib.crc32(key) % len(table)], value
    for part in (0, 1, 2):  # per partition, the offsets follow the order the records were sent in
        offsets = [by_value[v].offset for _, v in sent if by_value[v].partition == part]
        assert offsets == sorted(offsets) and len(offsets) > 0
    spread = Counter(by_value[v].partition for v in unkeyed)  # two batches of 2,500: 832 or 834 per partition each
    assert spread.keys() == {0, 1, 2} and all(1664 <= n <= 1668 for n in spread.values()), spread


def test_an_unstamped_attempt_with_another_writers_record_among_its_own_is_written_again_stamped(
        stack, ledger, subject_name) -> None:
    """A record of another writer (here a plain producer; in production a zombie the broker did not fence, or a
    user's producer on the subject's topic) lands among an unstamped attempt's records: the attempt cannot name
    a range holding only its own, so it is aborted, and the sink writes the epoch again with stamps (and keeps
    stamping for a while). Readers get the epoch's records once, and not the outsider."""
    create_subject(ledger, stack.kafka, subject_name, 1)
    topic = ledger.subjects.subject(subject_name).topic
    outsider = Producer({"bootstrap.servers": stack.kafka, **QUIET})
    with SinkProducer(ledger, stack.kafka, subject_name, "job", 0, [0]) as p:
        epoch = p.begin()
        for j in range(10):
            p.send(b"first-%d" % j, partition=0)
        p.kp.flush(30)  # on the broker, first and last reported
        outsider.produce(topic, b"outsider", partition=0)
        assert outsider.flush(30) == 0
        for j in range(10, 20):
            p.send(b"first-%d" % j, partition=0)
        with pytest.raises(EpochFailedError, match="another writer's records lie among this attempt's"):
            p.commit()
        assert p.stamping.stamped() and p.begin() == epoch
        kept = [b"kept-%d" % j for j in range(20)]
        for v in kept:
            p.send(v, partition=0)
        assert p.commit().attempt == p.attempt
    with EpochReader(ledger, stack.kafka) as reader:
        assert Counter(r.value for r in reader.read(subject_name, epoch)) == Counter(kept)
    raw = Counter(m.value() for m in raw_records(stack.kafka, subject_name, 1))
    assert raw[b"outsider"] == 1 and sum(v.startswith(b"first-") for v in raw.elements()) == 20


class _Kafka:
    """Stands in for the Kafka producer of a StampedProducer: the open-epoch bookkeeping needs no broker."""

    stale = False

    def __init__(self) -> None:
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


def test_the_stamped_producer_is_composed_of_a_kafka_producer_and_lanes() -> None:
    """Neither a Kafka producer nor a lane itself: ``send`` is its main lane's own bound method (no hop on the
    hot path), and a sink producer's is the same method."""
    p = StampedProducer("127.0.0.1:1", "txn", "out", [0, 1], also={"log": [0]})
    assert not isinstance(p, (Producer, Lane))
    assert p.main is p.lane("out") and p.send == p.main.send and p.send_many == p.main.send_many  # bound to the lane
    sink = SinkProducer(SimpleNamespace(stopping=lambda: False), "127.0.0.1:1", "out", "job", 0, [0])  # type: ignore[arg-type]
    assert sink.send == sink.producer.main.send and not isinstance(sink, (Producer, Lane, StampedProducer))


def test_one_field_holds_the_open_epoch_until_its_owner_ends_it() -> None:
    """Kafka committed but the owner's commit point (ZooKeeper) not yet: the epoch stays open, takes no record,
    and an abort ends it without aborting the committed Kafka transaction."""
    p = StampedProducer("127.0.0.1:1", "txn", "out", [0])
    kafka = _Kafka()
    p._kp = kafka  # type: ignore[assignment]
    p.begin_epoch(4, {"out": Stamp("job", 4, 1)})
    assert (p.epoch, p.in_transaction) == (4, True)
    p.commit_transaction(end=False)
    assert (p.epoch, p.in_transaction) == (4, False)
    with pytest.raises(AlignerError, match="still open"):
        p.begin_epoch(5, {"out": Stamp("job", 5, 1)})
    with pytest.raises(AlignerError):
        p.send(b"late")
    with pytest.raises(AlignerError, match="no open epoch"):
        p.flush_epoch({"out": {0: 0}})
    p.abort_transaction()
    assert p.epoch is None and kafka.calls == ["begin", "commit"]


def test_a_late_delivery_report_of_an_aborted_epoch_changes_nothing_of_the_next() -> None:
    """An aborted epoch's first record was produced with a delivery report; the abort purges it, and its failed
    report is served at a later poll, in the next epoch: that epoch's first, last and error stay its own."""
    owner = SimpleNamespace(name="p", error=None, kp=None)
    lane = Lane(owner, "out", [0])
    lane.begin(None)
    aborted = lane._delivered
    lane.begin(None)
    aborted(SimpleNamespace(), None)  # the purged record's failure
    aborted(None, SimpleNamespace(partition=lambda: 0, offset=lambda: 3))
    assert owner.error is None and lane.first == {} and lane.last == {}
    lane._delivered(None, SimpleNamespace(partition=lambda: 0, offset=lambda: 7))
    assert lane.first == lane.last == {0: 7}
    lane._delivered(SimpleNamespace(), None)  # this epoch's own failure
    assert owner.error is not None
