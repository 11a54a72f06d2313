"""The ZooKeeper ledger against a real ZooKeeper: registration, claims, commits, bad data."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from aligner.epochs import Slice
from aligner.errors import (
    AlignerError,
    EpochNotCommittedError,
    FencedError,
    LedgerRollbackError,
    MalformedNodeError,
    PartitionClaimedError,
    SubjectConflictError,
    UnknownSubjectError,
)
from aligner.ledger import Claim, Ledger
from aligner.models import Range, SubjectNode
from aligner.ops import Create
from aligner.recipes.subjects import SubjectRecipes


def _subject(ledger: Ledger, name: str, partitions: int = 4) -> SubjectNode:
    return ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=partitions))


def _commit_empty(ledger: Ledger, lease, cache: dict | None = None):
    """Commit an empty epoch as a sink would: writers document cached between epochs."""
    cache = {} if cache is None else cache
    epoch = lease.next_epoch
    cache["writers"] = ledger.commits.ensure_epoch(lease.subject, epoch, cache.get("writers"))
    ranges = {p: Range(start=o, end=o) for p, o in lease.node.next_offsets.items()}
    return ledger.commits.commit(lease, epoch, lease.node.incarnation, ranges)


def test_register_is_idempotent_and_refuses_a_different_shape(ledger, subject_name):
    node = _subject(ledger, subject_name)
    assert _subject(ledger, subject_name) == node
    with pytest.raises(SubjectConflictError, match="refusing to change"):
        _subject(ledger, subject_name, partitions=8)
    assert ledger.subjects.subject(subject_name).partitions == 4


def test_unknown_subject_is_a_clear_error(ledger):
    with pytest.raises(UnknownSubjectError, match="unknown subject 'nope'"):
        ledger.subjects.subject("nope")
    with pytest.raises(UnknownSubjectError):
        ledger.claims.claim("nope", "k", "0", [0], lambda: {0: 0})
    with pytest.raises(UnknownSubjectError):
        ledger.subjects.epoch_numbers("nope")
    with pytest.raises(UnknownSubjectError):
        ledger.epochs.committed("nope", 0)


def test_partition_claimed_twice_is_refused_and_changes_nothing(ledger, subject_name):
    _subject(ledger, subject_name)
    ledger.claims.claim(subject_name, "sink-a", "0", [0, 1], lambda: {0: 0, 1: 0})
    before = ledger.subjects.writers(subject_name)
    with pytest.raises(PartitionClaimedError, match=r"partition 1 .* owned by producer sink-a:0"):
        ledger.claims.claim(subject_name, "sink-b", "0", [1, 2], lambda: {1: 0, 2: 0})
    assert ledger.subjects.writers(subject_name) == before
    with pytest.raises(Exception, match="cannot claim"):
        ledger.claims.claim(subject_name, "sink-b", "0", [7], lambda: {7: 0})
    with pytest.raises(SubjectConflictError, match="cannot reopen"):
        ledger.claims.claim(subject_name, "sink-a", "0", [0], lambda: {0: 0})


def test_epochs_commit_when_every_writer_contributed(ledger, subject_name):
    _subject(ledger, subject_name)
    a = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 0})
    b = ledger.claims.claim(subject_name, "b", "0", [1], lambda: {1: 0})
    # a registered first and owns epoch 0 alone; b joins from epoch 1.
    assert (a.next_epoch, b.next_epoch) == (0, 1)
    a = _commit_empty(ledger, a)
    assert ledger.epochs.is_committed(subject_name, 0)
    a = _commit_empty(ledger, a)
    with pytest.raises(EpochNotCommittedError, match="waiting for producers b:0"):
        ledger.epochs.committed(subject_name, 1)
    assert ledger.epochs.frontier(subject_name) == 0
    b = _commit_empty(ledger, b)
    assert ledger.epochs.frontier(subject_name) == 1
    with pytest.raises(EpochNotCommittedError, match="no such epoch"):
        ledger.epochs.committed(subject_name, 99)


def test_an_older_incarnation_is_fenced(ledger, subject_name):
    _subject(ledger, subject_name)
    old = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 0})
    new = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 0})
    assert new.node.incarnation == old.node.incarnation + 1
    with pytest.raises(FencedError):
        _commit_empty(ledger, old)
    _commit_empty(ledger, new)


def test_a_ledger_that_went_back_in_time_is_said_so_not_taken_for_fencing(ledger, subject_name):
    """An ensemble that lost acknowledged writes (a ZooKeeper bug class): the producer node names this
    incarnation but an epoch older than the one ZooKeeper acknowledged. Simulated by writing the node's
    earlier content back (what a lost transaction leaves); a commit then stops with that cause."""
    _subject(ledger, subject_name)
    first = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 0})
    before = _commit_empty(ledger, first)  # epoch 0
    after = _commit_empty(ledger, before)  # epoch 1: what ZooKeeper will forget
    path = ledger.layout.producer(subject_name, "a", "0")
    ledger.zk.set(path, before.node.dump())
    with pytest.raises(LedgerRollbackError, match=r"ZooKeeper lost acknowledged writes.*committed epoch 1"):
        _commit_empty(ledger, after)


def test_a_range_that_starts_before_the_last_epoch_ended_is_refused(ledger, subject_name):
    _subject(ledger, subject_name)
    lease = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 5})
    ledger.commits.ensure_epoch(subject_name, 0)
    with pytest.raises(Exception, match="must start at or after 5, not at 4"):
        ledger.commits.commit(lease, 0, 1, {0: Range(start=4, end=9)})


def test_an_unstamped_range_may_start_past_where_the_last_epoch_ended(ledger, subject_name):
    """An epoch written without stamps starts at its first record (epochs.dense_ranges), past the previous
    commit marker; the next epoch starts where it ended."""
    _subject(ledger, subject_name)
    lease = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 5})
    ledger.commits.ensure_epoch(subject_name, 0)
    lease = ledger.commits.commit(lease, 0, None, {0: Range(start=6, end=9)}, counts={0: 3})
    assert lease.node.next_offsets == {0: 9}
    assert ledger.epochs.committed(subject_name, 0).slices[0] == Slice(0, 6, 9, None, 3, "a")


def test_corrupt_epoch_json_is_reported_with_its_path_and_left_alone(ledger, subject_name):
    _subject(ledger, subject_name)
    lease = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 0})
    _commit_empty(ledger, lease)
    path = ledger.layout.epoch(subject_name, 0)
    ledger.zk.set(path, b'{"schema_version": 1, "epoch": "zero"')
    with pytest.raises(MalformedNodeError, match=path):
        ledger.epochs.committed(subject_name, 0)
    assert ledger.zk.get(path)[0] == b'{"schema_version": 1, "epoch": "zero"'


def test_corrupt_contribution_and_writers_are_reported(ledger, subject_name):
    _subject(ledger, subject_name)
    lease = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 0})
    _commit_empty(ledger, lease)
    contribution = ledger.layout.contribution(subject_name, 0, "a:0")
    ledger.zk.set(contribution, b'{"schema_version": 1, "sink": "a", "producer": "0", "attempt": 1, "ranges": '
                                b'{"0": {"start": 9, "end": 2}}}')
    with pytest.raises(MalformedNodeError, match=f"{contribution}: .*end 2 before start 9"):
        ledger.epochs.committed(subject_name, 0)
    ledger.zk.set(ledger.layout.writers(subject_name), b"[]")
    with pytest.raises(MalformedNodeError, match="writers"):
        ledger.claims.claim(subject_name, "b", "0", [1], lambda: {1: 0})


def test_a_flat_ledger_from_before_buckets_is_refused_with_its_path(ledger, subject_name):
    """Epochs written straight under ``epochs/`` (before buckets of 10,000) are named, not misread."""
    _subject(ledger, subject_name)
    flat = f"{ledger.layout.epochs(subject_name)}/0000000007"
    ledger.zk.create(flat, b"{}")
    with pytest.raises(MalformedNodeError, match=f"{flat}: not a bucket"):
        ledger.subjects.epoch_numbers(subject_name)
    with pytest.raises(MalformedNodeError, match="not a bucket"):
        ledger.epochs.frontier(subject_name)


@pytest.mark.parametrize("parallelism", [1, 4])
def test_two_round_trips_per_producer_per_epoch(stack, root, ledger, subject_name, parallelism):
    _subject(ledger, subject_name, partitions=parallelism)
    ledgers = [Ledger.connect(stack.zk, root) for _ in range(parallelism)]

    def from_zero(i: int) -> Callable[[], dict[int, int]]:
        """Start offsets: partition ``i`` from offset 0."""
        return lambda: {i: 0}

    try:
        leases = [led.claims.claim(subject_name, "k", str(i), [i], from_zero(i)) for i, led in enumerate(ledgers)]
        caches: list[dict] = [{} for _ in ledgers]
        leases = [_commit_empty(*args) for args in zip(ledgers, leases, caches, strict=True)]  # warm up
        before = [led.round_trips for led in ledgers]
        for _ in range(5):
            leases = [_commit_empty(*args) for args in zip(ledgers, leases, caches, strict=True)]
        per_epoch = [(led.round_trips - b) / 5 for led, b in zip(ledgers, before, strict=True)]
        assert per_epoch == [2.0] * parallelism
    finally:
        for led in ledgers:
            led.close()


def test_committed_many_equals_committed_per_epoch_and_fails_alike(stack, root, ledger, subject_name):
    _subject(ledger, subject_name)
    a = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 0})
    b = ledger.claims.claim(subject_name, "b", "0", [1], lambda: {1: 0})
    for _ in range(4):
        a = _commit_empty(ledger, a)
    for _ in range(2):
        b = _commit_empty(ledger, b)  # b joined at epoch 1: epochs 0..2 are committed, 3 waits for b
    with Ledger.connect(stack.zk, root) as cold:
        before = cold.round_trips
        many = cold.epochs.committed_many(subject_name, 0, 2)
        assert cold.round_trips - before == 2  # two pipelined waves, not three round trips per epoch
    assert many == [ledger.epochs.committed(subject_name, e) for e in range(3)]
    with Ledger.connect(stack.zk, root) as cold:
        with pytest.raises(EpochNotCommittedError, match="waiting for producers b:0"):
            cold.epochs.committed_many(subject_name, 1, 5)
        with pytest.raises(EpochNotCommittedError, match="no such epoch"):
            cold.epochs.committed_many(subject_name, 10, 12)
        with pytest.raises(UnknownSubjectError):
            cold.epochs.committed_many("nope", 0, 1)
    assert ledger.epochs.committed_many(subject_name, 2, 2) == [ledger.epochs.committed(subject_name, 2)]


def test_a_readers_memory_of_committed_epochs_is_bounded(stack, root, ledger, subject_name, monkeypatch):
    """A reader that runs for days keeps the committed epochs it still reads, not every one it ever read;
    an epoch it forgot is read again, exactly."""
    from aligner.recipes import store

    _subject(ledger, subject_name)
    a = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 0})
    for _ in range(30):
        a = _commit_empty(ledger, a)
    monkeypatch.setattr(store, "CACHED_EPOCHS", 8)
    with Ledger.connect(stack.zk, root) as reader:
        first = reader.epochs.committed_many(subject_name, 0, 29)
        assert len(reader._committed) == 8
        assert [reader.epochs.committed(subject_name, e) for e in range(30)] == first
        assert len(reader._committed) == 8 and all(reader.epochs.is_committed(subject_name, e) for e in range(30))


def test_committed_many_reports_a_corrupt_contribution_in_span_order(ledger, subject_name):
    _subject(ledger, subject_name)
    lease = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 0})
    for _ in range(3):
        lease = _commit_empty(ledger, lease)
    contribution = ledger.layout.contribution(subject_name, 1, "a:0")
    ledger.zk.set(contribution, b'{"schema_version": 1}')
    with pytest.raises(MalformedNodeError, match=contribution):
        ledger.epochs.committed_many(subject_name, 0, 2)


def test_contribution_counts_round_trip_and_older_payloads_parse(ledger, subject_name):
    from aligner.models import ContributionNode, parse

    _subject(ledger, subject_name, partitions=2)
    lease = ledger.claims.claim(subject_name, "a", "0", [0, 1], lambda: {0: 0, 1: 0})
    ledger.commits.ensure_epoch(subject_name, 0)
    ledger.commits.commit(lease, 0, 1, {0: Range(start=0, end=4), 1: Range(start=0, end=0)}, counts={0: 3, 1: 0})
    slices = ledger.epochs.committed(subject_name, 0).slices
    assert (slices[0].count, slices[1].count) == (3, 0)
    old = b'{"schema_version": 1, "sink": "a", "producer": "0", "attempt": 1, "ranges": {"0": {"start": 0, "end": 4}}}'
    node = parse(ContributionNode, "/c", old)
    assert node.counts == {} and b"counts" not in node.dump()  # payloads without counts stay as they were
    with pytest.raises(MalformedNodeError, match="cannot lie in"):
        parse(ContributionNode, "/c", old[:-1] + b', "counts": {"0": 5}}')


def test_ensure_epoch_async_retries_when_the_writers_changed(ledger, subject_name):
    _subject(ledger, subject_name)
    a = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 0})
    stale = ledger.subjects.writers(subject_name)
    a = _commit_empty(ledger, a)
    ledger.claims.claim(subject_name, "b", "0", [1], lambda: {1: 0})  # creates epoch 1 listing a and b
    pending = ledger.commits.ensure_epoch_async(subject_name, 2, stale)
    doc, _version = ledger.commits.epoch_ensured(pending)
    assert set(doc.writers) == {"a:0", "b:0"}
    assert ledger.epochs.epoch_node(subject_name, 2).writers == ("a:0", "b:0")


def test_commit_epoch_commits_several_subjects_at_once_or_not_at_all(ledger, subject_name):
    """A job's output and changelog commit one epoch in one multi-op; a fenced producer of either one
    fails the whole commit, and the caller's own ops with it."""
    from aligner.ledger import Contribution

    other = subject_name + "-cl"
    _subject(ledger, subject_name, partitions=1)
    _subject(ledger, other, partitions=1)
    out = _commit_empty(ledger, ledger.claims.claim(subject_name, "j", "0", [0],
                                                    lambda: {0: 0}))  # epoch 0: output only
    cl = ledger.claims.claim(other, "j", "0", [0], lambda: {0: 7}, not_before=out.next_epoch)
    assert (out.next_epoch, cl.next_epoch) == (1, 1) and ledger.subjects.epoch_numbers(other) == [1]
    for subject in (subject_name, other):
        ledger.commits.ensure_epoch(subject, 1)

    def parts(a, b, end_a=3, end_b=9):
        return [Contribution(a, a.node.incarnation, {0: Range(start=0, end=end_a)}, {0: 3}),
                Contribution(b, b.node.incarnation, {0: Range(start=7, end=end_b)}, {0: 2})]

    marker = f"{ledger.layout.root}/marker"
    fresh = ledger.claims.reincarnate(cl)  # a newer incarnation of the changelog producer: cl is a zombie now
    with pytest.raises(FencedError, match=f"j:0 of {other!r}"):
        ledger.commits.commit_epoch(1, parts(out, cl), [Create(marker)])
    assert not ledger.zk.exists(marker) and not ledger.epochs.is_committed(subject_name, 1)
    assert ledger.subjects.producers(subject_name, "j")[0].committed_epoch == 0  # the output's part rolled back too
    with pytest.raises(AlignerError, match="contributes twice"):
        ledger.commits.commit_epoch(1, [*parts(out, fresh), Contribution(out, 1, {0: Range(start=0, end=0)})])
    out, fresh = ledger.commits.commit_epoch(1, parts(out, fresh), [Create(marker)])
    assert ledger.zk.exists(marker) and ledger.epochs.is_committed(subject_name,
                                                                   1) and ledger.epochs.is_committed(other, 1)
    assert ledger.epochs.committed(other, 1).offsets == {0: (7, 9)} and (out.next_epoch, fresh.next_epoch) == (2, 2)
    # Producers of several subjects commit the same epoch number, or nothing.
    ledger.commits.ensure_epoch(subject_name, 2)
    with pytest.raises(AlignerError, match="must commit epoch 2 next"):
        ledger.commits.commit_epoch(3, [Contribution(out, 1, {0: Range(start=3, end=3)})])


