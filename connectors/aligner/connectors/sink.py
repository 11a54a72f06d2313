"""Transactional subject sink: one Kafka transaction per epoch, every record stamped.

A producer owns private partitions of the subject. ``commit`` flushes, takes each partition's
range from the delivery reports, commits the Kafka transaction (the pre-commit) and then commits
the epoch in ZooKeeper (the commit point for aligned readers). A crash between the two leaves
Kafka records whose attempt ZooKeeper never names; readers drop them and the epoch is written
again by the next incarnation.

A sink may write further subjects beside its output (``also``, e.g. a job's changelog subject):
their records go into the same Kafka transaction and their epochs (the same numbers as the
output's) commit in the same ZooKeeper multi-op, so they are committed together or not at all.
Each such subject gets a ledger producer of its own (same sink and producer id), claimed, fenced
and reincarnated exactly like the output's.

The Kafka half (producer settings, partition choice, held-back records, delivery reports, stamps,
retries of an unreachable broker) is :class:`aligner.connectors.stamped.StampedProducer`, which
``SinkProducer`` extends and the Spark writer's task attempts use as is.

A writer that can write epochs again from any committed one (a loader reading files or a plain
topic) may pipeline: ``commit(wait=False)`` returns once Kafka committed, with the ZooKeeper commit
in flight while the next epoch is written; the next ``commit`` waits for it before its own Kafka
commit. The order on each side is unchanged (Kafka before ZooKeeper per epoch, ZooKeeper epoch after
epoch), so readers see exactly what they see otherwise. What changes is where a failure shows: an
epoch whose ZooKeeper commit failed aborts the next one too, and the writer resumes from
``next_epoch`` (the epoch before the one it was writing). Where it writes a subject alone, its commit
multi-op also makes the next epoch's node, so it needs one ZooKeeper request per epoch, not two; it
is then committed to that epoch (``finish`` closes it empty). bench_sink: the commit multi-op is ~9 %
of a 10,000-record epoch's wall time, most of it waiting on ZooKeeper. The price is latency: while
the sink sends flat out, kazoo's connection thread gets the GIL only at forced switches, so the
multi-op lands during the next epoch's flush rather than at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException
from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError

from aligner.connectors.kafka import end_offsets, transactional_id
from aligner.connectors.stamped import Lane, StampedProducer, Written
from aligner.errors import AlignerError, EpochFailedError, SubjectConflictError
from aligner.ledger import Claim, Contribution, Lease, Ledger, PendingCommit, PendingEpoch
from aligner.metrics import COMMIT_SECONDS, EPOCHS_COMMITTED, LAST_EPOCH, RECORDS_SENT
from aligner.models import Range, WritersNode
from aligner.ops import Op
from aligner.stamps import Stamp

FaultHook = Callable[[str], None]
"""Called at named points of the commit ("before_kafka_commit", "after_kafka_commit",
"after_zk_commit"); tests use it to crash a producer exactly there."""


@dataclass(frozen=True)
class EpochCommit:
    epoch: int
    attempt: int
    ranges: dict[int, Range]
    records: int
    also: dict[str, dict[int, Range]] = field(default_factory=dict)
    """The ranges of the epoch in each further subject the sink writes."""


TRANSIENT: tuple[type[BaseException], ...] = (EpochFailedError, KafkaException, ConnectionLoss, SessionExpiredError,
                                             OperationTimeoutError, TimeoutError, ConnectionError)
"""Failures of the broker or ZooKeeper, not of the caller: the epoch is aborted and written again."""


@dataclass(frozen=True)
class _Confirming:
    """An epoch whose Kafka transaction committed, with its ZooKeeper commit in flight (``commit(wait=False)``)."""

    pending: PendingCommit
    written: Mapping[str, Written]
    blocked: float
    """Seconds ``commit`` took to return: with the wait for the ZooKeeper reply, the epoch's commit time."""

    @property
    def epoch(self) -> int:
        return self.pending.epoch


def partitions_for(index: int, parallelism: int, partitions: int) -> list[int]:
    """Round-robin private partitions for producer ``index`` of ``parallelism``."""
    if not 0 <= index < parallelism <= partitions:
        raise AlignerError(f"producer {index} of {parallelism} needs 0 <= index < parallelism <= {partitions}")
    return list(range(index, partitions, parallelism))


