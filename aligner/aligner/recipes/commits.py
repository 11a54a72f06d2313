"""Epoch commits: round trip 1 makes the epoch node with the expected writers, round trip 2 commits
every producer's contribution in one multi-op; finishing and closing epochs empty.

A pipelined commit (``commit_epoch_async`` with ``writers``) may also carry round trip 1 of the next
epoch, for subjects whose only expected writer is the committing producer: one round trip per epoch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.retry import ForceRetryError

from aligner.errors import AlignerError, FencedError, LedgerRollbackError, MalformedNodeError
from aligner.models import ContributionNode, EpochNode, ProducerNode, Range, WritersNode
from aligner.ops import Check, Create, Op, SetData, first_failure, raise_failure
from aligner.recipes.claims import ClaimRecipes, Lease
from aligner.recipes.reads import EpochReads
from aligner.recipes.store import Store
from aligner.recipes.subjects import SubjectRecipes


@dataclass(frozen=True)
class PendingEpoch:
    """An ``ensure_epoch`` whose multi-op is in flight (see ``CommitRecipes.ensure_epoch_async``)."""

    subject: str
    epoch: int
    doc: WritersNode
    version: int
    result: Any
    """The kazoo async result of the multi-op."""


@dataclass(frozen=True)
class PendingCommit:
    """A ``commit_epoch`` whose multi-op is in flight (see ``CommitRecipes.commit_epoch_async``)."""

    epoch: int
    contributions: Sequence[Contribution]
    nodes: Sequence[ProducerNode]
    """Each producer's node as the multi-op writes it."""
    result: Any
    """The async result of the multi-op (its ``get()`` retries it on connection loss)."""
    extra: Sequence[Op] = ()
    ahead: Mapping[str, tuple[WritersNode, int]] = field(default_factory=dict)
    """Subjects whose epoch ``epoch + 1`` the multi-op creates, with the writers document it checks."""


@dataclass(frozen=True)
class Contribution:
    """One producer's part of an epoch commit: the attempt that counts and its ranges."""

    lease: Lease
    attempt: int | None
    ranges: Mapping[int, Range]
    counts: Mapping[int, int] | None = None
    """Records the attempt wrote per partition (optional): readers skip stamp checks when a range holds
    nothing else."""


def _ensured(results: list[object]) -> bool:
    """Whether an ensure-epoch multi-op left the epoch node in place (made now, or by another producer);
    False when the writers document changed since it was read; raises any other failure."""
    if first_failure(results) is None or isinstance(results[0], NodeExistsError):
        return True
    if isinstance(results[1], BadVersionError):
        return False
    raise_failure(results)
    return False


