"""Partition hand-over at a hot-swap: the pure rule (property tests over chains of versions of any
parallelism) and the ledger's take-over against a real ZooKeeper."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.errors import AlignerError, FencedError, PartitionClaimedError
from aligner.handover import ownership, take_over
from aligner.keys import partition_of, routes, sources, worker_of
from aligner.ledger import Ledger
from aligner.models import Range, SubjectNode, WriterEntry, WritersNode


def share(index: int, parallelism: int, partitions: int) -> tuple[int, ...]:
    return tuple(range(index, partitions, parallelism))


@st.composite
def chains(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[list[int]]]:
    """P partitions; per version its parallelism and swap epoch S (the last version is never swapped out),
    and the order in which its producers take over."""
    p = draw(st.integers(1, 5))
    n = draw(st.integers(2, 6))
    pars = [draw(st.integers(1, p)) for _ in range(n)]
    gaps = [draw(st.integers(1, 4)) for _ in range(n - 1)]
    swaps = [sum(gaps[: i + 1]) + 2 for i in range(n - 1)]
    orders = [draw(st.permutations(list(range(par)))) for par in pars]
    return p, pars, swaps, orders


@settings(max_examples=200, deadline=None)
@given(chains())
def test_every_partition_has_one_writer_per_epoch_across_any_chain_of_versions(chain) -> None:
    p, pars, swaps, orders = chain
    doc = WritersNode(writers={f"v0:{i}": WriterEntry(partitions=share(i, pars[0], p), first_epoch=0)
                               for i in range(pars[0])})
    for v in range(1, len(pars)):
        s = swaps[v - 1]
        joined = max(0, s - 1)  # it follows from before S, a writer of no partition
        doc = WritersNode(writers={**doc.writers, **{f"v{v}:{i}": WriterEntry(partitions=(), first_epoch=joined)
                                                     for i in range(pars[v])}})
        for i in orders[v]:
            plan = take_over(doc, "t", f"v{v}:{i}", share(i, pars[v], p), f"v{v - 1}", s)
            assert plan is not None
            for part, giver in plan.givers.items():  # it starts where the old version's range of S ended
                assert giver is not None and giver.startswith(f"v{v - 1}:") and doc.writers[giver].holds(part, s)
            doc = plan.doc
            assert take_over(doc, "t", f"v{v}:{i}", share(i, pars[v], p), f"v{v - 1}", s) is None  # a retry
        assert all(e.finished_after == s for w, e in doc.writers.items() if w.startswith(f"v{v - 1}:"))
    bounds = [*swaps, None]
    for epoch in range(swaps[-1] + 3):
        version = next(v for v, b in enumerate(bounds) if b is None or epoch <= b)
        for part in range(p):
            holders = [w for w, e in doc.writers.items() if e.holds(part, epoch)]
            assert len(holders) == 1 and holders[0].startswith(f"v{version}:")
            assert doc.owner_of(part, epoch) == holders[0]
        parts = [q for w in doc.expected(epoch) for q in doc.writers[w].partitions if doc.writers[w].holds(q, epoch)]
        assert sorted(parts) == list(range(p))  # an epoch's contributions never name a partition twice
    assert len(ownership(doc)) == sum(p for _ in pars)


def test_a_take_over_refuses_what_it_must_not_do() -> None:
    doc = WritersNode(writers={"old:0": WriterEntry(partitions=(0, 1), first_epoch=0),
                               "other:0": WriterEntry(partitions=(2,), first_epoch=0),
                               "new:0": WriterEntry(partitions=(), first_epoch=3)})
    with pytest.raises(AlignerError, match="not a writer"):
        take_over(doc, "t", "new:9", (0,), "old", 5)
    with pytest.raises(PartitionClaimedError, match=r"partition 2 .* owned by producer other:0"):
        take_over(doc, "t", "new:0", (0, 2), "old", 5)
    with pytest.raises(AlignerError, match="joined the target at epoch 3"):
        take_over(doc, "t", "new:0", (0,), "old", 1)
    past = WritersNode(writers={**doc.writers, "old:0": WriterEntry(partitions=(0, 1), first_epoch=0,
                                                                   finished_after=9)})
    with pytest.raises(AlignerError, match="writes epochs after the swap epoch 5"):
        take_over(past, "t", "new:0", (0,), "old", 5)
    plan = take_over(doc, "t", "new:0", (0, 1), "old", 5)
    assert plan is not None and plan.finished == ("old:0",) and plan.givers == {0: "old:0", 1: "old:0"}
    with pytest.raises(AlignerError, match="cannot take"):
        take_over(plan.doc, "t", "new:0", (1,), "old", 5)
    assert ownership(plan.doc) == [(0, "old:0", 0, 5), (0, "new:0", 6, None), (1, "old:0", 0, 5),
                                   (1, "new:0", 6, None), (2, "other:0", 0, None)]


# ---- the ledger, against a real ZooKeeper ----------------------------------------------------------------


def _commit(ledger: Ledger, lease, records: dict[int, int]):
    """Commit the producer's next epoch with ``records`` more offsets in some of its partitions."""
    epoch = lease.next_epoch
    ledger.commits.ensure_epoch(lease.subject, epoch)
    ranges = {p: Range(start=o, end=o + records.get(p, 0)) for p, o in lease.node.next_offsets.items()}
    return ledger.commits.commit(lease, epoch, lease.node.incarnation, ranges)