def test_close_empty_brings_a_producer_that_fell_behind_to_an_epoch(ledger, subject_name):
    _subject(ledger, subject_name, partitions=1)
    lease = ledger.claims.claim(subject_name, "a", "0", [0], lambda: {0: 4})
    assert ledger.commits.close_empty(lease, 0) == lease
    lease = ledger.commits.close_empty(lease, 3)
    assert lease.next_epoch == 3 and ledger.epochs.frontier(subject_name) == 2
    assert all(c.offsets == {0: (4, 4)} for c in ledger.epochs.committed_many(subject_name, 0, 2))


def test_claim_together_is_all_or_nothing(ledger, subject_name):
    """A producer that commits two subjects together joins both at one epoch or neither: a failure
    between the two claims must not leave the second subject's other writers committing without it."""
    out, state = subject_name, subject_name + ".state"
    _subject(ledger, out)
    _subject(ledger, state)
    ledger.claims.claim_together("job", "0", [Claim(out, [0], lambda: {0: 0}), Claim(state, [0], lambda: {0: 0})])

    def stalled() -> dict[int, int]:
        raise TimeoutError("broker stalled")

    with pytest.raises(TimeoutError):
        ledger.claims.claim_together("job", "1", [Claim(out, [1], lambda: {1: 0}), Claim(state, [1], stalled)])
    assert "job:1" not in ledger.subjects.writers(out)[0].writers
    assert "job:1" not in ledger.subjects.writers(state)[0].writers
    other = ledger.claims.claim(state, "other", "0", [2], lambda: {2: 0})
    for _ in range(3):  # another writer of the state subject moves on meanwhile
        other = _commit_empty(ledger, other)
    ahead = ledger.subjects.epoch_numbers(state)[-1] + 1
    leases = ledger.claims.claim_together("job", "1", [Claim(out, [1], lambda: {1: 0}), Claim(state, [1],
                                                                                              lambda: {1: 0})])
    assert leases[0].next_epoch == leases[1].next_epoch == ahead
    again = ledger.claims.claim_together("job", "1", [Claim(out, [1], lambda: {1: 0}), Claim(state, [1],
                                                                                             lambda: {1: 0})])
    assert [lease.node.incarnation for lease in again] == [2, 2]
    assert [lease.next_epoch for lease in again] == [lease.next_epoch for lease in leases]