class CommitRecipes:
    """The two round trips of an epoch commit, and the epochs a producer owes."""

    def __init__(self, store: Store, subjects: SubjectRecipes, epochs: EpochReads, claims: ClaimRecipes) -> None:
        self.store = store
        self.subjects = subjects
        self.epochs = epochs
        self.claims = claims

    def ensure_epoch(
        self, subject: str, epoch: int, writers: tuple[WritersNode, int] | None = None
    ) -> tuple[WritersNode, int]:
        """Round trip 1 of a commit: make sure the epoch node exists with the current writers.

        Returns the writers document it checked against, for the caller to cache.
        """
        return self.epoch_ensured(self.ensure_epoch_async(subject, epoch, writers))

    def ensure_epoch_async(
        self, subject: str, epoch: int, writers: tuple[WritersNode, int] | None = None
    ) -> PendingEpoch:
        """``ensure_epoch`` with its round trip in flight: finish it with :meth:`epoch_ensured`.

        A sink issues it when it begins an epoch and waits for it before its Kafka commit, so the
        round trip overlaps the epoch's sends. Without a cached ``writers`` document the document
        is read first (synchronously), as ``ensure_epoch`` does.
        """
        doc, version = writers or self.subjects.writers(subject)
        return PendingEpoch(subject, epoch, doc, version, self._ensure_multi(subject, epoch, doc, version))

    def epoch_ensured(self, pending: PendingEpoch) -> tuple[WritersNode, int]:
        """Wait for an ``ensure_epoch_async``; retries with a fresh writers document when it changed."""
        if _ensured(pending.result.get()):
            return pending.doc, pending.version

        def attempt() -> tuple[WritersNode, int]:  # the writers changed since they were read: read them again
            doc, version = self.subjects.writers(pending.subject)
            if not _ensured(self._ensure_multi(pending.subject, pending.epoch, doc, version).get()):
                raise ForceRetryError()
            return doc, version

        return self.store.zk.retry_conflicts(attempt)

    def _ensure_multi(self, subject: str, epoch: int, doc: WritersNode, version: int) -> Any:
        return self.store.multi_async(*self._ensure_ops(subject, epoch, doc, version))

    def _ensure_ops(self, subject: str, epoch: int, doc: WritersNode, version: int) -> list[Op]:
        lay = self.store.layout
        node = EpochNode(epoch=epoch, writers=doc.expected(epoch))
        self.store.ensure_bucket(lay.epoch(subject, epoch))
        return [Create(lay.epoch(subject, epoch), node.dump()), Check(lay.writers(subject), version)]

    def commit(self, lease: Lease, epoch: int, attempt: int | None, ranges: Mapping[int, Range],
               extra: Sequence[Op] = (), counts: Mapping[int, int] | None = None) -> Lease:
        """Round trip 2 for one producer: :meth:`commit_epoch` with a single contribution."""
        return self.commit_epoch(epoch, [Contribution(lease, attempt, ranges, counts)], extra)[0]

    def commit_epoch(self, epoch: int, contributions: Sequence[Contribution],
                     extra: Sequence[Op] = ()) -> list[Lease]:
        """Round trip 2: the ZooKeeper commit of ``epoch`` by one or several producers, in one multi-op.

        The Kafka commit came first. Every producer must commit ``epoch`` next (producers of several
        subjects share epoch numbers when they commit together); each one's node is compare-and-set
        on its lease's version, so a zombie incarnation of any of them fails the whole commit.
        ``extra`` ops commit atomically with it: a job's input offsets, a Spark sink's batch record.
        Returns the new leases, in the order of ``contributions``.
        """
        ops, nodes = self._commit_ops(epoch, contributions)
        return self._commit_outcome(epoch, contributions, nodes, self.store.multi(*ops, *extra))

    def commit_new_epoch(self, subject: str, epoch: int, contributions: Sequence[Contribution],
                         writers: tuple[WritersNode, int], extra: Sequence[Op] = ()) -> list[Lease]:
        """Round trips 1 and 2 of ``subject``'s ``epoch`` in one multi-op, for a caller that read the writers
        document (``writers``) when it planned the epoch: a Spark micro-batch commit is one request.

        When the epoch node exists already (a commit retried, or another writer of the subject made it) or the
        writers changed since, nothing landed; the commit is then made as two round trips."""
        doc, version = writers
        head = self._ensure_ops(subject, epoch, doc, version)
        ops, nodes = self._commit_ops(epoch, contributions)
        results = self.store.multi(*head, *ops, *extra)
        failed = first_failure(results)
        if (failed == 0 and isinstance(results[0], NodeExistsError)) or (
                failed == 1 and isinstance(results[1], BadVersionError)):
            self.ensure_epoch(subject, epoch)
            return self.commit_epoch(epoch, contributions, extra)
        return self._commit_outcome(epoch, contributions, nodes, results[len(head):])

    def commit_epoch_async(self, epoch: int, contributions: Sequence[Contribution], extra: Sequence[Op] = (),
                           writers: Mapping[str, tuple[WritersNode, int]] | None = None) -> PendingCommit:
        """``commit_epoch`` with its multi-op in flight: finish it with :meth:`epoch_committed`.

        A sink that pipelines its commits (``SinkProducer.commit(wait=False)``) sends it after its
        Kafka commit and waits for it before its next epoch's Kafka commit. Sent from the caller's
        thread: a thread of its own would wait for the GIL behind the sink's sends at every step.

        With ``writers`` (the documents the caller's ``ensure_epoch`` calls returned), the multi-op also
        makes the epoch after ``epoch`` in each subject whose only expected writer is the contributing
        producer, compared against that document: round trip 1 of the next epoch, which nobody else
        would make. ``PendingCommit.ahead`` names those subjects. Only for a writer that begins its next
        epoch at once: the node commits it to that epoch (a hot-swap's old version stops at an epoch
        whose successor does not exist yet, so the runtime's waited-for commits never do this)."""
        ops, nodes = self._commit_ops(epoch, contributions)
        ahead = {c.lease.subject: writers[c.lease.subject] for c in contributions
                 if writers and c.lease.subject in writers
                 and writers[c.lease.subject][0].expected(epoch + 1) == (c.lease.writer,)}
        after = [op for subject, (doc, version) in ahead.items()
                 for op in self._ensure_ops(subject, epoch + 1, doc, version)]
        return PendingCommit(epoch, contributions, nodes, self.store.multi_async(*ops, *extra, *after), extra, ahead)

    def epoch_committed(self, pending: PendingCommit) -> tuple[list[Lease], dict[str, tuple[WritersNode, int]]]:
        """Wait for a ``commit_epoch_async``; its outcome as ``commit_epoch`` gives it, with the subjects
        whose next epoch it made (``pending.ahead``) and the writers document each was checked against.

        If one could not be made (the writers changed, or another writer made it), nothing landed: the
        commit is made again without them and none is returned; the caller ensures them as usual."""
        results = pending.result.get()
        failed = first_failure(results)
        own = 2 * len(pending.contributions) + len(pending.extra)
        if failed is None or failed < own or not isinstance(results[failed], (NodeExistsError, BadVersionError)):
            leases = self._commit_outcome(pending.epoch, pending.contributions, pending.nodes, results)
            return leases, dict(pending.ahead)
        return self.commit_epoch(pending.epoch, pending.contributions, pending.extra), {}

    def _commit_ops(self, epoch: int, contributions: Sequence[Contribution]) -> tuple[list[Op], list[ProducerNode]]:
        if not contributions:
            raise AlignerError(f"epoch {epoch}: nothing to commit")
        lay = self.store.layout
        ops: list[Op] = []
        nodes: list[ProducerNode] = []
        seen: set[tuple[str, str]] = set()
        for c in contributions:
            lease, n = c.lease, c.lease.node
            if (lease.subject, lease.writer) in seen:
                raise AlignerError(f"producer {lease.writer} of {lease.subject!r} contributes twice to epoch {epoch}")
            seen.add((lease.subject, lease.writer))
            self._check_contribution(c, epoch)
            contribution = ContributionNode(sink=n.sink, producer=n.producer, attempt=c.attempt,
                                            ranges=dict(c.ranges), counts=dict(c.counts or {}))
            node = n.model_copy(update={"committed_epoch": epoch,
                                        "next_offsets": {p: r.end for p, r in c.ranges.items()}})
            nodes.append(node)
            # The fencing check goes first: ZooKeeper reports only the first failing op of a multi.
            ops.append(SetData(lay.producer(lease.subject, n.sink, n.producer), node.dump(), lease.version))
            ops.append(Create(lay.contribution(lease.subject, epoch, lease.writer), contribution.dump()))
        return ops, nodes

    def _commit_outcome(self, epoch: int, contributions: Sequence[Contribution], nodes: Sequence[ProducerNode],
                        results: list[object]) -> list[Lease]:
        failed = first_failure(results)
        if failed is None:
            return [Lease(c.lease.subject, node, results[2 * i].version, c.lease.first_epoch)  # type: ignore[attr-defined]
                    for i, (c, node) in enumerate(zip(contributions, nodes, strict=True))]
        if failed == 0 and isinstance(results[0], BadVersionError):
            landed = self._landed(contributions, nodes)
            if landed is not None:  # our multi-op landed; its reply was lost to a connection drop
                return landed
        if failed < 2 * len(contributions):
            c, result = contributions[failed // 2], results[failed]
            subject, writer = c.lease.subject, c.lease.writer
            if isinstance(result, BadVersionError):
                self._rolled_back(c.lease)
                raise FencedError(f"producer {writer} of {subject!r} was fenced by a newer incarnation")
            if isinstance(result, NoNodeError):
                raise AlignerError(f"epoch node {epoch} of {subject!r} missing: call ensure_epoch first")
            if isinstance(result, NodeExistsError):
                raise AlignerError(f"producer {writer} already committed epoch {epoch} of {subject!r}")
        raise results[failed]  # type: ignore[misc]

    def _rolled_back(self, lease: Lease) -> None:
        """A version check that failed because ZooKeeper went back in time, not because another incarnation
        wrote: the node still names this incarnation but an earlier commit than the one ZooKeeper already
        acknowledged to it. Said as such (the ensemble lost acknowledged writes), not as fencing."""
        n = lease.node
        path = self.store.layout.producer(lease.subject, n.sink, n.producer)
        try:
            current, version = self.store.read(ProducerNode, path)
        except NoNodeError:
            return
        behind = (current.committed_epoch if current.committed_epoch is not None else -1) < (
            n.committed_epoch if n.committed_epoch is not None else -1)
        if current.owner == n.owner and current.incarnation == n.incarnation and (version < lease.version or behind):
            raise LedgerRollbackError(
                f"ZooKeeper lost acknowledged writes: producer {lease.writer} of {lease.subject!r} committed epoch "
                f"{n.committed_epoch} (node version {lease.version}), and {path} is back at epoch "
                f"{current.committed_epoch} (version {version}); the ensemble lost committed transactions "
                f"(a ZooKeeper server bug; docs: Operations, ZooKeeper), so this producer stops rather than "
                f"write on a ledger that forgot what it acknowledged")

    @staticmethod
    def _check_contribution(c: Contribution, epoch: int) -> None:
        lease = c.lease
        if epoch != lease.next_epoch:
            raise AlignerError(f"producer {lease.writer} must commit epoch {lease.next_epoch} next, not {epoch}")
        if set(c.ranges) != set(lease.node.partitions):
            raise AlignerError(f"producer {lease.writer} must give ranges for exactly {list(lease.node.partitions)}")
        for p, r in c.ranges.items():
            # An epoch written without stamps starts at its first record, past the previous commit marker
            # and any earlier attempt's records (epochs.dense_ranges); none starts before the last one ended.
            if r.start < lease.node.next_offsets[p]:
                raise AlignerError(
                    f"producer {lease.writer}: epoch {epoch} partition {p} must start at or after "
                    f"{lease.node.next_offsets[p]}, not at {r.start}"
                )

    def _landed(self, contributions: Sequence[Contribution], nodes: Sequence[ProducerNode]) -> list[Lease] | None:
        """After a commit's first version check failed: the new leases if the multi-op had landed
        (a retry after a lost reply finds every producer node as it wrote it), else None."""
        leases = []
        for c, node in zip(contributions, nodes, strict=True):
            path = self.store.layout.producer(c.lease.subject, node.sink, node.producer)
            version = self.claims._written_by_us(path, node)
            if version is None:
                return None
            leases.append(Lease(c.lease.subject, node, version, c.lease.first_epoch))
        return leases

    def close_empty(self, lease: Lease, before: int) -> Lease:
        """Commit empty epochs of one producer up to (not including) ``before``.

        Producers that commit together must start from the same epoch: one that fell behind (a
        Spark slot, a subject a sink writes beside its output) owes the epochs in between, and
        closing them empty lets them commit for readers."""
        while lease.next_epoch < before:
            epoch = lease.next_epoch
            self.ensure_epoch(lease.subject, epoch)
            empty = {p: Range(start=o, end=o) for p, o in lease.node.next_offsets.items()}
            lease = self.commit(lease, epoch, None, empty)
        return lease

    def finish(self, lease: Lease) -> int | None:
        """Mark a producer finished after its last committed epoch (thesis 5.7: finite streams).

        Epoch nodes created ahead of the finish still list this producer; it contributes empty
        ranges to them so they can commit. Returns the last epoch it wrote.
        """
        lay, subject, last = self.store.layout, lease.subject, lease.node.committed_epoch
        stop = -1 if last is None else last

        def finished(doc: WritersNode | None) -> WritersNode | None:
            if doc is None:
                raise MalformedNodeError(lay.writers(subject), "missing writers node")
            entry = doc.writers[lease.writer]
            if entry.finished_after is not None:
                return None
            return WritersNode(writers={**doc.writers, lease.writer: entry.model_copy(update={"finished_after": stop})})

        self.store.update(WritersNode, lay.writers(subject), finished)
        empty = {p: Range(start=o, end=o) for p, o in lease.node.next_offsets.items()}
        for epoch in self.subjects.epoch_numbers(subject):
            if epoch > stop and lease.writer in self.epochs.epoch_node(subject, epoch).writers:
                contribution = ContributionNode(sink=lease.node.sink, producer=lease.node.producer, attempt=None,
                                                ranges=empty)
                self.subjects._ensure(lay.contribution(subject, epoch, lease.writer), contribution.dump())
        return last