def test_a_new_version_takes_the_old_versions_partitions_over_after_the_swap_epoch(ledger, subject_name) -> None:
    ledger.subjects.register_subject(SubjectNode(name=subject_name, topic=subject_name, partitions=2))
    old = dict(enumerate(ledger.claims.claim_producers(subject_name, "old", {"0": [0], "1": [1]},
                                                lambda parts: {0: 0, 1: 100})))
    for _ in range(2):  # epochs 0, 1
        old = {i: _commit(ledger, lease, {i: 3}) for i, lease in old.items()}
    new = ledger.claims.claim(subject_name, "new", "0", [], dict)  # follows the old version, voided
    assert new.next_epoch == 2 and new.node.partitions == ()
    for _ in range(2):  # epochs 2, 3 = S: the new version commits them empty
        old = {i: _commit(ledger, lease, {i: 5}) for i, lease in old.items()}
        new = _commit(ledger, new, {})
    assert ledger.epochs.committed(subject_name, 3).offsets == {0: (11, 16), 1: (111, 116)}
    with pytest.raises(AlignerError, match="has not committed epoch 4"):
        ledger.claims.take_over(new, [0, 1], "old", 4, dict)
    taken = ledger.claims.take_over(new, [0, 1], "old", 3, dict)
    assert taken.node.partitions == (0, 1) and taken.node.next_offsets == {0: 16, 1: 116}
    assert ledger.claims.take_over(taken, [0, 1], "old", 3, dict) == taken  # retried after a lost reply: no change
    with pytest.raises(FencedError):  # the old version's producers are fenced: a zombie commits nothing more
        _commit(ledger, old[0], {0: 1})
    taken = _commit(ledger, taken, {0: 2, 1: 4})
    restarted = ledger.claims.claim(subject_name, "old", "0", [0], dict)  # an old worker restarted after the swap
    assert restarted.node.incarnation > old[0].node.incarnation  # reopens (finished: it writes nothing more)
    assert ledger.epochs.committed(subject_name, 4).offsets == {0: (16, 18), 1: (116, 120)}
    doc, _ = ledger.subjects.writers(subject_name)
    assert doc.expected(4) == ("new:0",) and doc.owner_of(0, 3) == "old:0" and doc.owner_of(0, 4) == "new:0"
    assert doc.owner_of(1) == "new:0"
    third = ledger.claims.claim(subject_name, "v3", "0", [], dict)  # a third version follows the second: the chain
    third = _commit(ledger, third, {})  # goes on with the target's two partitions
    taken = _commit(ledger, taken, {})
    third = ledger.claims.take_over(third, [1, 0], "new", 5, dict)
    writing = {w for w, e in ledger.subjects.writers(subject_name)[0].writers.items() if e.finished_after is None}
    assert writing == {"v3:0"} and third.node.next_offsets == {0: 18, 1: 120}
    with pytest.raises(FencedError):  # the second version is fenced too: it writes no epoch after 5
        _commit(ledger, taken, {0: 1})
    third = _commit(ledger, third, {1: 1})
    assert ledger.epochs.committed(subject_name, 6).offsets == {0: (18, 18), 1: (120, 121)}


@given(st.integers(1, 12), st.integers(1, 12), st.binary(min_size=1, max_size=16))
def test_a_key_keeps_its_worker_and_output_partition_across_parallelisms(p_in: int, p_out: int, key: bytes) -> None:
    """aligner.keys: for every parallelism that divides both partition counts, the worker that reads a key
    owns the key's output partition and routes it there, so a swap that rescales moves no key."""
    for n in range(1, min(p_in, p_out) + 1):
        if p_in % n or p_out % n:
            continue
        w = worker_of(key, p_in, n)
        owned = list(share(w, n, p_out))
        table = routes(owned, p_out)
        assert all(r in owned for r in table)
        assert table[zlib.crc32(key) % len(table)] == partition_of(key, p_out)


@given(st.integers(1, 12), st.integers(1, 6), st.integers(1, 6), st.binary(min_size=1, max_size=16))
def test_a_rescaling_hand_over_reads_every_old_partition_that_holds_its_keys(p_in: int, old: int, new: int,
                                                                              key: bytes) -> None:
    w = worker_of(key, p_in, new)
    assert worker_of(key, p_in, old) in sources(w, new, old)
    assert sources(0, 1, old) == list(range(old)) and len(sources(w, 2 * old, old)) == 1