def test_claim_producers_starts_a_sink_on_one_epoch(ledger, subject_name):
    """A sink of several producers (a Spark sink's slots) joins at one first epoch, ``not_before``
    when that is later, so all of them can write that epoch; claimed one by one, each would start
    after the previous one's first epoch. A second claim changes nothing; partitions owned by
    another sink are refused and nothing is claimed."""
    _subject(ledger, subject_name)  # 4 partitions
    ledger.claims.claim(subject_name, "other", "0", [3], lambda: {3: 0})
    leases = ledger.claims.claim_producers(subject_name, "spark", {"0": [0], "1": [1]},
                                    lambda parts: dict.fromkeys(parts, 0), not_before=7)
    assert [lease.next_epoch for lease in leases] == [7, 7]
    assert set(ledger.epochs.epoch_node(subject_name, 7).writers) == {"other:0", "spark:0", "spark:1"}
    assert ledger.claims.claim_producers(subject_name, "spark", {"0": [0], "1": [1]}, lambda parts: {}) == []
    with pytest.raises(PartitionClaimedError):
        ledger.claims.claim_producers(subject_name, "third", {"0": [2], "1": [3]},
                                      lambda parts: dict.fromkeys(parts, 0))
    assert "third:0" not in ledger.subjects.writers(subject_name)[0].writers


