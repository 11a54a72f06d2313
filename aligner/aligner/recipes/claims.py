"""Writers and claims: a producer claims private partitions (in one or several subjects, alone or with
its sink's other producers) and each incarnation fences the one before."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kazoo.exceptions import BadVersionError

from aligner import handover
from aligner.errors import AlignerError, FencedError, PartitionClaimedError, SubjectConflictError
from aligner.layout import split_writer, writer_id
from aligner.models import EpochNode, ProducerNode, SinkNode, WriterEntry, WritersNode
from aligner.ops import Create, Op, SetData
from aligner.recipes.store import Store
from aligner.recipes.subjects import SubjectRecipes


@dataclass(frozen=True)
class Lease:
    """A producer's right to write: its node as last written and the version that fences others."""

    subject: str
    node: ProducerNode
    version: int
    first_epoch: int

    @property
    def writer(self) -> str:
        return writer_id(self.node.sink, self.node.producer)

    @property
    def next_epoch(self) -> int:
        return self.first_epoch if self.node.committed_epoch is None else self.node.committed_epoch + 1


@dataclass(frozen=True)
class Claim:
    """A producer's private partitions in one subject, and where it starts writing there if new."""

    subject: str
    partitions: Sequence[int]
    start_offsets: Callable[[], Mapping[int, int]]


def _new_producer(sink: str, producer: str, parts: tuple[int, ...], offsets: Mapping[int, int]) -> ProducerNode:
    """A brand-new producer's node: first incarnation, a fresh owner token, its partitions' start offsets."""
    return ProducerNode(sink=sink, producer=producer, partitions=parts, incarnation=1, owner=uuid.uuid4().hex,
                        next_offsets={p: offsets[p] for p in parts})


