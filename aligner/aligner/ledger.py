"""The subject epoch ledger in ZooKeeper: registration, partition claims, lock-free epoch commits.

Commit protocol (per producer per epoch, two round trips whatever the parallelism):

1. ``ensure_epoch``: create the epoch node listing the writers expected to contribute, in a
   multi-op that checks the version of the subject's writers document. Any producer may create
   it; ``NodeExists`` means another already did. Producers never wait for each other.
2. ``commit_epoch`` (``commit`` for one producer): after the Kafka transaction committed, one
   multi-op creates the producer's contribution (attempt + ranges) under the epoch node and
   compare-and-sets the producer node (next offsets, committed epoch). The version check fences
   zombie incarnations. Several producers commit the same epoch in one multi-op when their writes
   belong together: a Spark sink's slots (one micro-batch), or a job's output and its changelog
   subject (one Kafka transaction); the caller's own ops (a job's input offsets) ride along.

An epoch is committed once every expected writer's contribution exists. Writers join by a
multi-op that updates the writers document and creates the first epoch they write, so no epoch
can be created with a stale list of writers. There are no locks anywhere.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.retry import KazooRetry

from aligner.acl import AclPolicy
from aligner.epochs import CommittedEpoch, assemble, missing_writers
from aligner.errors import (
    AlignerError,
    EpochCollectedError,
    EpochNotCommittedError,
    FencedError,
    MalformedNodeError,
    PartitionClaimedError,
    StoppedError,
    SubjectConflictError,
    UnknownSubjectError,
    UnreachableError,
)
from aligner.layout import Layout, epoch_name, writer_id
from aligner.metrics import ZK_ROUND_TRIPS
from aligner.models import (
    ContributionNode,
    EpochNode,
    M,
    ProducerNode,
    Range,
    SinkNode,
    SubjectNode,
    WriterEntry,
    WritersNode,
    parse,
)
from aligner.ops import Check, Create, Op, SetData, failed_with, first_failure, raise_failure
from aligner.settings import zk_security
from aligner.zk import RetryingClient, tls_mismatch

SESSION_TIMEOUT = 10.0
"""Seconds of silence after which ZooKeeper expires a session (fencing keeps a late worker harmless)."""
TLS_PROBE_AFTER, TLS_PROBE_EVERY = 1.0, 3.0
"""Seconds a first session may be late before ZooKeeper is probed for a TLS mismatch, and between probes."""


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
class PendingEpoch:
    """An ``ensure_epoch`` whose multi-op is in flight (see ``Ledger.ensure_epoch_async``)."""

    subject: str
    epoch: int
    doc: WritersNode
    version: int
    result: Any
    """The kazoo async result of the multi-op."""


@dataclass(frozen=True)
class Claim:
    """A producer's private partitions in one subject, and where it starts writing there if new."""

    subject: str
    partitions: Sequence[int]
    start_offsets: Callable[[], Mapping[int, int]]


@dataclass(frozen=True)
class Contribution:
    """One producer's part of an epoch commit: the attempt that counts and its ranges."""

    lease: Lease
    attempt: int | None
    ranges: Mapping[int, Range]
    counts: Mapping[int, int] | None = None
    """Records the attempt wrote per partition (optional): readers skip stamp checks when a range holds
    nothing else."""


_PIPELINE_EPOCHS = 500
"""Epochs whose reads ``committed_many`` keeps in flight at once."""