def test_a_job_registered_between_two_reads_is_read_whole_not_called_a_stranger(ledger, subject_name):
    """The consumers and command of a job are read, and on a missing node the job is looked up to say which
    is missing; a job another process registers between the two reads (this ledger's ``job`` registers it
    first, the interleaving CI met) is read whole, not reported as not reading its input."""
    from aligner.jobs import JobLedger
    from aligner.models import JobNode

    _subject(ledger, subject_name, 2)
    _subject(ledger, f"{subject_name}-out", 2)
    node = JobNode(job=f"{subject_name}-j", inputs=(subject_name,), output=f"{subject_name}-out", parallelism=1)

    class RegisteredMeanwhile(JobLedger):
        def job(self, job: str) -> JobNode:
            ledger.jobs.register(node)
            return super().job(job)

    assert RegisteredMeanwhile(ledger).consumers(node.job, subject_name) == {}
    ledger.zk.delete(ledger.layout.job(node.job), recursive=True)
    assert RegisteredMeanwhile(ledger).command(node.job, subject_name)[0] is not None
    jobs = ledger.jobs
    with pytest.raises(AlignerError, match="does not read subject"):
        jobs.consumers(node.job, f"{subject_name}-out")
    with pytest.raises(UnknownSubjectError):
        jobs.command(node.job, f"{subject_name}-out")