class SinkProducer(StampedProducer):
    """One parallel producer of a sink, writing exact epochs of one subject (and of the ``also`` subjects,
    {subject: private partitions}, in the same transactions and epochs: see :meth:`send_to`).

    The Kafka half is the :class:`StampedProducer` it extends (``send``, ``send_to``); this class
    adds the ledger: claims, stamps from the leases' attempts, and the ZooKeeper commit.
    """

    def __init__(
        self,
        ledger: Ledger,
        bootstrap: str,
        subject: str,
        sink: str,
        producer: str | int,
        partitions: Sequence[int],
        *,
        also: Mapping[str, Sequence[int]] | None = None,
        kafka_config: dict[str, Any] | None = None,
        fault: FaultHook | None = None,
    ) -> None:
        self.producer_id = str(producer)
        super().__init__(bootstrap, transactional_id(subject, sink, self.producer_id), subject, partitions,
                         also=also, name=f"{self.producer_id} of {subject!r}", kafka_config=kafka_config,
                         stopping=ledger.stopping)
        self.ledger = ledger
        self.sink = sink
        self._fault = fault or (lambda point: None)
        self._leases: dict[str, Lease] = {}
        """Per subject written (the output first): the ledger producer's lease."""
        self._epoch: int | None = None
        """The open epoch, until ZooKeeper committed it (the Kafka transaction may have committed already)."""
        self._writers: dict[str, tuple[WritersNode, int]] = {}
        self._pending: list[PendingEpoch | str] = []
        """The open epoch's round trip 1 per subject: in flight, or (the subject's name) carried by the
        commit before it (see :meth:`begin`)."""
        self._confirming: _Confirming | None = None
        """The ZooKeeper commit in flight (``commit(wait=False)``), until the sink waited for it."""

    # ---- lifecycle ----------------------------------------------------------------------------

    def open(self) -> SinkProducer:
        """Claim (or reclaim, as a new incarnation) the producer in every subject written, and fence
        the Kafka transaction an older incarnation left open."""
        ledger, sink, me = self.ledger, self.sink, self.producer_id
        metas = {subject: ledger.subjects.subject(subject) for subject in self.lanes}
        topics = {subject: meta.topic for subject, meta in metas.items()}

        def starts(lane: Lane) -> Callable[[], dict[int, int]]:
            return lambda: end_offsets(self.bootstrap, topics[lane.subject], lane.partitions,
                                       committed_only=False) if lane.partitions else {}

        lanes = [self, *(lane for lane in self.lanes.values() if lane is not self)]
        claimed = ledger.claims.claim_together(sink, me, [Claim(lane.subject, lane.partitions, starts(lane))
                                                   for lane in lanes])
        main = claimed[0]
        leases = {self.subject: main}
        for lease in claimed[1:]:
            if lease.next_epoch > main.next_epoch:  # a subject added to this sink that others wrote on
                raise SubjectConflictError(
                    f"producer {lease.writer} of {lease.subject!r} is at epoch {lease.next_epoch}, past epoch "
                    f"{main.next_epoch} of {self.subject!r}: another sink writes {lease.subject!r}; it cannot "
                    f"commit together with {self.subject!r}"
                )
            leases[lease.subject] = ledger.commits.close_empty(lease, main.next_epoch)  # epochs written without it
        self._leases = leases
        # Fences an older incarnation's transaction; keyed records are routed by each subject's partition count.
        self.start(topics, {s: meta.partitions for s, meta in metas.items()})
        return self

    def close(self) -> None:
        """Release the producer without waiting on the broker: an open epoch's transaction is aborted
        if the broker answers at once, else left to the next incarnation, which fences it."""
        self._epoch = None
        self._pending = []
        self._confirming = None  # left to land or not: the next incarnation reads which from ZooKeeper
        super().close()

    def __enter__(self) -> SinkProducer:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def lease(self) -> Lease:
        """The output subject's lease (as of the last epoch ZooKeeper confirmed: see :meth:`sync`)."""
        if not self._leases:
            raise AlignerError("producer is not open")
        return self._leases[self.subject]

    @property
    def leases(self) -> dict[str, Lease]:
        """Every subject's lease, the output first."""
        if not self._leases:
            raise AlignerError("producer is not open")
        return dict(self._leases)

    @property
    def next_epoch(self) -> int:
        """The epoch ``begin`` will open: one after the last epoch committed (or, with ``commit(wait=False)``,
        on its way to ZooKeeper). After a failure, the first epoch to write again."""
        if self._confirming is not None:
            return self._confirming.epoch + 1
        return self.lease.next_epoch

    @property
    def attempt(self) -> int:
        return self.lease.node.incarnation

    # ---- epochs -------------------------------------------------------------------------------

    def begin(self) -> int:
        if self._epoch is not None:
            raise AlignerError(f"epoch {self._epoch} is still open; commit or abort it first")
        epoch = self.next_epoch
        # Round trip 1 goes out now and is awaited in commit(), overlapping the epoch's sends; for a subject
        # whose node the commit in flight makes (see CommitRecipes.commit_epoch_async), that commit is awaited instead.
        ahead = self._confirming.pending.ahead if self._confirming is not None else {}
        self._pending = [s if s in ahead else self.ledger.commits.ensure_epoch_async(s, epoch, self._writers.get(s))
                         for s in self._leases]
        self.begin_epoch(epoch, {s: Stamp(self.sink, epoch, lease.node.incarnation)
                                 for s, lease in self._leases.items()})
        self._epoch = epoch
        return epoch

    def commit(self, extra: Sequence[Op] = (), *, wait: bool = True) -> EpochCommit:
        """Pre-commit in Kafka, then commit in ZooKeeper; returns the committed ranges.

        ``extra`` ZooKeeper ops (a job's input offsets) commit atomically with the epoch, in the
        same multi-op as every subject's contribution.

        ``wait=False`` returns once Kafka committed: the ZooKeeper commit goes on beside the next
        epoch and is waited for by the next ``commit`` (or :meth:`sync`), before that epoch's Kafka
        commit. If it failed, that call aborts its own epoch too and raises EpochFailedError: write
        again from ``next_epoch``. The multi-op makes the next epoch's node too where this producer writes
        alone (``ledger.commits.commit_epoch_async``), so the next ``begin`` sends nothing to ZooKeeper.
        """
        if self._epoch is None:
            raise AlignerError("no open epoch to commit")
        epoch = self._epoch
        started = time.monotonic()
        try:
            written = self.flush_epoch(self._starts())
        except EpochFailedError as exc:
            self.abort()
            raise EpochFailedError(f"{exc}; aborted") from exc
        # The epoch before, if its ZooKeeper commit is in flight: waited for after the flush, whose wait
        # on the broker lets kazoo's thread (starved of the GIL while records are sent) finish it.
        self._settle_or_abort()
        self._fault("before_kafka_commit")
        try:
            self._ensured(epoch)
        except Exception:
            self.abort()  # the epoch node could not be made: nothing was committed anywhere
            raise
        try:
            self.commit_transaction()
        except EpochFailedError as exc:
            self.abort()  # e.g. a record produced without a delivery report failed
            raise EpochFailedError(f"{exc}; aborted") from exc
        self._fault("after_kafka_commit")
        attempt = self.attempt
        contributions = [Contribution(lease, lease.node.incarnation, written[s].ranges, written[s].counts)
                         for s, lease in self._leases.items()]
        if wait:
            leases = self.ledger.commits.commit_epoch(epoch, contributions, extra)
            self._epoch = None
            self._confirmed(epoch, leases, written, time.monotonic() - started)
        else:
            pending = self.ledger.commits.commit_epoch_async(epoch, contributions, extra, self._writers)
            self._epoch = None
            self._confirming = _Confirming(pending, written, time.monotonic() - started)
            self._fault("zk_commit_sent")
        main = written[self.subject]
        return EpochCommit(epoch, attempt, main.ranges, main.records,
                           {s: w.ranges for s, w in written.items() if s != self.subject})

    def _ensured(self, epoch: int) -> None:
        """Wait for the open epoch's round trip 1, issued by ``begin`` (done already on a retried commit)."""
        while self._pending:
            ensure = self._pending[0]
            if not isinstance(ensure, str):
                self._writers[ensure.subject] = self.ledger.commits.epoch_ensured(ensure)
            elif ensure not in self._writers:  # the commit before could not make the node: the writers changed
                self._writers[ensure] = self.ledger.commits.ensure_epoch(ensure, epoch)
            self._pending.pop(0)

    def sync(self) -> int | None:
        """Wait for the ZooKeeper commit ``commit(wait=False)`` left in flight; returns the last epoch
        committed. If it failed, an open epoch is aborted as well and EpochFailedError is raised: write
        again from ``next_epoch``."""
        self._settle_or_abort()
        return self.lease.node.committed_epoch

    def _starts(self) -> dict[str, Mapping[int, int]]:
        """Where the open epoch's ranges start in each subject: where the last epoch ended, committed or in flight."""
        if self._confirming is None:
            return {s: lease.node.next_offsets for s, lease in self._leases.items()}
        pending = self._confirming.pending
        return {c.lease.subject: n.next_offsets for c, n in zip(pending.contributions, pending.nodes, strict=True)}

    def _confirmed(self, epoch: int, leases: list[Lease], written: Mapping[str, Written], seconds: float) -> None:
        """ZooKeeper committed ``epoch``: its leases carry the next epoch's versions and offsets."""
        self._leases = dict(zip(self._leases, leases, strict=True))
        self._fault("after_zk_commit")
        COMMIT_SECONDS.labels(self.subject, self.sink).observe(seconds)
        for s, w in written.items():
            RECORDS_SENT.labels(s, self.sink).inc(w.records)
            EPOCHS_COMMITTED.labels(s, self.sink).inc()
            LAST_EPOCH.labels(s, self.sink, self.producer_id).set(epoch)

    def _settle(self) -> None:
        confirming, self._confirming = self._confirming, None
        if confirming is not None:
            started = time.monotonic()
            leases, made = self.ledger.commits.epoch_committed(confirming.pending)
            for subject in confirming.pending.ahead:  # not made: the cached document is stale
                self._writers.pop(subject, None)
            self._writers.update(made)
            self._confirmed(confirming.epoch, leases, confirming.written,
                            confirming.blocked + time.monotonic() - started)

    def _settle_or_abort(self) -> None:
        """Wait for the ZooKeeper commit in flight. Its Kafka transaction committed, but if ZooKeeper did
        not name it, readers drop its records: it is written again, after the open epoch is aborted."""
        confirming = self._confirming
        try:
            self._settle()
        except Exception as exc:  # not an interrupt: that ends the process, and ZooKeeper says what landed
            self._abort(unnamed=True)  # a new attempt: next_epoch is ZooKeeper's last committed epoch + 1
            if isinstance(exc, TRANSIENT):
                assert confirming is not None
                raise EpochFailedError(f"epoch {confirming.epoch} of {self.subject!r} did not commit in ZooKeeper "
                                       f"({type(exc).__name__}: {exc}); write again from epoch {self.next_epoch}"
                                       ) from exc
            raise

    def finish(self) -> int | None:
        """No more epochs from this producer: readers of the subjects may drain and stop."""
        if self._epoch is not None:
            raise AlignerError("commit or abort the open epoch before finishing")
        self._settle_or_abort()
        last = None
        for subject, lease in self.leases.items():
            done = self.ledger.commits.finish(lease)
            if subject == self.subject:
                last = done
        return last

    def finish_lane(self, subject: str) -> int | None:
        """Stop writing one of the ``also`` subjects (a new version's shadow, at its swap): its producer is
        finished after its last committed epoch, so its readers drain and stop and retention can collect it,
        and later epochs commit without it. Returns the last epoch it wrote."""
        if self._epoch is not None:
            raise AlignerError("commit or abort the open epoch before finishing a lane")
        self._settle_or_abort()
        if subject == self.subject or subject not in self._leases:
            raise AlignerError(f"{subject!r} is not one of the other subjects this sink writes ({sorted(self.lanes)})")
        lease = self._leases.pop(subject)
        del self.lanes[subject]
        self._writers.pop(subject, None)
        return self.ledger.commits.finish(lease)

    def take_over(self, partitions: Sequence[int], giver: str, last: int) -> None:
        """Take ``partitions`` of the output over from the old version's sink ``giver`` after the swap
        epoch ``last`` (committed at the output; :meth:`aligner.ledger.Ledger.take_over`): a new version
        writes from ``last`` + 1 on the partitions its old version wrote."""
        if self._epoch is not None:
            raise AlignerError("commit or abort the open epoch before taking partitions over")
        self._settle_or_abort()
        topic = self.topic

        def starts(parts: Sequence[int]) -> dict[int, int]:
            return end_offsets(self.bootstrap, topic, parts, committed_only=False)

        lease = self.ledger.claims.take_over(self.lease, partitions, giver, last, starts)
        self._leases[self.subject] = lease
        self._writers.pop(self.subject, None)
        self.partitions = sorted(lease.node.partitions)
        self.route(self.ledger.subjects.subject(self.subject).partitions)

    @property
    def holds_partitions(self) -> bool:
        """Whether it writes any partition of the output (a new version writes none until its swap)."""
        return bool(self.lease.node.partitions)

    def abort(self) -> None:
        """Abort the open epoch; it will be written again under a new attempt number. A ZooKeeper commit
        in flight is waited for first; if it failed, its epoch is written again too (from ``next_epoch``)."""
        unnamed = False
        try:
            self._settle()
        except Exception:
            unnamed = True
        self._abort(unnamed)

    def _abort(self, unnamed: bool) -> None:
        """``unnamed``: an epoch's Kafka transaction committed but ZooKeeper may not name its attempt, so a
        new attempt is taken even without an open epoch."""
        if self._kp is not None and (self._epoch is not None or unnamed):
            try:
                self.abort_transaction()
            finally:
                self._epoch = None
                self._pending = []
                self._leases = {s: self.ledger.claims.reincarnate(lease) for s, lease in self._leases.items()}