class Ledger:
    """Typed access to the ZooKeeper state of subjects; counts its round trips."""

    def __init__(self, zk: KazooClient | RetryingClient, layout: Layout | None = None,
                 stop: threading.Event | None = None) -> None:
        self.zk = zk if isinstance(zk, RetryingClient) else RetryingClient(zk, stop)
        self.layout = layout or Layout()
        self.round_trips = 0
        self._committed: dict[tuple[str, int], CommittedEpoch] = {}
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, hosts: str, root: str = "/aligner", timeout: float | None = 15.0,
                stop: threading.Event | None = None, auth: str | None = None) -> Ledger:
        """Open a session; ``stop`` (when given) ends any later wait for ZooKeeper with StoppedError.

        ``timeout`` None waits for the first session as long as it takes (a long-running component
        started while ZooKeeper is down), until ``stop`` is set. Reconnects are retried forever with
        backoff capped at a second, so a ZooKeeper that comes back after minutes is found again at
        once (kazoo's default cap is an hour). ``auth`` (``digest:USER:PASSWORD``; '' for none) defaults
        to ``ALIGNER_ZK_AUTH``; the session's creates then carry the ACL policy's ACLs (aligner.acl).
        TLS comes from ``ALIGNER_ZK_TLS_*``; a session that is late because of TLS (a plaintext client on
        a secure port, an untrusted certificate, ...) fails at once with :class:`UnreachableError` saying so.
        """
        security = zk_security(auth)
        reconnect = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0)
        zk = KazooClient(hosts=hosts, timeout=SESSION_TIMEOUT, connection_retry=reconnect,
                         **security.kazoo_options())  # type: ignore[arg-type]
        started = zk.start_async()
        deadline = None if timeout is None else time.monotonic() + timeout
        probe_at = time.monotonic() + TLS_PROBE_AFTER
        while not started.wait(0.25):
            if time.monotonic() > probe_at:
                probe_at = time.monotonic() + TLS_PROBE_EVERY
                mismatch = tls_mismatch(hosts, security.tls)
                if mismatch is not None:  # kazoo would retry it forever, only logging why
                    zk.stop()
                    zk.close()
                    raise UnreachableError("ZooKeeper", hosts, mismatch)
            stopped = stop is not None and stop.is_set()
            if stopped or (deadline is not None and time.monotonic() > deadline):
                zk.stop()
                zk.close()
                if stopped:
                    raise StoppedError(f"stopped while waiting for ZooKeeper at {hosts}")
                raise zk.handler.timeout_exception(f"no ZooKeeper session at {hosts} within {timeout:.0f}s")
        return cls(RetryingClient(zk, stop, AclPolicy(root, security.auth)), Layout(root))

    @property
    def stop(self) -> threading.Event:
        """Set it to make every pending and later ZooKeeper wait raise :class:`StoppedError`."""
        return self.zk.stop

    def stop_on(self, event: threading.Event) -> None:
        """Also end ZooKeeper waits when ``event`` is set (the stop flag of the component using it)."""
        self.zk.stop_on(event)

    def stopping(self) -> bool:
        return self.zk.stopping()

    def close(self) -> None:
        self.zk.stop_session()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- low level ----------------------------------------------------------------------------

    def _trip(self, kind: str) -> None:
        with self._lock:
            self.round_trips += 1
        ZK_ROUND_TRIPS.labels(kind).inc()

    def read(self, model: type[M], path: str) -> tuple[M, int]:
        """Read and validate a node; ``NoNodeError`` propagates for the caller to name."""
        self._trip("read")
        raw, stat = self.zk.get(path)
        return parse(model, path, raw), stat.version

    def read_optional(self, model: type[M], path: str) -> tuple[M | None, int]:
        """(node, version); (None, version) for a node created empty (a placeholder); (None, -1) for none."""
        self._trip("read")
        try:
            raw, stat = self.zk.get(path)
        except NoNodeError:
            return None, -1
        return (parse(model, path, raw) if raw else None), stat.version

    def _children(self, path: str) -> list[str]:
        self._trip("read")
        return self.zk.get_children(path)

    def multi(self, *ops: Op) -> list[object]:
        """One multi-op round trip; a failed op comes back as its exception (read with aligner.ops)."""
        return self._multi(*ops)

    def _multi(self, *ops: Op) -> list[object]:
        """The executor behind ``multi`` (tests/test_stamped.py wraps it to record a commit's ops)."""
        self._trip("multi")
        return self.zk.transaction(ops).commit()

    def multi_async(self, *ops: Op) -> Any:
        """Like ``multi`` but returns at once; ``.get()`` gives the results."""
        self._trip("multi")
        return self.zk.transaction(ops).commit_async()

    # ---- subjects -----------------------------------------------------------------------------

    def register_subject(self, node: SubjectNode) -> SubjectNode:
        """Create a subject, or return the existing one when it has the same shape."""
        lay = self.layout
        self.zk.ensure_path(lay.subjects)
        results = self.multi(
            Create(lay.subject(node.name), node.dump()),
            Create(lay.writers(node.name), WritersNode().dump()),
            Create(lay.sinks(node.name)),
            Create(lay.epochs(node.name)),
        )
        if isinstance(results[0], NodeExistsError):
            existing = self.subject(node.name)
            if not existing.same_shape(node):
                raise SubjectConflictError(
                    f"subject {node.name!r} already exists with topic {existing.topic!r}, "
                    f"{existing.partitions} partitions and {len(existing.fields)} fields; refusing to change it"
                )
            return existing
        raise_failure(results)
        return node

    def subject(self, name: str) -> SubjectNode:
        try:
            return self.read(SubjectNode, self.layout.subject(name))[0]
        except NoNodeError:
            raise UnknownSubjectError(name) from None

    def subject_names(self) -> list[str]:
        try:
            return sorted(self._children(self.layout.subjects))
        except NoNodeError:
            return []

    def writers(self, subject: str) -> tuple[WritersNode, int]:
        try:
            return self.read(WritersNode, self.layout.writers(subject))
        except NoNodeError:
            self.subject(subject)  # raises UnknownSubjectError when that is the cause
            raise MalformedNodeError(self.layout.writers(subject), "missing writers node") from None

    def sinks(self, subject: str) -> list[str]:
        try:
            return sorted(self._children(self.layout.sinks(subject)))
        except NoNodeError:
            raise UnknownSubjectError(subject) from None

    def producers(self, subject: str, sink: str) -> list[ProducerNode]:
        lay = self.layout
        return [self.read(ProducerNode, lay.producer(subject, sink, p))[0]
                for p in sorted(self._children(lay.producers(subject, sink)))]

    # ---- producers ----------------------------------------------------------------------------

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
        lay = self.layout
        wanted = [self._claimable(c, sink) for c in claims]
        while True:
            docs = [self.writers(c.subject) for c in claims]
            entries = [self._entry(c.subject, doc, me, parts)
                       for c, parts, (doc, _) in zip(claims, wanted, docs, strict=True)]
            new = [i for i, e in enumerate(entries) if e is None]
            if new:
                known = [Lease(c.subject, *self.read(ProducerNode, lay.producer(c.subject, sink, producer)),
                               e.first_epoch).next_epoch
                         for c, e in zip(claims, entries, strict=True) if e is not None]
                first = max(not_before, *known[:1], *(self._last_epoch(claims[i].subject) + 1 for i in new))
                ops: list[Op] = []
                nodes: dict[int, ProducerNode] = {}
                for i in new:
                    c, parts, (doc, version) = claims[i], wanted[i], docs[i]
                    entries[i] = WriterEntry(partitions=parts, first_epoch=first)
                    updated = WritersNode(writers={**doc.writers, me: entries[i]})
                    offsets = dict(c.start_offsets())
                    nodes[i] = ProducerNode(sink=sink, producer=producer, partitions=parts, incarnation=1,
                                            owner=uuid.uuid4().hex, next_offsets={p: offsets[p] for p in parts})
                    epoch = EpochNode(epoch=first, writers=updated.expected(first))
                    ops += [SetData(lay.writers(c.subject), updated.dump(), version),
                            Create(lay.producer(c.subject, sink, producer), nodes[i].dump()),
                            Create(lay.epoch(c.subject, first), epoch.dump())]
                results = self.multi(*ops)
                if failed_with(results, BadVersionError, NodeExistsError):
                    continue  # someone claimed or created an epoch meanwhile (or our reply was lost): look again
                raise_failure(results)
            return [Lease(c.subject, nodes[i], 0, first) if i in new
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
        lay = self.layout
        while True:
            doc, version = self.writers(subject)
            new = [p for p in producers if self._entry(subject, doc, ids[p], wanted[p]) is None]
            if not new:
                return []
            known = [Lease(subject, *self.read(ProducerNode, lay.producer(subject, sink, p)),
                           doc.writers[ids[p]].first_epoch).next_epoch for p in producers if p not in new]
            first = max(not_before, *known, self._last_epoch(subject) + 1)
            offsets = dict(start_offsets(sorted({q for p in new for q in wanted[p]})))
            entries = {ids[p]: WriterEntry(partitions=wanted[p], first_epoch=first) for p in new}
            updated = WritersNode(writers={**doc.writers, **entries})
            nodes = {p: ProducerNode(sink=sink, producer=p, partitions=wanted[p], incarnation=1, owner=uuid.uuid4().hex,
                                     next_offsets={q: offsets[q] for q in wanted[p]}) for p in new}
            ops: list[Op] = [SetData(lay.writers(subject), updated.dump(), version)]
            ops += [Create(lay.producer(subject, sink, p), nodes[p].dump()) for p in new]
            epoch = EpochNode(epoch=first, writers=updated.expected(first))
            ops.append(Create(lay.epoch(subject, first), epoch.dump()))
            results = self.multi(*ops)
            if failed_with(results, BadVersionError, NodeExistsError):
                continue  # someone claimed or created an epoch meanwhile (or our reply was lost): look again
            raise_failure(results)
            return [Lease(subject, nodes[p], 0, first) for p in new]

    def _claimable(self, claim: Claim, sink: str) -> tuple[int, ...]:
        """Check a claim's partitions against the subject and make the sink's nodes; returns them sorted."""
        meta = self.subject(claim.subject)
        parts = tuple(sorted(set(claim.partitions)))
        if not parts or len(parts) != len(claim.partitions):
            raise AlignerError(f"a producer must claim distinct partitions, got {list(claim.partitions)}")
        bad = [p for p in parts if not 0 <= p < meta.partitions]
        if bad:
            raise AlignerError(f"subject {claim.subject!r} has partitions 0..{meta.partitions - 1}; cannot claim {bad}")
        lay = self.layout
        self._ensure(lay.sink(claim.subject, sink), SinkNode(sink=sink).dump(), parent=lay.sinks(claim.subject))
        self._ensure(lay.producers(claim.subject, sink), b"")
        return parts

    @staticmethod
    def _entry(subject: str, doc: WritersNode, me: str, parts: tuple[int, ...]) -> WriterEntry | None:
        """The producer's writers entry in a subject, after checking that nobody else owns its partitions."""
        for p in parts:
            owner = doc.owner_of(p)
            if owner is not None and owner != me:
                raise PartitionClaimedError(subject, p, owner, me)
        entry = doc.writers.get(me)
        if entry is not None and entry.partitions != parts:
            raise SubjectConflictError(
                f"producer {me} of {subject!r} owns partitions {list(entry.partitions)}; "
                f"it cannot reopen with {list(parts)}"
            )
        return entry

    def _reincarnate(self, subject: str, sink: str, producer: str, first_epoch: int) -> Lease:
        path = self.layout.producer(subject, sink, producer)
        node, version = self.read(ProducerNode, path)
        return self.reincarnate(Lease(subject, node, version, first_epoch))

    def reincarnate(self, lease: Lease) -> Lease:
        """Take a new attempt number; any older incarnation can no longer commit."""
        path = self.layout.producer(lease.subject, lease.node.sink, lease.node.producer)
        node = lease.node.model_copy(update={"incarnation": lease.node.incarnation + 1, "owner": uuid.uuid4().hex})
        self._trip("write")
        try:
            stat = self.zk.set(path, node.dump(), version=lease.version)
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
        current, version = self.read(ProducerNode, path)
        return version if current == node else None

    def _ensure(self, path: str, data: bytes, parent: str | None = None) -> None:
        try:
            self.zk.create(path, data)
        except NodeExistsError:
            pass
        except NoNodeError:
            if parent is None:
                raise
            raise MalformedNodeError(parent, "missing") from None

    # ---- epochs -------------------------------------------------------------------------------

    def epoch_numbers(self, subject: str) -> list[int]:
        try:
            names = self._children(self.layout.epochs(subject))
        except NoNodeError:
            raise UnknownSubjectError(subject) from None
        out = []
        for name in names:
            if not name.isdigit():
                raise MalformedNodeError(f"{self.layout.epochs(subject)}/{name}", "epoch node name is not a number")
            out.append(int(name))
        return sorted(out)

    def _last_epoch(self, subject: str) -> int:
        numbers = self.epoch_numbers(subject)
        return numbers[-1] if numbers else -1

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
        doc, version = writers or self.writers(subject)
        return PendingEpoch(subject, epoch, doc, version, self._ensure_multi(subject, epoch, doc, version))

    def epoch_ensured(self, pending: PendingEpoch) -> tuple[WritersNode, int]:
        """Wait for an ``ensure_epoch_async``; retries with a fresh writers document when it changed."""
        subject, epoch, doc, version, inflight = (pending.subject, pending.epoch, pending.doc, pending.version,
                                                  pending.result)
        while True:
            results = inflight.get()
            if first_failure(results) is None or isinstance(results[0], NodeExistsError):
                return doc, version
            if isinstance(results[1], BadVersionError):
                doc, version = self.writers(subject)
                inflight = self._ensure_multi(subject, epoch, doc, version)
                continue
            raise_failure(results)

    def _ensure_multi(self, subject: str, epoch: int, doc: WritersNode, version: int) -> Any:
        lay = self.layout
        node = EpochNode(epoch=epoch, writers=doc.expected(epoch))
        return self.multi_async(Create(lay.epoch(subject, epoch), node.dump()), Check(lay.writers(subject), version))

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
        if not contributions:
            raise AlignerError(f"epoch {epoch}: nothing to commit")
        lay = self.layout
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
        results = self._multi(*ops, *extra)
        failed = first_failure(results)
        if failed is None:
            return [Lease(c.lease.subject, node, results[2 * i].version, c.lease.first_epoch)  # type: ignore[attr-defined]
                    for i, (c, node) in enumerate(zip(contributions, nodes, strict=True))]
        if failed == 0 and isinstance(results[0], BadVersionError):
            landed = self._landed(contributions, nodes)
            if landed is not None:  # our multi-op landed; its reply was lost to a connection drop
                return landed
        if failed < len(ops):
            c, result = contributions[failed // 2], results[failed]
            subject, writer = c.lease.subject, c.lease.writer
            if isinstance(result, BadVersionError):
                raise FencedError(f"producer {writer} of {subject!r} was fenced by a newer incarnation")
            if isinstance(result, NoNodeError):
                raise AlignerError(f"epoch node {epoch} of {subject!r} missing: call ensure_epoch first")
            if isinstance(result, NodeExistsError):
                raise AlignerError(f"producer {writer} already committed epoch {epoch} of {subject!r}")
        raise results[failed]  # type: ignore[misc]

    @staticmethod
    def _check_contribution(c: Contribution, epoch: int) -> None:
        lease = c.lease
        if epoch != lease.next_epoch:
            raise AlignerError(f"producer {lease.writer} must commit epoch {lease.next_epoch} next, not {epoch}")
        if set(c.ranges) != set(lease.node.partitions):
            raise AlignerError(f"producer {lease.writer} must give ranges for exactly {list(lease.node.partitions)}")
        for p, r in c.ranges.items():
            if r.start != lease.node.next_offsets[p]:
                raise AlignerError(
                    f"producer {lease.writer}: epoch {epoch} partition {p} must start at "
                    f"{lease.node.next_offsets[p]}, not {r.start}"
                )

    def _landed(self, contributions: Sequence[Contribution], nodes: Sequence[ProducerNode]) -> list[Lease] | None:
        """After a commit's first version check failed: the new leases if the multi-op had landed
        (a retry after a lost reply finds every producer node as it wrote it), else None."""
        leases = []
        for c, node in zip(contributions, nodes, strict=True):
            path = self.layout.producer(c.lease.subject, node.sink, node.producer)
            version = self._written_by_us(path, node)
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
        lay, subject, last = self.layout, lease.subject, lease.node.committed_epoch
        stop = -1 if last is None else last
        while True:
            doc, version = self.writers(subject)
            entry = doc.writers[lease.writer]
            if entry.finished_after is not None:
                break
            finished = entry.model_copy(update={"finished_after": stop})
            updated = WritersNode(writers={**doc.writers, lease.writer: finished})
            self._trip("write")
            try:
                self.zk.set(lay.writers(subject), updated.dump(), version=version)
                break
            except BadVersionError:
                continue
        empty = {p: Range(start=o, end=o) for p, o in lease.node.next_offsets.items()}
        for epoch in self.epoch_numbers(subject):
            if epoch > stop and lease.writer in self.epoch_node(subject, epoch).writers:
                contribution = ContributionNode(sink=lease.node.sink, producer=lease.node.producer, attempt=None,
                                                ranges=empty)
                self._ensure(lay.contribution(subject, epoch, lease.writer), contribution.dump())
        return last

    def finished(self, subject: str) -> int | None:
        """The last epoch of a subject whose every producer has finished, else None."""
        doc, _ = self.writers(subject)
        if not doc.writers or any(e.finished_after is None for e in doc.writers.values()):
            return None
        last = max(e.finished_after for e in doc.writers.values() if e.finished_after is not None)
        return last if last < 0 or self.is_committed(subject, last) else None

    def arm_watch(self, subject: str, epoch: int, fired: threading.Event | Callable[[Any], None]) -> None:
        """Set ``fired`` (or call it) when the epoch node appears or gains a contribution.

        One-shot watches; kazoo also fires them when the connection drops, so a waiter re-arms
        and re-reads after every outage."""
        path = self.layout.epoch(subject, epoch)
        callback = (lambda _e: fired.set()) if isinstance(fired, threading.Event) else fired
        self._trip("read")
        if self.zk.exists(path, watch=callback) is not None:
            self._trip("read")
            try:
                self.zk.get_children(path, watch=callback)
            except NoNodeError:
                callback(None)

    def watch_node(self, path: str, callback: Callable[[Any], None]) -> bool:
        """One-shot watch on a node's existence or data; returns whether it exists now."""
        self._trip("read")
        return self.zk.exists(path, watch=callback) is not None

    def wait_committed(self, subject: str, epoch: int, timeout: float, stop: threading.Event | None = None) -> bool:
        """Block until ``epoch`` commits, woken by ZooKeeper watches rather than a timer."""
        deadline = time.monotonic() + timeout
        while True:
            fired = threading.Event()
            self.arm_watch(subject, epoch, fired)
            try:
                if self.is_committed(subject, epoch):
                    return True
            except EpochNotCommittedError:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (stop is not None and stop.is_set()):
                return False
            fired.wait(min(remaining, 1.0))

    def epoch_node(self, subject: str, epoch: int) -> EpochNode:
        try:
            return self.read(EpochNode, self.layout.epoch(subject, epoch))[0]
        except NoNodeError:
            raise self._missing(subject, epoch) from None

    def first_retained(self, subject: str) -> int:
        """The oldest epoch ``aligner gc`` kept (0 when nothing was collected)."""
        try:
            raw, _ = self.zk.get(self.layout.retention(subject))
        except NoNodeError:
            return 0
        try:
            return int(raw)
        except ValueError:
            raise MalformedNodeError(self.layout.retention(subject), f"not an epoch number: {raw[:40]!r}") from None

    def _missing(self, subject: str, epoch: int) -> AlignerError:
        self.subject(subject)
        floor = self.first_retained(subject)
        if epoch < floor:
            return EpochCollectedError(subject, epoch, floor)
        return EpochNotCommittedError(subject, epoch, "no such epoch")

    def is_committed(self, subject: str, epoch: int) -> bool:
        if (subject, epoch) in self._committed:
            return True
        node = self.epoch_node(subject, epoch)
        children = set(self._children(self.layout.epoch(subject, epoch)))
        return bool(node.writers) and not missing_writers(node, children)

    def committed(self, subject: str, epoch: int) -> CommittedEpoch:
        """The fixed slices of a committed epoch; cached, since a committed epoch never changes."""
        key = (subject, epoch)
        if key in self._committed:
            return self._committed[key]
        node = self.epoch_node(subject, epoch)
        path = self.layout.epoch(subject, epoch)
        present = set(self._children(path)) & set(node.writers)
        self._trip("read")
        pending = {w: self.zk.get_async(f"{path}/{w}") for w in sorted(present)}
        contributions = {w: parse(ContributionNode, f"{path}/{w}", a.get()[0]) for w, a in pending.items()}
        result = assemble(subject, node, contributions)
        self._committed[key] = result
        return result

    def committed_many(self, subject: str, first: int, last: int) -> list[CommittedEpoch]:
        """``committed`` for every epoch of [first, last], in order, with the reads pipelined.

        Two pipelined waves per chunk of epochs (epoch nodes with their children, then the
        contributions) instead of three round trips per epoch. Raises what ``committed`` raises for
        the first epoch of the span that is not committed (or malformed).
        """
        out: list[CommittedEpoch] = []
        for lo in range(first, last + 1, _PIPELINE_EPOCHS):
            out.extend(self._committed_chunk(subject, lo, min(last, lo + _PIPELINE_EPOCHS - 1)))
        return out

    def _committed_chunk(self, subject: str, first: int, last: int) -> list[CommittedEpoch]:
        lay = self.layout
        todo = [e for e in range(first, last + 1) if (subject, e) not in self._committed]
        heads: dict[int, tuple[Any, Any]] = {}
        if todo:
            self._trip("read")
            heads = {e: (self.zk.get_async(lay.epoch(subject, e)), self.zk.get_children_async(lay.epoch(subject, e)))
                     for e in todo}
        nodes: dict[int, EpochNode | BaseException] = {}
        pending: dict[int, dict[str, Any]] = {}
        for e, (node_req, children_req) in heads.items():
            path = lay.epoch(subject, e)
            try:
                node = parse(EpochNode, path, node_req.get()[0])
                children = children_req.get()
            except NoNodeError:
                nodes[e] = NoNodeError()
                continue
            except MalformedNodeError as exc:
                nodes[e] = exc
                continue
            nodes[e] = node
            present = set(children) & set(node.writers)
            pending[e] = {w: f"{path}/{w}" for w in sorted(present)}
        if any(pending.values()):
            self._trip("read")
            pending = {e: {w: (p, self.zk.get_async(p)) for w, p in ws.items()} for e, ws in pending.items()}
        out: list[CommittedEpoch] = []
        for e in range(first, last + 1):
            key = (subject, e)
            if key in self._committed:
                out.append(self._committed[key])
                continue
            node = nodes[e]
            if isinstance(node, NoNodeError):
                self.subject(subject)  # raises UnknownSubjectError when that is the cause
                raise self._missing(subject, e)
            if isinstance(node, BaseException):
                raise node
            contributions = {w: parse(ContributionNode, p, req.get()[0]) for w, (p, req) in pending[e].items()}
            result = assemble(subject, node, contributions)
            self._committed[key] = result
            out.append(result)
        return out

    def frontier(self, subject: str) -> int | None:
        """The last committed epoch (every earlier one is committed too: producers commit in order)."""
        for epoch in reversed(self.epoch_numbers(subject)):
            if self.is_committed(subject, epoch):
                return epoch
        return None


__all__ = ["Contribution", "Lease", "Ledger", "PendingEpoch", "epoch_name"]