def test_a_subject_registered_between_two_reads_has_its_writers_node(ledger, subject_name):
    """As above for a subject: its writers node is read, then the subject looked up on a miss; a subject
    registered in between is read whole, not reported as missing its writers node."""
    node = SubjectNode(name=subject_name, topic=subject_name, partitions=2)

    class RegisteredMeanwhile(SubjectRecipes):
        def subject(self, name: str) -> SubjectNode:
            ledger.subjects.register_subject(node)
            return super().subject(name)

    writers, _ = RegisteredMeanwhile(Ledger(ledger.zk, ledger.layout)).writers(subject_name)
    assert writers.writers == {}


def test_lineage_of_an_epoch_a_worker_wrote_unaligned_names_no_input_epochs(ledger, subject_name):
    """A job epoch record is followed by the workers that are aligned; a worker that is not (a split alignment
    being undone, an abort) reads on its own within the same epoch. Its part of the output is not the recorded
    input epochs', so the epoch's lineage must not claim them (the chaos checker met such epochs)."""
    from aligner.lineage import job_epoch_lineage
    from aligner.models import JobNode, Span, WorkerEpochNode

    src, out = subject_name, f"{subject_name}-out"
    _subject(ledger, src, 2)
    _subject(ledger, out, 2)
    job = f"{subject_name}-j"
    jobs = ledger.jobs
    jobs.register(JobNode(job=job, inputs=(src,), output=out, parallelism=2))
    source = ledger.claims.claim(src, "gen", "0", [0, 1], lambda: {0: 0, 1: 0})
    for _ in range(3):
        source = _commit_empty(ledger, source)
    leases = [ledger.claims.claim(out, job, str(w), [w], lambda w=w: {w: 0}) for w in range(2)]
    cache: dict = {}
    for lease in leases:
        _commit_empty(ledger, lease, cache)
    epoch = leases[0].next_epoch
    jobs.fix_job_epoch(job, epoch, {src: Span(first=1, last=1)}, {src: 2})

    def record(worker: int, covered: dict | None) -> None:
        jobs.ensure_worker_path(job, worker)
        node = WorkerEpochNode(epoch=epoch, mode="aligned" if covered else "exactly_once",
                               offsets={src: {worker: 9}}, load_from={src: 2}, covered=covered)
        ledger.multi(jobs.worker_epoch_op(job, worker, node))

    record(0, {src: Span(first=1, last=1)})
    assert job_epoch_lineage(ledger, job, epoch)["aligned"] is True  # worker 1's record is not there (gc)
    record(1, None)
    tree = job_epoch_lineage(ledger, job, epoch)
    assert tree["aligned"] is False and tree["unaligned_workers"] == [1] and tree["inputs"] == []
    assert tree["input_offsets"] == {0: {src: {0: 9}}, 1: {src: {1: 9}}}