class ClaimRecipes:
    """Claims of partitions and producer incarnations."""

    def __init__(self, store: Store, subjects: SubjectRecipes) -> None:
        self.store = store
        self.subjects = subjects

    def claim(
        self,
        subject: str,
        sink: str,
        producer: str,
        partitions: Sequence[int],
        start_offsets: Callable[[], Mapping[int, int]],
        not_before: int = 0,
    ) -> Lease:
        """Claim private partitions for a producer (or re-open its claim) and start a new incarnation.

        ``start_offsets`` is asked only for a brand-new producer: where its first epoch begins.
        A brand-new producer writes from the subject's next epoch on, or from ``not_before`` when
        that is later (the epochs before are never written by it).
        """
        return self.claim_together(sink, producer, [Claim(subject, partitions, start_offsets)], not_before)[0]

    def claim_together(self, sink: str, producer: str, claims: Sequence[Claim], not_before: int = 0) -> list[Lease]:
        """Claim one producer in several subjects whose epochs it commits together (a job's output
        and its state changelog); returns the leases in the order of ``claims``.

        Where the producer is new in every subject, one multi-op makes it a writer of all of them
        from one common first epoch: claimed one by one, a crash (or a broker stall in
        ``start_offsets``) between two claims would leave it a writer of the first subject only,
        and the others' writers would commit epochs without it that it can never join.
        Where it exists in some subjects only (a subject added to an existing sink), the new ones
        start at the first existing lease's next epoch; the caller closes lanes that are behind.
        """
        me = writer_id(sink, producer)
        wanted = [self._claimable(c, sink) for c in claims]

        def attempt() -> tuple[list[WriterEntry | None], dict[int, ProducerNode], int]:
            docs = [self.subjects.writers(c.subject) for c in claims]
            entries = [self._entry(c.subject, doc, me, parts)
                       for c, parts, (doc, _) in zip(claims, wanted, docs, strict=True)]
            new = [i for i, e in enumerate(entries) if e is None]
            if not new:
                return entries, {}, 0
            lay = self.store.layout
            known = [Lease(c.subject, *self.store.read(ProducerNode, lay.producer(c.subject, sink, producer)),
                           e.first_epoch).next_epoch
                     for c, e in zip(claims, entries, strict=True) if e is not None]
            first = max(not_before, *known[:1], *(self.subjects._last_epoch(claims[i].subject) + 1 for i in new))
            nodes = {i: _new_producer(sink, producer, wanted[i], claims[i].start_offsets()) for i in new}
            joins = (self._join(claims[i].subject, *docs[i], [nodes[i]], first) for i in new)
            self.store.multi_cas(*(op for ops in joins for op in ops))
            return entries, nodes, first

        entries, nodes, first = self.store.zk.retry_conflicts(attempt)
        return [Lease(c.subject, nodes[i], 0, first) if i in nodes
                else self._reincarnate(c.subject, sink, producer, entries[i].first_epoch)  # type: ignore[union-attr]
                for i, c in enumerate(claims)]

    def claim_producers(self, subject: str, sink: str, producers: Mapping[str, Sequence[int]],
                        start_offsets: Callable[[Sequence[int]], Mapping[int, int]],
                        not_before: int = 0) -> list[Lease]:
        """Claim several new producers of one sink in one subject (a Spark sink's slots) in one
        multi-op, at one common first epoch; returns their leases in the order of ``producers``.

        Claimed one by one, each would start an epoch after the one before it (an epoch node names
        the writers it expects when it is created), and the first ones would owe the epochs between
        empty: a sink that must write epoch ``not_before`` with all its producers could not.
        Producers that exist already are left as they are (their leases are not returned)."""
        ids = {p: writer_id(sink, p) for p in producers}
        wanted = {p: self._claimable(Claim(subject, parts, dict), sink) for p, parts in producers.items()}

        def attempt() -> list[Lease]:
            doc, version = self.subjects.writers(subject)
            new = [p for p in producers if self._entry(subject, doc, ids[p], wanted[p]) is None]
            if not new:
                return []
            known = [Lease(subject, *self.store.read(ProducerNode, self.store.layout.producer(subject, sink, p)),
                           doc.writers[ids[p]].first_epoch).next_epoch for p in producers if p not in new]
            first = max(not_before, *known, self.subjects._last_epoch(subject) + 1)
            offsets = dict(start_offsets(sorted({q for p in new for q in wanted[p]})))
            nodes = [_new_producer(sink, p, wanted[p], offsets) for p in new]
            self.store.multi_cas(*self._join(subject, doc, version, nodes, first))
            return [Lease(subject, node, 0, first) for node in nodes]

        return self.store.zk.retry_conflicts(attempt)

    def _join(self, subject: str, doc: WritersNode, version: int, nodes: Sequence[ProducerNode],
              first: int) -> list[Op]:
        """The ops that make new producers writers of ``subject`` from epoch ``first``: the writers document
        (compare-and-set), their nodes, and the epoch ``first`` itself, so that no epoch can be created
        with a writers list that lacks them."""
        lay = self.store.layout
        joined = {writer_id(n.sink, n.producer): WriterEntry(partitions=n.partitions, first_epoch=first)
                  for n in nodes}
        updated = WritersNode(writers={**doc.writers, **joined})
        self.store.ensure_bucket(lay.epoch(subject, first))
        return [SetData(lay.writers(subject), updated.dump(), version),
                *(Create(lay.producer(subject, n.sink, n.producer), n.dump()) for n in nodes),
                Create(lay.epoch(subject, first), EpochNode(epoch=first, writers=updated.expected(first)).dump())]

    def _claimable(self, claim: Claim, sink: str) -> tuple[int, ...]:
        """Check a claim's partitions against the subject and make the sink's nodes; returns them sorted."""
        meta = self.subjects.subject(claim.subject)
        parts = tuple(sorted(set(claim.partitions)))
        if len(parts) != len(claim.partitions):  # none: a new version's producer, until its hot-swap hands it some
            raise AlignerError(f"a producer must claim distinct partitions, got {list(claim.partitions)}")
        bad = [p for p in parts if not 0 <= p < meta.partitions]
        if bad:
            raise AlignerError(f"subject {claim.subject!r} has partitions 0..{meta.partitions - 1}; cannot claim {bad}")
        lay = self.store.layout
        self.subjects._ensure(lay.sink(claim.subject, sink), SinkNode(sink=sink).dump(),
                              parent=lay.sinks(claim.subject))
        self.subjects._ensure(lay.producers(claim.subject, sink), b"")
        return parts

    @staticmethod
    def _entry(subject: str, doc: WritersNode, me: str, parts: tuple[int, ...]) -> WriterEntry | None:
        """The producer's writers entry in a subject, after checking that nobody else owns its partitions
        (a finished producer reopening, an old version restarted after its swap, writes nothing more: the
        partitions it held may be another's now)."""
        entry = doc.writers.get(me)
        if entry is None or entry.finished_after is None:
            for p in parts:  # a finished writer's partitions are free: it wrote them up to an epoch before ours
                owner = doc.holder(p)
                if owner is not None and owner != me:
                    raise PartitionClaimedError(subject, p, owner, me)
        if entry is not None and entry.partitions != parts:
            raise SubjectConflictError(
                f"producer {me} of {subject!r} owns partitions {list(entry.partitions)}; "
                f"it cannot reopen with {list(parts)}"
            )
        return entry

    def take_over(self, lease: Lease, partitions: Sequence[int], giver_sink: str, last: int,
                  start_offsets: Callable[[Sequence[int]], Mapping[int, int]]) -> Lease:
        """A new version's producer (``lease``, a writer of no partition) takes ``partitions`` over from the
        old version's producers (sink ``giver_sink``) after their epoch ``last``, S, which is committed at
        the subject (:mod:`aligner.handover` decides). One multi-op writes the writers document, this
        producer's node (its partitions, each starting where its range of S ended; ``start_offsets`` for
        one nobody wrote) and a new incarnation of every old producer concerned, so a zombie of the old
        version can commit nothing more. Returns the new lease."""
        subject, me, lay = lease.subject, lease.writer, self.store.layout
        path = lay.producer(subject, lease.node.sink, lease.node.producer)

        def attempt() -> Lease:
            doc, version = self.subjects.writers(subject)
            node, node_version = self.store.read(ProducerNode, path)
            if node.owner != lease.node.owner:
                raise FencedError(f"producer {me} of {subject!r} was taken over by another incarnation")
            plan = handover.take_over(doc, subject, me, partitions, giver_sink, last)
            if plan is None:  # taken over already: our multi-op landed and its reply was lost
                return Lease(subject, node, node_version, lease.first_epoch)
            if node_version != lease.version:
                raise FencedError(f"producer {me} of {subject!r} was taken over by another incarnation")
            old = {w: self.store.read(ProducerNode, lay.producer(subject, *split_writer(w)))
                   for w in {*plan.finished, *(g for g in plan.givers.values() if g is not None)}}
            offsets: dict[int, int] = {}
            for p, giver in plan.givers.items():
                if giver is None:
                    continue
                given = old[giver][0]
                if given.committed_epoch is None or given.committed_epoch < last:
                    raise AlignerError(f"producer {giver} of {subject!r} has not committed epoch {last}: a new "
                                       f"version takes its partitions over only once the swap epoch is committed")
                offsets[p] = given.next_offsets[p]
            fresh = [p for p, giver in plan.givers.items() if giver is None]
            if fresh:
                ends = start_offsets(fresh)
                offsets.update({p: ends[p] for p in fresh})
            mine = node.model_copy(update={"partitions": tuple(sorted(offsets)), "next_offsets": offsets})
            fenced = [SetData(lay.producer(subject, *split_writer(w)),
                              n.model_copy(update={"incarnation": n.incarnation + 1, "owner": uuid.uuid4().hex}).dump(),
                              v) for w, (n, v) in sorted(old.items())]
            results = self.store.multi_cas(SetData(lay.writers(subject), plan.doc.dump(), version),
                                     SetData(path, mine.dump(), node_version), *fenced)
            return Lease(subject, mine, results[1].version, lease.first_epoch)  # type: ignore[attr-defined]

        return self.store.zk.retry_conflicts(attempt)

    def _reincarnate(self, subject: str, sink: str, producer: str, first_epoch: int) -> Lease:
        path = self.store.layout.producer(subject, sink, producer)
        node, version = self.store.read(ProducerNode, path)
        return self.reincarnate(Lease(subject, node, version, first_epoch))

    def reincarnate(self, lease: Lease) -> Lease:
        """Take a new attempt number; any older incarnation can no longer commit."""
        path = self.store.layout.producer(lease.subject, lease.node.sink, lease.node.producer)
        node = lease.node.model_copy(update={"incarnation": lease.node.incarnation + 1, "owner": uuid.uuid4().hex})
        self.store._trip("write")
        try:
            stat = self.store.zk.set(path, node.dump(), version=lease.version)
        except BadVersionError:
            version = self._written_by_us(path, node)
            if version is None:
                raise FencedError(
                    f"producer {lease.writer} of {lease.subject!r} was taken over by another incarnation"
                ) from None
            return Lease(lease.subject, node, version, lease.first_epoch)
        return Lease(lease.subject, node, stat.version, lease.first_epoch)

    def _written_by_us(self, path: str, node: ProducerNode) -> int | None:
        """After a versioned write failed: the node's version if it already holds ``node`` (the write
        was retried after its reply was lost), else None (another incarnation wrote it)."""
        current, version = self.store.read(ProducerNode, path)
        return version if current == node else None
